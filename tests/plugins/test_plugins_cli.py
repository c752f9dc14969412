"""``speculant plugins``: what loaded, what it registered, and load errors."""

from __future__ import annotations

import json

from speculant.cli import main
from speculant.plugins import load_plugins


def test_listing_text_shows_plugins_capabilities_and_errors(site, plugin_source, capsys):
    site.add_module("listed_plugin", plugin_source("listed_proposer"))
    site.add_module("typo_listed", plugin_source("never", hook="register_scorer"))
    site.add_dist("listed-pkg", "1.2", {"listed": "listed_plugin"})
    site.add_dist("typo-listed-pkg", "0.1", {"typo_listed": "typo_listed"})
    code = main(["plugins"])
    out = capsys.readouterr().out
    assert code == 1  # there are load errors
    assert "listed-pkg:listed: listed-pkg 1.2 — entry point listed = listed_plugin" in out
    assert "  hooks: register_proposers" in out
    assert "  proposer 'listed_proposer': listed_plugin:Proposer_listed_proposer" in out
    assert ("      capabilities: needs_target_hidden_states=False supports_chunked_prefill=True "
            "draft_probs=one_hot max_num_speculative_tokens=None") in out
    assert "load errors (" in out
    assert ("  - entry point 'typo_listed = typo_listed' of distribution typo-listed-pkg 0.1 was not loaded: it "
            "implements unknown hook 'register_scorer' (did you mean 'register_scorers'?)") in out


def test_listing_json(test_plugin, capsys):
    code = main(["plugins", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == (1 if load_plugins().errors else 0)
    (plugin,) = [p for p in data["plugins"] if p["name"] == "tests"]
    assert plugin["distribution"] is None and plugin["hooks"] == [
        "register_acceptance_methods", "register_attention_backends", "register_proposers", "register_scorers"]
    heads = next(r for r in plugin["registered"] if r["name"] == "t_heads")
    assert heads["kind"] == "proposer"
    assert heads["capabilities"] == {"needs_target_hidden_states": True, "supports_chunked_prefill": False,
                                     "draft_probs": "full", "max_num_speculative_tokens": 3,
                                     "needs_prompt_hidden_states": True, "supports_prefix_caching": False,
                                     "proposes_trees": False}
    lookup = next(r for r in plugin["registered"] if r["name"] == "t_lookup")
    assert lookup["options"] == {"max_n": 4, "min_n": 1}
    assert all({"distribution", "entry_point", "cause", "message"} <= set(e) for e in data["errors"])
    builtin = next(p for p in data["plugins"] if p["name"] == "speculant:builtin")
    hybrid = next(r for r in builtin["registered"] if r["name"] == "eagle_suffix")
    assert hybrid["options"]["eagle"] == "(required)" and hybrid["options"]["min_match_len"] == 3
    assert hybrid["options"]["suffix"]["max_match_len"] == 16  # a nested options model: its defaults


def test_listing_json_reports_errors(site, capsys):
    site.add_module("raises_on_import", "raise RuntimeError('broken on purpose')\n")
    site.add_dist("boom-pkg", "3.0", {"boom": "raises_on_import"})
    assert main(["plugins", "--json"]) == 1
    errors = json.loads(capsys.readouterr().out)["errors"]
    (err,) = [e for e in errors if e["entry_point"] == "boom"]
    assert err["distribution"] == "boom-pkg" and err["version"] == "3.0"
    assert err["cause"] == "import failed: RuntimeError: broken on purpose"
