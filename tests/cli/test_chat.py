"""Chat: ``LLM.chat`` through the model's chat template, ``speculant chat``
(streamed turns read from stdin) and ``speculant generate --chat``."""

from __future__ import annotations

import io
import json
import sys

import pytest

from chat_models import TEMPLATE, with_chat_template
from speculant import LLM, SamplingParams
from speculant.cli import main

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def chat_dir(llama_dir, tmp_path_factory):
    """The tiny llama with a chat template in its tokenizer config."""
    return with_chat_template(llama_dir, tmp_path_factory.mktemp("llama_chat"))


@pytest.fixture(scope="module")
def chat_llm(chat_dir):
    return LLM(str(chat_dir), max_num_batched_tokens=64, speculative={"proposer": "ngram",
                                                                      "num_speculative_tokens": 3})


def test_chat_renders_the_template_and_generates_like_generate(chat_llm):
    conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def add(a, b):"}]
    out = chat_llm.chat(conv, GREEDY, use_tqdm=False)
    rendered = "<|bos|>system: be brief\n<|bos|>user: def add(a, b):\n<|bos|>assistant:"
    assert out[0].prompt == rendered
    # the template wrote the special tokens: the prompt is tokenized as-is
    ids = chat_llm.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert out[0].prompt_token_ids == ids and ids.count(chat_llm.tokenizer.bos_token_id) == 3
    assert out[0].outputs[0].token_ids == chat_llm.generate([ids], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_chat_takes_a_list_of_conversations_in_order(chat_llm):
    convs = [[{"role": "user", "content": c}] for c in ("import os", "class A:", "x = [")]
    outs = chat_llm.chat(convs, GREEDY, use_tqdm=False)
    singles = [chat_llm.chat(c, GREEDY, use_tqdm=False)[0] for c in convs]
    assert [o.outputs[0].token_ids for o in outs] == [s.outputs[0].token_ids for s in singles]
    assert [o.prompt for o in outs] == [s.prompt for s in singles]


@pytest.mark.parametrize("messages, error, words", [
    ("hello", TypeError, "must be a conversation"),
    ([], TypeError, "(empty)"),
    ([{"role": "wizard", "content": "x"}], ValueError, "role='wizard' is not one of"),
    ([{"role": "user", "content": 3}], TypeError, "content must be a str"),
    ([{"role": "user", "content": "x", "extra": 1}], ValueError, "unknown keys ['extra']"),
    ([[{"role": "user", "content": "x"}], "y"], TypeError, "conversation 1: must be a non-empty list"),
])
def test_bad_conversations_are_refused_by_name(chat_llm, messages, error, words):
    with pytest.raises(error) as err:
        chat_llm.chat(messages, GREEDY, use_tqdm=False)
    assert words in str(err.value)
    assert not chat_llm.engine.has_unfinished_requests()


def test_a_model_without_a_template_says_how_to_chat(llama_dir):
    llm = LLM(str(llama_dir), max_num_batched_tokens=64)
    with pytest.raises(ValueError, match="no chat template.*chat_template="):
        llm.chat([{"role": "user", "content": "hi"}], GREEDY)
    out = llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False, chat_template=TEMPLATE)
    assert out[0].prompt.endswith("<|bos|>assistant:") and len(out[0].outputs[0].token_ids) == 6


def test_chat_cli_streams_each_turn_and_keeps_the_conversation(chat_dir, chat_llm, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("def add(a, b):\n\n/reset\nimport os\n/exit\nnever read\n"))
    assert main(["chat", "--model", str(chat_dir), "--max-tokens", "6", "--system", "be brief",
                 "--set", "speculative.proposer=ngram"]) == 0
    out = capsys.readouterr().out
    replies = [chat_llm.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": u}],
                             SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)[0].outputs[0].text
               for u in ("def add(a, b):", "import os")]  # /reset: the second turn starts over
    assert out.count("[tokens: ") == 2 and "acceptance_rate" in out
    first, second = out.split("\n[tokens: ")[:2]
    assert first == replies[0] and second.split("]\n", 1)[1] == replies[1]


def test_generate_chat_flag(chat_dir, chat_llm, capsys):
    assert main(["generate", "--model", str(chat_dir), "--chat", "--max-tokens", "6", "--ignore-eos", "--json",
                 "import os"]) == 0
    result = json.loads(capsys.readouterr().out)
    want = chat_llm.chat([{"role": "user", "content": "import os"}], GREEDY, use_tqdm=False)[0]
    assert result["outputs"][0] == {"prompt": "import os", "text": want.outputs[0].text, "finish_reason": "length"}
