"""The retrieval proposer against Speculant's conformance kit, as any plugin
package can run it from its own tests (no download: the kit builds its
tiny models, and the corpus is written here)."""

from __future__ import annotations

import pytest

from speculant.plugin_api import testing
from speculant_retrieval import RetrievalProposer

CORPUS = "\n".join(f"def function_{i}(value):\n    return value * {i} + {i * i}\n" for i in range(40))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return testing.TinyModels.build(tmp_path_factory.mktemp("kit"))


def test_the_retrieval_proposer_conforms(models, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    report = testing.check_proposer(RetrievalProposer, models, options={"corpus_path": str(corpus)},
                                    sampling=False)  # its proposals are corpus tokens, outside the 16-token model
    assert report.schedules == ["whole prompts", "chunked prefill", "preemption", "abort"]
