"""The EAGLE training passes (scripts/eagle_training/unroll.py) see exactly what
drafting sees: pass d at position j equals the head's cache holding real
entries before j - d + 1 and its own predicted features after, as in
``EagleProposer.propose``; and the draft vocabulary keeps the forced ids."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from speculant.proposers.eagle.model import EagleHead, SeqKV

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from eagle_training.train import assistant_marker, frequent_tokens, head_loss, reply_mask
from eagle_training.unroll import unrolled_features

CFG = {"hidden_size": 32, "vocab_size": 50, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
       "intermediate_size": 48, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "draft_vocab_size": None}


@torch.no_grad()
def test_unrolled_passes_match_drafting_step_by_step():
    torch.manual_seed(0)
    head = EagleHead(CFG).eval()
    emb, hidden = torch.randn(2, 13, 32), torch.randn(2, 13, 32)
    passes = unrolled_features(head, emb, hidden, depth=3)
    assert torch.allclose(passes[0], head(emb, hidden), atol=1e-5)  # pass 1 is teacher-forced
    for b in range(2):
        for j in (1, 5, 9):
            kv = SeqKV(2, 8, torch.float32, torch.device("cpu"))
            feats = head.extend(emb[b, :j], hidden[b, :j], torch.arange(j), [(kv, j)])
            feat = feats[-1:]  # predicted feature for position j
            for d in (2, 3):  # draft step d: entry at j + d - 2 reads the feature predicted before it
                pos = j + d - 2
                feat = head.extend(emb[b, pos:pos + 1], feat, torch.tensor([pos]), [(kv, 1)])
                assert torch.allclose(feat[0], passes[d - 1][b, pos], atol=1e-5), (b, j, d)


@torch.no_grad()
def test_reply_only_loss_counts_the_reply_positions_only():
    """``reply_only`` weighs exactly the entries scored at reply positions: the same loss
    as a validity mask that starts where the reply's scored entries do (the head still
    reads the prompt's features as context either way); a window with no reply position
    gives a finite zero loss."""
    torch.manual_seed(0)
    head = EagleHead(CFG).eval()
    emb_w, draft_w = torch.randn(50, 32), torch.randn(50, 32)
    tokens, mask = torch.randint(50, (2, 12)), torch.ones(2, 12, dtype=torch.bool)
    hidden = torch.randn(2, 12, 32)
    reply = torch.zeros(2, 12, dtype=torch.bool)
    reply[:, 7:] = True  # entry j is scored at position j + 1: entries 6.. count
    late = torch.zeros_like(mask)
    late[:, 6:] = True  # entries j with positions j and j + 1 valid: 6..

    def loss(m, r, only):
        return float(head_loss(head, emb_w, draft_w, tokens, m, hidden, 3, 0.0, 1.0, reply=r, reply_only=only)[0])

    assert abs(loss(mask, reply, True) - loss(late, reply, False)) < 1e-5
    assert abs(loss(mask, reply, True) - loss(mask, reply, False)) > 1e-3
    assert loss(mask, torch.zeros_like(reply), True) == 0.0


def test_draft_vocabulary_keeps_forced_ids_then_frequency_then_low_ids():
    tokens = torch.tensor([[5, 5, 5, 7, 7, 9, 40]])
    mask = torch.tensor([[True] * 6 + [False]])  # 40 is padding: not counted
    ids = frequent_tokens(tokens, mask, 6, always=[44, None], vocab_size=50)
    assert ids.tolist() == [0, 1, 5, 7, 9, 44]


def test_heldout_prompt_file_matches_the_heldout_list():
    """examples/prompts/chat_heldout.txt (the bench's prompts) is the list the training scripts hold out."""
    from eagle_training.chat_prompts import HELDOUT, training_prompts

    path = Path(__file__).resolve().parents[2] / "examples" / "prompts" / "chat_heldout.txt"
    assert path.read_text().splitlines() == HELDOUT
    assert not set(HELDOUT) & set(training_prompts(10**6))


def test_prompt_sets_are_disjoint_and_hold_out_the_bench_prompts():
    from eagle_training.chat_prompts import HELDOUT, training_prompts

    first, second = set(training_prompts(10**6)), set(training_prompts(10**6, prompt_set="b"))
    third = set(training_prompts(10**6, prompt_set="c"))
    assert len(first) > 3000 and len(second) > 6000 and len(third) > 800
    assert not first & second and not first & third and not second & third
    assert not (first | second | third) & set(HELDOUT)
    # the third set's own object lists stay clear of the held-out prompts' subjects too
    for subject in ("season", "refrigerator", "kitten", "tsunami", "jupiter", "houseplant", "salad", "sky",
                    "lighthouse", "thank-you", "virus", "bacteri", "hot air", "morning routine", "drinking water"):
        assert not [p for p in third if subject in p.lower()], subject
    with pytest.raises(ValueError, match="prompt_set = 'd'"):
        training_prompts(1, prompt_set="d")


def test_reply_mask_starts_after_the_last_assistant_header():
    marker = [7, 8]
    tokens = torch.tensor([[1, 7, 8, 3, 7, 8, 4, 5, 0, 0],    # two headers: the reply follows the last
                           [1, 2, 3, 4, 5, 6, 0, 0, 0, 0],    # plain text: counted whole
                           [7, 8, 9, 9, 9, 9, 9, 9, 9, 7]])   # a header cut off at the end is no header
    mask = torch.tensor([[True] * 8 + [False] * 2, [True] * 6 + [False] * 4, [True] * 10])
    got = reply_mask(tokens, mask, marker)
    assert got[0].tolist() == [False] * 6 + [True, True, False, False]
    assert got[1].tolist() == mask[1].tolist()
    assert got[2].tolist() == [False, False] + [True] * 8
    assert torch.equal(reply_mask(tokens, mask, None), mask)


def test_assistant_marker_is_the_generation_prompt(smollm2_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    marker = assistant_marker(tok)
    assert tok.decode(marker) == "<|im_start|>assistant\n"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    ids = tok.encode(chat, add_special_tokens=False)
    assert ids[-len(marker):] == marker
    tok.chat_template = None
    assert assistant_marker(tok) is None
