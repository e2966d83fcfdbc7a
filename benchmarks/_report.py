"""The results as markdown, docs/performance.md's result blocks, and the matrix's plot.

``python -m benchmarks report`` rewrites each block of docs/performance.md between
``<!-- results: NAME -->`` and ``<!-- /results: NAME -->`` from
``benchmarks/results/NAME.json``: a line of what the run was (date, commits, versions),
then its tables. ``--check`` rewrites nothing and fails if a block differs.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from ._harness import RESULTS, ROOT

PAGE = ROOT / "docs" / "performance.md"
BLOCK = re.compile(r"(<!-- results: (\S+) -->\n)(.*?)(<!-- /results: \2 -->)", re.S)


def number(value: Any) -> str:
    """A value as the tables print it: three significant digits or so, no exponent."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if isinstance(value, int):
        return f"{value:,}"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if magnitude >= 0.1 else f"{value:.3f}"


def run_line(meta: dict[str, Any]) -> str:
    """What a run was: its date, the commits it measured, versions, whether complete."""
    commits = meta.get("commits") or [meta.get("commit", "?")]
    dirty = " with uncommitted changes in fcall/" if meta.get("dirty") else ""
    parts = [
        f"Run of {meta.get('date', '?')[:10]}",
        f"commit{'s' * (len(commits) > 1)} {', '.join(f'`{c}`' for c in commits)}{dirty}",
        f"torch {meta.get('torch', '?')}",
    ]
    parts += [f"tensordict {meta['tensordict']}"] if "tensordict" in meta else []
    parts += [f"Python {meta['python']}"] if "python" in meta else []
    parts += ["a `--quick` run"] if meta.get("quick") else []
    parts += ["cut short"] if meta.get("complete") is False else []
    return ", ".join(parts) + "."


