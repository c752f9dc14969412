"""PNG chart of ``speculant bench`` results (needs matplotlib: ``pip install
'speculant[bench]'`` or ``pip install matplotlib``).

Grouped bars: one group per concurrency level, one bar per method that was
measured there (packed, so a method missing at one level leaves no gap), its
median tokens/s written on top. Speculant methods are
shades of blue, transformers methods shades of orange; rows that were
skipped, unsupported or failed are left out. The title names the target,
draft and torch threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ENGINE_COLOURS = {"speculant": "Blues", "transformers": "Oranges"}  # matplotlib colormap per engine


def chart_data(rows: list[dict[str, Any]]) -> tuple[list[int], list[tuple[str, str]], dict]:
    """(concurrency levels, (engine, method) series in row order, {(engine, method, c): tokens/s})
    over the measured rows only."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("tokens_per_s")]
    groups = sorted({r["concurrency"] for r in ok})
    series: list[tuple[str, str]] = []
    for r in sorted(ok, key=lambda r: r["engine"] != "speculant"):  # stable: Speculant first, row order kept
        if (r["engine"], r["method"]) not in series:
            series.append((r["engine"], r["method"]))
    values = {(r["engine"], r["method"], r["concurrency"]): float(r["tokens_per_s"]) for r in ok}
    return groups, series, values


def chart_title(result: dict[str, Any]) -> str:
    settings, env = result.get("settings", {}), result.get("env", {})
    target = Path(settings.get("target") or "?").name
    draft = Path(settings["draft"]).name if settings.get("draft") else "none"
    threads = env.get("torch_threads", "?")
    return (f"speculant bench: greedy tokens/s (median of {settings.get('repeats', '?')})\n"
            f"target {target}, draft {draft}, {settings.get('max_tokens', '?')} tokens/request, "
            f"{threads} torch thread{'s' if threads != 1 else ''}")


def _colours(plt, series: list[tuple[str, str]]) -> list:
    """One shade per series from its engine's colormap, dark to light in series order."""
    out = []
    for engine, method in series:
        same = [m for e, m in series if e == engine]
        i, n = same.index(method), len(same)
        cmap = plt.get_cmap(ENGINE_COLOURS.get(engine, "Greys"))
        out.append(cmap(0.85 - 0.5 * i / (n - 1)) if n > 1 else cmap(0.7))
    return out


def write_chart(path: Path, result: dict[str, Any]) -> str | None:
    """Write the PNG at ``path``; returns a note instead when it cannot be drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "chart skipped: matplotlib is not installed (pip install 'speculant[bench]' or matplotlib)"
    groups, series, values = chart_data(result.get("rows", []))
    if not series:
        return "chart skipped: no measured rows"
    colours = _colours(plt, series)
    present = {c: [s for s in series if (*s, c) in values] for c in groups}  # bars packed per group
    width = 0.8 / max(len(v) for v in present.values())
    num_bars = sum(len(v) for v in present.values())
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 + 0.45 * num_bars + 0.6 * len(groups)), 4.8))
    top = max(values.values())
    for i, (engine, method) in enumerate(series):
        xs = [g + (present[c].index((engine, method)) - (len(present[c]) - 1) / 2) * width
              for g, c in enumerate(groups) if (engine, method, c) in values]
        ys = [values[(engine, method, c)] for c in groups if (engine, method, c) in values]
        bars = ax.bar(xs, ys, width * 0.92, color=colours[i], edgecolor="black", linewidth=0.4,
                      label=f"{engine}: {method}")
        ax.bar_label(bars, labels=[f"{y:.0f}" if y >= 10 else f"{y:.1f}" for y in ys], fontsize=7,
                     rotation=90 if width < 0.12 else 0, padding=2)
    ax.set_xticks(range(len(groups)), [f"concurrency {c}" for c in groups])
    ax.set_ylabel("tokens/s (median over repeats)")
    ax.set_ylim(0, top * 1.18)
    ax.set_title(chart_title(result), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="blue: Speculant\norange: transformers",
              title_fontsize=8, frameon=False)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return None
