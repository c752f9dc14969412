"""The draft model must tokenize exactly like the target: same token for
every id and the same special tokens. Equal ``vocab_size`` is not enough (a
draft trained with another tokenizer of the same size proposes ids that mean
other text), so the draft is refused at engine build, naming the first ids
that differ.
"""

from __future__ import annotations

OPTION = "speculative.proposer_options.model"
SPECIAL = ("eos_token", "bos_token", "unk_token")
SHOWN = 3  # differing ids named in the message


def load_draft_tokenizer(path: str):
    """The tokenizer saved in the draft directory; ``FileNotFoundError``
    naming the option and how to add one when it has none."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as exc:
        raise FileNotFoundError(
            f"{OPTION} = {path!r}: cannot load a tokenizer from the draft directory ({exc}). The draft must "
            f"ship the target's tokenizer: copy the target's tokenizer files (tokenizer.json, "
            f"tokenizer_config.json, special_tokens_map.json) into {path!r}, or run "
            f"tokenizer.save_pretrained({path!r}) with the target's tokenizer") from exc


def tokenizer_differences(draft, target) -> list[str]:
    """Every way ``draft`` tokenizes differently from ``target`` (empty: the same)."""
    d_ids = {i: t for t, i in draft.get_vocab().items()}
    t_ids = {i: t for t, i in target.get_vocab().items()}
    problems = []
    differ = sorted(i for i in d_ids.keys() | t_ids.keys() if d_ids.get(i) != t_ids.get(i))
    if differ:
        shown = "; ".join(f"id {i} is {d_ids.get(i)!r} in the draft but {t_ids.get(i)!r} in the target"
                          for i in differ[:SHOWN])
        more = f" (and {len(differ) - SHOWN} more ids)" if len(differ) > SHOWN else ""
        problems.append(f"{len(differ)} of {max(len(d_ids), len(t_ids))} vocabulary ids differ: {shown}{more}")
    for name in SPECIAL:
        d, t = getattr(draft, name, None), getattr(target, name, None)
        if d != t:
            problems.append(f"{name} is {d!r} in the draft but {t!r} in the target")
    return problems


def check_draft_tokenizer(draft_path: str, target_tokenizer, target_path: str) -> None:
    """Raise ``ValueError`` if the draft at ``draft_path`` does not share the target's tokenizer."""
    problems = tokenizer_differences(load_draft_tokenizer(draft_path), target_tokenizer)
    if problems:
        raise ValueError(
            f"{OPTION} = {draft_path!r}: the draft's tokenizer differs from the target's ({target_path!r}): "
            + "; ".join(problems) + ". Draft and target must share one tokenizer and vocabulary, or the "
            "draft proposes ids that mean other text; pick a draft trained with the target's tokenizer")