def table(title: str, rows: dict[str, Any]) -> str:
    """``{row: {column: value}}`` (or ``{row: value}``) as a markdown table; a third level
    of nesting becomes ``row · inner`` rows."""
    flat_rows: dict[str, Any] = {}
    for name, values in rows.items():
        if (
            isinstance(values, dict)
            and values
            and all(isinstance(v, dict) for v in values.values())
        ):
            flat_rows.update({f"{name} · {inner}": v for inner, v in values.items()})
        else:
            flat_rows[name] = values if isinstance(values, dict) else {"": values}
    columns: list[str] = []
    for values in flat_rows.values():
        columns += [c for c in values if c not in columns and not isinstance(values[c], list)]
    lines = [
        f"| {title} | " + " | ".join(columns) + " |",
        "| --- |" + " ---: |" * len(columns),
    ]
    for name, values in flat_rows.items():
        text = ["" if c not in values else number(values[c]) for c in columns]
        lines.append(f"| {name} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def tables(results: dict[str, Any]) -> str:
    """Every table of a suite's result (``{table: {row: {column: value}}}``)."""
    return "\n\n".join(
        table(name, rows) for name, rows in results.items() if name != "meta" and rows
    )


def matrix_tables(results: dict[str, Any]) -> str:
    """The matrix: a row per cell, a column per section and size (ratios to torch.func,
    then the first compiles'), and the guard section."""
    from .matrix import CELLS

    columns = []
    for name, sizes in results.items():
        if name.startswith(("eager", "compiled")):
            for leaves, row in sizes.items():
                columns.append((f"{name.replace('compiled ', '')} {int(leaves):,}", row, "ratio"))
    for name, sizes in results.items():
        if name.startswith("compiled"):
            for leaves, row in sizes.items():
                label = f"compile {name.replace('compiled ', '')} {int(leaves):,}"
                columns.append((label, row, "compile_ratio"))
    lines = [
        "| cell | " + " | ".join(label for label, _, _ in columns) + " |",
        "| --- |" + " ---: |" * len(columns),
    ]
    for cell in [c for c in CELLS if any(c in row for _, row, _ in columns)]:
        values = [row.get(cell, {}).get(field) for _, row, field in columns]
        text = ["" if v is None else f"{v:.2f}" for v in values]
        lines.append(f"| {cell.replace(' | ', ' · ')} | " + " | ".join(text) + " |")
    if "guards" in results:
        sizes = list(results["guards"])
        header = "| guard check per call (to torch.func, to TensorDict) | "
        lines += ["", header + " | ".join(f"{int(n):,}" for n in sizes) + " |"]
        lines.append("| --- |" + " ---: |" * len(sizes))
        for name in results["guards"][sizes[0]]:
            row = [results["guards"][n][name] for n in sizes]
            text = [
                f"{r['guard_us']:.0f} µs ({r['ratio']:.2f}x, "
                f"{r.get('to_tensordict', float('nan')):.2f}x)"
                for r in row
            ]
            lines.append(f"| {name.replace(' | ', ' · ')} | " + " | ".join(text) + " |")
    return "\n".join(lines)


RENDERERS = {"matrix": matrix_tables}


def markdown(name: str, results: dict[str, Any]) -> str:
    """A suite's result as the page shows it: the run's line, then its tables."""
    body = RENDERERS.get(name, tables)({k: v for k, v in results.items() if k != "extremes"})
    return f"{run_line(results.get('meta', {}))}\n\n{body}\n"


def render(page: str, results_dir: Path = RESULTS) -> str:
    """``page`` with each result block regenerated from its JSON file."""

    def block(match: re.Match[str]) -> str:
        name = match.group(2)
        results = json.loads((results_dir / f"{name}.json").read_text())
        return f"{match.group(1)}{markdown(name, results)}{match.group(4)}"

    return BLOCK.sub(block, page)


def blocks(page: str) -> list[str]:
    return [match.group(2) for match in BLOCK.finditer(page)]


def report(check: bool = False, page_path: Path = PAGE) -> int:
    """Rewrite the page's result blocks (``check``: only say whether they are current).
    Every JSON file under benchmarks/results/ must have its block."""
    page = page_path.read_text()
    missing = sorted({p.stem for p in RESULTS.glob("*.json")} - set(blocks(page)))
    if missing:
        print(f"{page_path}: no result block for {', '.join(missing)}")
        return 1
    new = render(page)
    if check:
        if new != page:
            print(f"{page_path} is not what `python -m benchmarks report` makes of the results")
            return 1
        return 0
    page_path.write_text(new)
    print(f"wrote {page_path} ({', '.join(blocks(page))})")
    return 0


def plot_matrix(results: dict[str, Any], path: Path | str) -> None:
    """A heat map of every cell's ratio to torch.func, one column per table and size; the
    slowest and the fastest cell of each column are boxed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from .matrix import CELLS, TARGETS

    columns, targets = [], []
    for name, sizes in results.items():
        if name.startswith(("eager", "compiled")):
            target = TARGETS["eager"] if name == "eager" else TARGETS["call"]
            for leaves, row in sizes.items():
                columns.append((f"{name}\n{leaves}", [row.get(c, {}).get("ratio") for c in CELLS]))
                targets.append(target)
    fig, ax = plt.subplots(figsize=(2.0 + 1.25 * len(columns), 0.28 * len(CELLS) + 1.8))
    for j, ((_, ratios), target) in enumerate(zip(columns, targets)):
        known = [r for r in ratios if r is not None]
        slow, fast = (max(known), min(known)) if known else (None, None)
        for i, ratio in enumerate(ratios):
            if ratio is None:
                continue
            shade = min(1.0, ratio / target / 2)  # 0.5: at the target
            ax.add_patch(
                Rectangle((j, i), 1, 1, facecolor=(shade, 1 - shade, 0.25, 0.55), edgecolor="white")
            )
            ax.text(j + 0.5, i + 0.5, f"{ratio:.2f}", ha="center", va="center", fontsize=7)
            if ratio in (slow, fast):
                ax.add_patch(Rectangle((j, i), 1, 1, fill=False, edgecolor="black", lw=1.5))
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(CELLS), 0)
    ax.set_xticks([j + 0.5 for j in range(len(columns))], [c for c, _ in columns], fontsize=7)
    ax.set_yticks([i + 0.5 for i in range(len(CELLS))], CELLS, fontsize=7)
    ax.xaxis.tick_top()
    ax.set_title(
        "fcall / torch.func, every cell (boxed: slowest and fastest of each column;\n"
        f"targets: eager <= {TARGETS['eager']}x, compiled per call <= {TARGETS['call']}x)",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"drew {path}")
