"""The compatibility matrix: every proposer × scorer × acceptance method ×
chunked prefill (off/on) the registry holds, checked by ``compat`` on the
default attention backend.

A cell is supported (✅), supported with per-request limits noted (the
sampling-only rules of ``compat``: greedy requests only; the structured-only
rule: no structured output), or unsupported with its short reasons. The
"token trees" column says whether the row's plugins take token trees
(``speculative.tree_width`` > 1), or what stops them.
``num_speculative_tokens`` is the config default clipped to the proposer's
maximum, so the k limit never decides a cell. The README carries the Markdown
rendering between ``README_START`` and ``README_END``; ``rewrite_readme``
regenerates it and a test fails when the copy is stale.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speculant.config.compat import Issue, auto_attention_backend, combination_issues, tree_issues
from speculant.config.models import SpeculativeConfig
from speculant.interfaces import UnknownPluginError

if TYPE_CHECKING:
    from speculant.interfaces.catalog import PluginCatalog as Registry

README_START = "<!-- compat-matrix:start -->"
README_END = "<!-- compat-matrix:end -->"
MATRIX_DEVICE = "cpu"
"""By default the matrix uses the backend ``attention_backend = 'auto'`` picks here."""
SUPPORTED_MARK = "✅"
UNSUPPORTED_MARK = "❌"


@dataclass(frozen=True)
class MatrixCell:
    proposer: str
    scorer: str
    acceptance: str
    enable_chunked_prefill: bool
    attention_backend: str
    num_speculative_tokens: int
    issues: tuple[Issue, ...]
    tree_issues: tuple[Issue, ...] = ()
    """What stops ``speculative.tree_width`` > 1 here (empty: trees are verified)."""

    @property
    def supported(self) -> bool:
        """Supported at least for greedy requests without structured output."""
        return all(i.per_request for i in self.issues)

    @property
    def greedy_only(self) -> bool:
        return self.supported and any(i.sampling_only for i in self.issues)

    @property
    def structured_output(self) -> bool:
        """Structured-output requests are served (where the cell is supported)."""
        return self.supported and not any(i.structured_only for i in self.issues)

    def speculative(self, proposer_options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The cell's ``speculative`` settings. Its k is set only where the proposer's
        class clipped the default; otherwise it is left unset, as a user would, and the
        engine lowers it to what the checkpoint gives (a Medusa file's heads)."""
        out: dict[str, Any] = {"proposer": self.proposer, "proposer_options": proposer_options or {},
                               "scorer": self.scorer, "acceptance": self.acceptance}
        if self.num_speculative_tokens != SpeculativeConfig.model_fields["num_speculative_tokens"].default:
            out["num_speculative_tokens"] = self.num_speculative_tokens
        return out

    @property
    def reasons(self) -> list[str]:
        """Full messages of the issues that make the cell unsupported."""
        return [i.message for i in self.issues if not i.per_request]

    def label(self) -> str:
        """Short Markdown cell: ✅, ✅ with the per-request limits (greedy only, no
        structured output), or ❌ reasons."""
        if not self.issues:
            return SUPPORTED_MARK
        if self.supported:
            return f"{SUPPORTED_MARK} " + "; ".join(i.short for i in self.issues)
        return f"{UNSUPPORTED_MARK} " + "; ".join(i.short for i in self.issues if not i.sampling_only)

    def trees_label(self) -> str:
        """✅ where the plugins take token trees, else ❌ with what stops them."""
        if not self.tree_issues:
            return SUPPORTED_MARK
        return f"{UNSUPPORTED_MARK} " + "; ".join(i.short for i in self.tree_issues)

    def as_dict(self) -> dict[str, Any]:
        return {
            "proposer": self.proposer,
            "scorer": self.scorer,
            "acceptance": self.acceptance,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "attention_backend": self.attention_backend,
            "num_speculative_tokens": self.num_speculative_tokens,
            "supported": self.supported,
            "greedy_only": self.greedy_only,
            "reasons": self.reasons,
            "sampling_reasons": [i.message for i in self.issues if i.sampling_only],
            "structured_reasons": [i.message for i in self.issues if i.structured_only],
            "structured_output": self.structured_output,
            "token_trees": not self.tree_issues,
            "tree_reasons": [i.message for i in self.tree_issues],
            "label": self.label(),
        }


