"""The conformance kit (``speculant.plugin_api.testing``): outside plugins of
each kind pass it importing nothing of speculant but ``plugin_api``, the
example package runs it from its own tests, and each check can fail: a
plugin that breaks what it checks is caught with a message naming it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import kit_plugins
import pytest
import torch
from kit_plugins import BigramProposer, CoinFlipAcceptance, TwoPassScorer

from speculant.plugin_api import AcceptedTokens, Proposals, ProposerCapabilities, Scores
from speculant.plugin_api.testing import (
    ConformanceError,
    check_accept_unit,
    check_acceptance,
    check_greedy,
    check_proposer,
    check_sampling,
    check_scorer,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plugin-package"


def speculant_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return {m for m in names if m.split(".")[0] == "speculant"}


def test_the_outside_plugins_import_only_the_plugin_api():
    files = [Path(kit_plugins.__file__), *sorted((EXAMPLE / "src").rglob("*.py")),
             *sorted((EXAMPLE / "tests").rglob("*.py"))]
    for path in files:
        assert speculant_imports(path) <= {"speculant.plugin_api", "speculant.plugin_api.testing"}, path


@pytest.mark.slow
def test_an_outside_proposer_passes_the_kit(kit_models):
    report = check_proposer(BigramProposer, kit_models)
    assert report.num_draft_tokens > 0 and report.faults_survived > 0
    assert report.schedules == ["whole prompts", "chunked prefill", "preemption", "abort"]


@pytest.mark.slow
def test_an_outside_scorer_passes_the_kit(kit_models):
    assert check_scorer(TwoPassScorer, kit_models)["num_draft_tokens"] > 0


@pytest.mark.slow
def test_an_outside_acceptance_method_passes_the_kit(kit_models):
    report = check_acceptance(CoinFlipAcceptance, kit_models)
    assert report["num_draft_tokens"] > 0 and len(report["p_values"]) == 3


@pytest.mark.slow
def test_the_example_package_runs_the_kit_from_its_own_tests():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE / "src"), str(ROOT)])}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--rootdir",
                          str(EXAMPLE), str(EXAMPLE / "tests")], capture_output=True, text=True, env=env,
                         cwd=EXAMPLE)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "PASSED tests/test_conformance.py::test_the_retrieval_proposer_conforms" in out.stdout, out.stdout


class OverBudget(BigramProposer):
    name = "kit-over-budget"

    def propose(self, batch):
        return Proposals.from_lists([[3] * (d.num_spec_tokens + 1) for d in batch.decodes])


def test_the_greedy_check_catches_a_proposer_the_engine_refuses(kit_models):
    with pytest.raises(ConformanceError, match=r"the proposer faulted \d+ time\(s\) in plain runs"):
        check_greedy(OverBudget, kit_models)


class WrongProbs(BigramProposer):
    """Claims to have drawn its proposals from a uniform distribution (it did not)."""

    name = "kit-wrong-probs"
    capabilities = ProposerCapabilities(draft_probs="full")

    def propose(self, batch):
        rows = [[(d.request.token_ids[-1] + 1) % 16] * d.num_spec_tokens for d in batch.decodes]
        out = Proposals.from_lists(rows)
        return Proposals(out.token_ids, out.cu_num_draft_tokens, torch.full((out.num_draft_tokens, 16), 1 / 16))


@pytest.mark.slow
def test_the_sampling_check_catches_draft_probs_that_lie(kit_models):
    with pytest.raises(ConformanceError, match="does not follow the target's distribution"):
        check_sampling(WrongProbs, kit_models)


class AcceptAll(CoinFlipAcceptance):
    name = "kit-accept-all"

    def accept(self, target_logprobs, draft_token_ids, cu_num_draft_tokens, draft_probs, greedy, generators):
        cu = cu_num_draft_tokens.tolist()
        lens = [b - a for a, b in zip(cu[:-1], cu[1:])]
        out = torch.full((len(lens), max(lens) + 1), -1, dtype=torch.long)
        for i, (a, n) in enumerate(zip(cu, lens)):
            out[i, :n] = draft_token_ids[a:a + n]
            out[i, n] = int(target_logprobs[a + i + n].argmax())
        return AcceptedTokens(out, torch.tensor(lens))


def test_the_acceptance_check_catches_a_method_that_keeps_everything():
    check_accept_unit(CoinFlipAcceptance)
    with pytest.raises(ConformanceError, match=r"greedy acceptance kept \[3, 1\] proposals, expected \[2, 0\]"):
        check_accept_unit(AcceptAll)


class ShiftedScorer(TwoPassScorer):
    """Hands back each decode's rows one position late."""

    name = "kit-shifted"

    def score(self, runner, batch, proposals, want_hidden=False):
        s = super().score(runner, batch, proposals, want_hidden)
        return Scores(s.prefill_logits, s.decode_logits.roll(1, dims=0), s.cu_num_logits)


@pytest.mark.slow
def test_the_scorer_check_catches_misplaced_rows(kit_models):
    with pytest.raises(ConformanceError, match="differs from the engine without speculation"):
        check_scorer(ShiftedScorer, kit_models)
