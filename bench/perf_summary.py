"""The summary at the top of docs/performance.md: speed against stock TorchRec by batch per GPU, read from that
file's own rows (1x H200: the ``bench.throughput`` rows of stock, ``perf=fast`` and ``perf=fast`` with
``pipeline=graphed`` at each batch; 2x H200: ``perf=fast`` at 32768 per GPU), as a Markdown table and a plot.

    python -m bench.perf_summary                       # prints the table, writes docs/performance_summary.png
    python -m bench.perf_summary --png /tmp/speed.png

The table printed is the one docs/performance.md shows (tests/test_perf_summary.py checks they agree); edit the
rows, then rerun this and paste the table. A row with a range (``2.11-2.33x``) plots its span as a bar.
"""

import argparse
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "performance.md")
PNG = os.path.join(os.path.dirname(DOC), "performance_summary.png")

# configuration cell (after "<batch>: ") -> kind; each row holds row-wise, then element-wise Adagrad after "; "
ONE_GPU_KINDS = {
    "stock, row-wise / element-wise Adagrad": "stock",
    "`perf=fast`; element-wise Adagrad": "fast",
    "`perf=fast`, `graphed`; element-wise Adagrad": "graphed",
}
TWO_GPU_ROWS = {
    "32768 per GPU: stock TorchRec": "stock",
    "32768 per GPU: `perf=fast`, the planner's plan": "fast",
    "32768 per GPU: `perf=fast`, hand-balanced plan (`fast_balanced_plan`)": "fast_balanced",
}


@dataclass
class Row:
    """One table row: its cells' text (ms/step and "vs stock" as written), date and commit."""

    ms: str
    vs: str
    date: str
    commit: str


def _tables(text: str) -> Dict[str, List[List[str]]]:
    """The rows of each ``## <section>`` table of performance.md, as lists of stripped cells."""
    out: Dict[str, List[List[str]]] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("| ") and not line.startswith("| ---"):
            out.setdefault(section, []).append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return out


def read_rows(text: str) -> Tuple[Dict[Tuple[int, str], Row], Dict[str, Row]]:
    """``{(batch, kind): Row}`` for 1x H200 and ``{kind: Row}`` for 2x H200; the newest row (by date) where one
    configuration was measured more than once. Raises ``ValueError`` naming a row kind that is missing."""
    tables = _tables(text)
    one: Dict[Tuple[int, str], Row] = {}
    for cells in tables.get("1x H200", []):
        m = re.fullmatch(r"(\d+): (.+?)(?: \(host [^)]*\))?", cells[0])
        if m and m.group(2) in ONE_GPU_KINDS:
            key = (int(m.group(1)), ONE_GPU_KINDS[m.group(2)])
            row = Row(ms=cells[2], vs=cells[4], date=cells[5], commit=cells[6])
            if key not in one or row.date >= one[key].date:
                one[key] = row
    two = {
        TWO_GPU_ROWS[c[0]]: Row(ms=c[2], vs=c[4], date=c[5], commit=c[6])
        for c in tables.get("2x H200 (NVLink, one host)", [])
        if c[0] in TWO_GPU_ROWS
    }
    batches = sorted({b for b, _ in one})
    for b in batches:
        for kind in ONE_GPU_KINDS.values():
            if (b, kind) not in one:
                raise ValueError(f"docs/performance.md: no 1x H200 row '{b}: ...' for {kind}")
    for kind in TWO_GPU_ROWS.values():
        if kind not in two:
            raise ValueError(f"docs/performance.md: no 2x H200 row for {kind}")
    return one, two


def _parts(cell: str) -> List[str]:
    """A cell's ``;``-separated parts without parenthesised remarks: row-wise first, element-wise second."""
    return [re.sub(r"\s*\([^)]*\)", "", p).strip() for p in cell.split(";")]


def span(text: str) -> Tuple[float, float]:
    """``'2.11-2.33x'`` -> (2.11, 2.33); ``'2.14x'`` -> (2.14, 2.14)."""
    nums = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)]
    if not nums or len(nums) > 2:
        raise ValueError(f"not a figure or a range: {text!r}")
    return min(nums), max(nums)


def _stock_ms(cell: str) -> str:
    """The row-wise stock figures, first / last run, as a range: ``'8.207 / 7.432'`` -> ``'7.432-8.207'``."""
    lo, hi = span(_parts(cell)[0].replace(" / ", " "))
    return f"{lo:.3f}-{hi:.3f}" if lo != hi else f"{lo:.3f}"


