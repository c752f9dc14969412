"""The example third-party plugin (examples/plugin-package): its proposer
proposes for real, and it is selected and validated from a config file."""

from __future__ import annotations

import json
import random
import textwrap
from dataclasses import dataclass

import pytest

from speculant.config.compat import load_config
from speculant.config.models import ConfigError, EngineConfig
from speculant.config.sampling_params import SamplingParams
from speculant.engine.batch import ScheduledRequest, StepBatch
from speculant.engine.request import Request
from speculant.interfaces import ProposerContext


class WordTokenizer:
    """One token per whitespace-separated word; ids in order of first sight."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]


@dataclass
class FakeTarget:  # the part of a TargetView the retrieval proposer reads
    tokenizer: object


def make_proposer(example_installed, tmp_path, corpus: str | dict[str, str], tokenizer=None, **options):
    from speculant_retrieval import RetrievalOptions, RetrievalProposer

    if isinstance(corpus, str):
        path = tmp_path / "corpus.txt"
        path.write_text(corpus)
    else:
        path = tmp_path / "corpus"
        path.mkdir()
        for name, text in corpus.items():
            (path / name).write_text(text)
    tokenizer = tokenizer or WordTokenizer()
    config = EngineConfig.model_validate({"model": {"path": "unused"}})
    opts = RetrievalOptions(corpus_path=str(path), **options)
    return RetrievalProposer(opts, ProposerContext(config=config, target=FakeTarget(tokenizer))), tokenizer


def decode_entry(token_ids: list[int], k: int) -> ScheduledRequest:
    req = Request(request_id="r", prompt=None, prompt_token_ids=token_ids, params=SamplingParams(),
                  seed=0)
    return ScheduledRequest(request=req, num_new_tokens=1, num_spec_tokens=k)


def test_proposes_continuation_of_longest_match(example_installed, tmp_path):
    corpus = "the cat sat on the mat . the cat ran to the door and the cat sat down"
    proposer, tok = make_proposer(example_installed, tmp_path, corpus, min_match=2)
    ids = tok.encode
    # "the cat sat" matches twice; the first occurrence continues "on the mat"
    assert proposer.propose_for(ids("so the cat sat"), 3) == ids("on the mat")
    # longest match wins over a shorter, earlier one: "and the cat" only occurs before "sat down"
    assert proposer.propose_for(ids("door and the cat"), 2) == ids("sat down")
    # below min_match: no proposal
    assert proposer.propose_for(ids("zebra mat"), 3) == []
    # k caps the proposal; the corpus end caps it too
    assert proposer.propose_for(ids("sat down"), 4) == []
    assert proposer.propose_for(ids("the cat ran"), 1) == ids("to")


def test_propose_reads_the_batch(example_installed, tmp_path):
    proposer, tok = make_proposer(example_installed, tmp_path, "a b c d e f g", min_match=2)
    ids = tok.encode
    batch = StepBatch(decodes=[decode_entry(ids("x a b"), 3), decode_entry(ids("q q"), 2),
                               decode_entry(ids("d e"), 0)])
    proposals = proposer.propose(batch)
    assert proposals.lens.tolist() == [3, 0, 0]
    assert proposals.row(0) == ids("c d e")
    assert proposals.to_lists() == [ids("c d e"), [], []]  # flat: nothing stored for empty rows
    assert proposals.probs is None  # one-hot: the proposed tokens are the draft


def test_matches_do_not_cross_files(example_installed, tmp_path):
    proposer, tok = make_proposer(example_installed, tmp_path, {"1.txt": "x y z", "2.txt": "p q r"}, min_match=2)
    ids = tok.encode
    assert proposer.propose_for(ids("y z"), 3) == []  # next file's tokens are not a continuation
    assert proposer.propose_for(ids("p q"), 3) == ids("r")


def test_max_match_bounds_the_window(example_installed, tmp_path):
    # "b" first occurs before "x a"; the two-token suffix "a b" only before "c"
    corpus = "b x a b c"
    short, tok1 = make_proposer(example_installed, tmp_path, corpus, min_match=1, max_match=1)
    long, tok2 = make_proposer(example_installed, tmp_path, corpus, min_match=1, max_match=2)
    # max_match=1: only the last token is matched, so its first occurrence wins
    assert short.propose_for(tok1.encode("a b"), 2) == tok1.encode("x a")
    # max_match=2: the longer suffix matches and leads elsewhere
    assert long.propose_for(tok2.encode("a b"), 2) == tok2.encode("c")


def test_suffix_automaton_agrees_with_brute_force(example_installed):
    from speculant_retrieval.suffix_automaton import SuffixAutomaton

    rng = random.Random(0)
    for _ in range(200):
        corpus = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        query = [rng.randrange(4) for _ in range(rng.randrange(1, 10))]
        length, end = SuffixAutomaton(corpus).longest_suffix_match(query)
        best = max((n for n in range(len(query) + 1)
                    if any(corpus[i:i + n] == query[len(query) - n:] for i in range(len(corpus) - n + 1))), default=0)
        assert length == best
        if length:
            assert corpus[end - length:end] == query[-length:]
            first = min(i for i in range(len(corpus) - length + 1) if corpus[i:i + length] == query[-length:])
            assert end == first + length


def test_real_tokenizer(example_installed, tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = "def retrieval_proposer(corpus, suffix):\n    return corpus.find(suffix)\n"
    proposer, _ = make_proposer(example_installed, tmp_path, text, tokenizer=tokenizer, min_match=2)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert proposer.propose_for(ids[:6], 4) == ids[6:10]


CONFIG = """
[model]
path = "models/tiny"
attention_backend = "t_attn"

