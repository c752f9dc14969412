"""Chat conversations -> prompts, through the model's own chat template.

A conversation is a list of ``{"role": ..., "content": ...}`` messages (the
OpenAI / transformers shape). ``LLM.chat`` and ``speculant chat`` render it
with the tokenizer's chat template (or one passed in) and generate from the
rendered text, which the engine tokenizes without adding special tokens: the
template already wrote them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ROLES = ("system", "user", "assistant", "tool")

Conversation = list[dict[str, str]]


def as_conversations(messages: Any) -> tuple[list[Conversation], bool]:
    """Normalise one conversation or a list of them; return them and whether
    a single conversation was given. Raises TypeError/ValueError naming the
    conversation and message that is wrong."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise TypeError("messages must be a conversation (a non-empty list of {'role': ..., 'content': ...} "
                        f"dicts) or a list of conversations, got {type(messages).__name__}"
                        + (" (empty)" if isinstance(messages, Sequence) and not messages else ""))
    single = isinstance(messages[0], Mapping)
    convs = [messages] if single else list(messages)
    out = []
    for c, conv in enumerate(convs):
        if isinstance(conv, (str, bytes)) or not isinstance(conv, Sequence) or not conv:
            raise TypeError(f"conversation {c}: must be a non-empty list of message dicts, got "
                            f"{type(conv).__name__}")
        out.append([_message(c, m, msg) for m, msg in enumerate(conv)])
    return out, single


def _message(c: int, m: int, msg: Any) -> dict[str, str]:
    where = f"conversation {c} message {m}"
    if not isinstance(msg, Mapping):
        raise TypeError(f"{where}: must be a dict with 'role' and 'content', got {type(msg).__name__}")
    unknown = set(msg) - {"role", "content", "name"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; a message has 'role', 'content' "
                         "(and optionally 'name')")
    role, content = msg.get("role"), msg.get("content")
    if role not in ROLES:
        raise ValueError(f"{where}: role={role!r} is not one of {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise TypeError(f"{where}: content must be a str, got {type(content).__name__}")
    return dict(msg)


def render(tokenizer, conversation: Conversation, chat_template: str | None = None,
           add_generation_prompt: bool = True) -> str:
    """The prompt text of ``conversation`` under the model's chat template."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("the model's tokenizer has no chat template, so a conversation cannot be turned "
                         "into a prompt; pass chat_template=... (a Jinja template) or use generate() "
                         "with plain prompts")
    return tokenizer.apply_chat_template(conversation, chat_template=template, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