def compute_matrix(registry: Registry, *, attention_backend: str | None = None) -> list[MatrixCell]:
    """One cell per proposer × scorer × acceptance × chunked prefill (off, on),
    sorted by name, on ``attention_backend`` (default: what ``auto`` picks on
    the CPU). Raises ``UnknownPluginError`` if the backend is not registered."""
    if attention_backend is None:
        attention_backend = auto_attention_backend(registry, MATRIX_DEVICE)
        if attention_backend is None:
            raise UnknownPluginError("attention_backend", f"auto (on {MATRIX_DEVICE})",
                                     registry.names("attention_backend"))
    backend = registry.get("attention_backend", attention_backend)
    default_k = SpeculativeConfig.model_fields["num_speculative_tokens"].default
    cells = []
    for p, s, a, chunked in itertools.product(
        registry.names("proposer"), registry.names("scorer"), registry.names("acceptance"), (False, True)
    ):
        proposer = registry.get("proposer", p)
        limit = proposer.capabilities.max_num_speculative_tokens
        k = default_k if limit is None else min(default_k, limit)
        scorer, acceptance = registry.get("scorer", s), registry.get("acceptance", a)
        issues = combination_issues(proposer, scorer, acceptance, backend,
                                    enable_chunked_prefill=chunked, num_speculative_tokens=k)
        trees = tree_issues(proposer, scorer, acceptance, backend)
        cells.append(MatrixCell(p, s, a, chunked, attention_backend, k, tuple(issues), tuple(trees)))
    return cells


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(cells: list[MatrixCell]) -> str:
    """Markdown table: one row per proposer × scorer × acceptance, one column
    per chunked-prefill setting; ends with a newline."""
    backends = sorted({c.attention_backend for c in cells}) or ["(none)"]
    rows: dict[tuple[str, str, str], dict[bool, MatrixCell]] = {}
    for c in cells:
        rows.setdefault((c.proposer, c.scorer, c.acceptance), {})[c.enable_chunked_prefill] = c
    lines = [
        f"Attention backend: {', '.join(backends)}. {SUPPORTED_MARK} supported; "
        f"{SUPPORTED_MARK} with a note: some requests only (greedy only, no structured output); "
        f"{UNSUPPORTED_MARK} unsupported, with the reason "
        "(`speculant config check` gives the full reason and the fix).",
        "",
        "| proposer | scorer | acceptance | chunked prefill off | chunked prefill on | token trees |",
        "|---|---|---|---|---|---|",
    ]
    for (p, s, a), by_chunked in rows.items():
        off, on = (by_chunked[k].label() if k in by_chunked else "" for k in (False, True))
        trees = next(iter(by_chunked.values())).trees_label()
        lines.append(f"| {_escape(p)} | {_escape(s)} | {_escape(a)} | {_escape(off)} | {_escape(on)} "
                     f"| {_escape(trees)} |")
    return "\n".join(lines) + "\n"


def render_json(cells: list[MatrixCell]) -> list[dict[str, Any]]:
    return [c.as_dict() for c in cells]


class ReadmeMarkersMissing(ValueError):
    """The README lacks the lines between which the matrix goes."""


def readme_section(text: str, path: str = "README.md") -> str:
    """The text between the markers (exclusive), without the marker lines."""
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise ReadmeMarkersMissing(
            f"{path} has no compatibility-matrix section: add a line {README_START} and, below it, a line "
            f"{README_END}, then run `speculant plugins matrix --write-readme {path}`")
    return text[start + len(README_START):end].strip("\n") + "\n"


def rewrite_readme(path: str | Path, markdown: str) -> bool:
    """Replace the section between the markers of ``path`` with ``markdown``
    (blank lines around it, so Markdown ends the table before the end marker);
    returns whether the file changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    readme_section(text, str(path))  # raises if the markers are missing
    start = text.index(README_START) + len(README_START)
    end = text.index(README_END)
    new = text[:start] + "\n\n" + markdown.strip("\n") + "\n\n" + text[end:]
    if new == text:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def builtin_registry(registry: Registry) -> Registry:
    """Only the built-in plugin's registrations (what the README documents)."""
    return registry.filtered(lambda reg: reg.source.is_builtin)