[speculative]
proposer = "retrieval"
num_speculative_tokens = 4
scorer = "t_mqa"
acceptance = "t_exact"

[speculative.proposer_options]
{options}
"""


@pytest.fixture
def example_and_fakes(example_installed, test_plugin):
    """The example plugin discovered through its entry point, then the test
    scorer/acceptance/backend fakes registered next to it."""
    return example_installed


def write_config(tmp_path, options: str):
    path = tmp_path / "retrieval.toml"
    path.write_text(textwrap.dedent(CONFIG.format(options=options)))
    return path


def test_selected_from_a_config_file(example_and_fakes, tmp_path):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("some text")
    cfg = load_config(write_config(tmp_path, f'corpus_path = "{corpus}"\nmin_match = 4'))
    assert cfg.speculative.proposer == "retrieval"
    assert cfg.speculative.proposer_options == {"corpus_path": str(corpus), "min_match": 4}


def test_config_errors_name_key_paths(example_and_fakes, tmp_path):
    path = write_config(tmp_path, 'corpus_path = "/no/such/corpus"\nmin_macth = 4')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [
        "speculative.proposer_options.min_macth: unknown key; allowed keys: corpus_path, glob, max_match, min_match"]
    path = write_config(tmp_path, 'corpus_path = "/no/such/corpus"')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [
        "speculative.proposer_options.corpus_path = '/no/such/corpus': no such file or directory: point it at a "
        "UTF-8 text file or a directory of them"]


def test_listed_by_plugins_command(example_installed, capsys):
    from speculant.cli import main

    main(["plugins", "--json"])
    listing = json.loads(capsys.readouterr().out)
    (plugin,) = [p for p in listing["plugins"] if p["entry_point"] == "retrieval"]
    assert plugin["distribution"] == "speculant-retrieval" and plugin["version"] == "0.1.0"
    (reg,) = plugin["registered"]
    assert reg["kind"] == "proposer" and reg["name"] == "retrieval"
    assert reg["capabilities"]["draft_probs"] == "one_hot"
    assert reg["options"]["corpus_path"] == "(required)"