def markdown(one: Dict[Tuple[int, str], Row], two: Dict[str, Row]) -> str:
    """The summary table of docs/performance.md."""
    lines = [
        "| H200s, batch per GPU | `perf=fast` | `perf=fast`, `graphed` | element-wise Adagrad: `fast` / `graphed` "
        "| ms/step: stock / `fast` / `graphed` | rows |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for b in sorted({b for b, _ in one}):
        stock, fast, graphed = one[(b, "stock")], one[(b, "fast")], one[(b, "graphed")]
        commits = sorted({stock.commit, fast.commit, graphed.commit})
        lines.append(
            f"| 1, {b} | {_parts(fast.vs)[0]} | {_parts(graphed.vs)[0]} | "
            f"{_parts(fast.vs)[1]} / {_parts(graphed.vs)[1]} | "
            f"{_stock_ms(stock.ms)} / {_parts(fast.ms)[0]} / {_parts(graphed.ms)[0]} | "
            f"{stock.date}, {', '.join(commits)} |"
        )
    stock, fast, bal = two["stock"], two["fast"], two["fast_balanced"]
    lines.append(
        f"| 2, 32768 | {fast.vs} (hand-balanced plan: {bal.vs}) | - | - | "
        f"{stock.ms} / {fast.ms} (balanced: {bal.ms}) / - | {stock.date}, {stock.commit} |"
    )
    return "\n".join(lines)


def plot(one: Dict[Tuple[int, str], Row], two: Dict[str, Row], path: str) -> None:
    """Speed against stock by batch per GPU, a line per variant, a bar over each range, to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({b for b, _ in one})
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    series = [
        ("graphed", 0, "`perf=fast`, `pipeline=graphed`", "tab:red", "-"),
        ("graphed", 1, "the same, element-wise Adagrad", "tab:red", "--"),
        ("fast", 0, "`perf=fast`", "tab:blue", "-"),
        ("fast", 1, "the same, element-wise Adagrad", "tab:blue", "--"),
    ]
    for kind, part, label, color, style in series:
        spans = [span(_parts(one[(b, kind)].vs)[part]) for b in batches]
        mid = [(lo + hi) / 2 for lo, hi in spans]
        err = [[m - lo for m, (lo, _) in zip(mid, spans)], [hi - m for m, (_, hi) in zip(mid, spans)]]
        ax.errorbar(
            batches,
            mid,
            yerr=err,
            label=f"1x H200, {label.replace('`', '')}",
            color=color,
            ls=style,
            marker="o",
            ms=4,
            capsize=3,
        )
    # beside the 1x points at 32768, not on them
    for kind, label, marker, x in (
        ("fast", "planner's plan", "s", 30000),
        ("fast_balanced", "hand-balanced plan", "D", 36000),
    ):
        lo, hi = span(two[kind].vs)
        ax.errorbar(
            [x],
            [(lo + hi) / 2],
            yerr=[[(hi - lo) / 2], [(hi - lo) / 2]],
            color="tab:green",
            marker=marker,
            ls="none",
            ms=6,
            capsize=3,
            label=f"2x H200, perf=fast, {label}",
        )
    ax.axhline(1.0, color="black", lw=0.8)
    ax.text(batches[-1], 0.9, "stock TorchRec", fontsize=8, ha="right", va="top")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch per GPU")
    ax.set_ylabel("speed against stock TorchRec (same run)")
    ax.set_ylim(0, max(span(_parts(one[(b, "graphed")].vs)[1])[1] for b in batches) + 0.4)
    dates = sorted({r.date for r in one.values()} | {r.date for r in two.values()})
    ax.set_title(f"DLRM-v2, 4 M-row tables, table_wise; docs/performance.md rows of {', '.join(dates)}", fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.perf_summary", description=__doc__.split("\n\n")[0])
    ap.add_argument("--doc", default=DOC, help="the performance.md to read (default: docs/performance.md)")
    ap.add_argument("--png", default=PNG, help="where to write the plot (default: docs/performance_summary.png)")
    args = ap.parse_args(argv)
    with open(args.doc, encoding="utf-8") as f:
        one, two = read_rows(f.read())
    print(markdown(one, two))
    plot(one, two, args.png)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
