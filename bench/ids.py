"""Id distributions of the benchmarks' random batches: uniform, or skewed as in the real Criteo rows.

``uniform``: every id of every bag uniform over its table's rows (the worst case for the TBE: the most distinct
rows per batch).

``criteo`` (``criteo_kaggle``): a sample's 1-hot id of table ``t`` is drawn from a power law over the table's
rows, ``P(rank k) ∝ (k + 1) ** -s_t`` for ranks ``k = 0 .. rows - 1``, with ``s_t`` the exponent fitted to
the first 1,000 rows of day 0 of Criteo 1TB, the MLPerf dataset (the first 10,000 rows of the Kaggle
``train.txt``), stored in ``EXPONENTS``. Rank ``k`` is row ``(2654435761 * k) % rows``: a bijection (the
multiplier is a prime above 2**31) that scatters the popular rows over the table, as hashing scatters the real
categories, so row_wise shards share them. The bag is then the 1-hot id's row of the MLPerf multi-hot
expansion (:class:`dlrm.data.MultiHot`, seed 0), as in the MLPerf data: a bag is a function of its 1-hot id.

Ranks from ``HEAD`` on are grouped in buckets about 1% wide, each rank of a bucket with the power law's value
at the bucket's middle: the expected counts used by the fit (:func:`expected_distinct`) and by
``bench.roofline`` are then exact sums for the distribution the generator draws, over about 5,000 terms
instead of up to 40 M.

The fit (:func:`fit_exponent`) is a method of moments on the number of distinct rows: in ``n`` rows of a
table of ``rows`` rows (the MLPerf cardinality; a category maps to ``int(hex, 16) % rows``, missing to row 0,
as the trainer reads it), the exponent whose expected number of distinct rows in ``n`` draws equals the
number seen. Print the fit of a file::

    python -m bench.ids --fit terabyte_day0_head1000.tsv
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

if TYPE_CHECKING:
    from dlrm.data import MultiHot

DISTRIBUTIONS = ("uniform", "criteo", "criteo_kaggle")
HEAD = 1 << 12  # ranks below this each have their own probability
BUCKET = 0.01  # relative width of the buckets of ranks past HEAD
MAX_EXPONENT = 16.0  # the fit's upper bound (3-row tables where one row is never seen reach about 9)
SCATTER = 2654435761  # prime > 2**31: k -> (SCATTER * k) % rows is a bijection for any table below 2**31 rows

# Fitted exponents per MLPerf table (C1 .. C26), `python -m bench.ids --fit FILE`, 2026-12-04, for the MLPerf
# cardinalities (dlrm.config.MLPERF_NUM_EMBEDDINGS).
# fmt: off
EXPONENTS: Dict[str, Tuple[str, Tuple[float, ...]]] = {
    "criteo": (
        "first 1,000 rows of day 0 of Criteo 1TB",
        (
            1.271, 1.157, 0.954, 1.388, 1.288, 8.597, 1.001, 1.361, 3.120, 1.282, 1.363, 1.054, 4.441,
            1.962, 1.212, 3.126, 5.929, 1.957, 3.741, 1.271, 1.309, 1.277, 1.550, 1.002, 3.019, 2.582,
        ),
    ),
    "criteo_kaggle": (
        "first 10,000 rows of the Criteo Kaggle train.txt",
        (
            1.904, 1.635, 0.821, 0.915, 2.456, 0.000, 0.997, 2.183, 7.927, 1.176, 1.238, 0.984, 0.000,
            3.107, 1.163, 0.000, 0.000, 1.251, 0.000, 6.582, 1.064, 4.644, 3.937, 1.099, 2.860, 0.000,
        ),
    ),
}
# fmt: on


@functools.lru_cache(maxsize=64)
def rank_grid(rows: int) -> Tuple[np.ndarray, np.ndarray]:
    """The ranks of a table of ``rows`` rows in groups: int64 ``[G]`` first rank and int64 ``[G]`` width of each
    group; ranks below ``HEAD`` alone, then buckets about ``BUCKET`` of their first rank wide (``G`` is about
    5,000 for 40 M rows). Every rank is in exactly one group, in order. Read-only (cached per ``rows``)."""
    head = min(rows, HEAD)
    starts = [np.arange(head, dtype=np.int64)]
    widths = [np.ones(head, dtype=np.int64)]
    tail_s, tail_w = [], []
    k = head
    while k < rows:
        w = min(rows - k, max(1, int(k * BUCKET)))
        tail_s.append(k)
        tail_w.append(w)
        k += w
    starts.append(np.asarray(tail_s, dtype=np.int64))
    widths.append(np.asarray(tail_w, dtype=np.int64))
    out = np.concatenate(starts), np.concatenate(widths)
    for a in out:
        a.flags.writeable = False  # cached: shared by every caller
    return out


def rank_probabilities(rows: int, s: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(starts, widths, p)``: :func:`rank_grid` and float64 ``[G]`` probability of each single rank of a group
    (the groups' masses ``widths * p`` sum to 1). A group's ranks share the power law at the group's middle."""
    starts, widths = rank_grid(rows)
    w = np.exp(-float(s) * _log_mid(rows))
    return starts, widths, w / float(np.dot(widths, w))


@functools.lru_cache(maxsize=64)
def _log_mid(rows: int) -> np.ndarray:
    """float64 ``[G]``: log of ``k + 1`` at the middle of each group of :func:`rank_grid`."""
    starts, widths = rank_grid(rows)
    out = np.log(starts + (widths - 1) / 2.0 + 1.0)
    out.flags.writeable = False
    return out


def expected_distinct(rows: int, s: float, n: int) -> float:
    """Expected number of distinct rows among ``n`` independent 1-hot ids of the power law ``s`` over ``rows``
    rows: ``sum_k 1 - (1 - p_k) ** n``."""
    starts, widths, p = rank_probabilities(rows, s)
    return float(np.dot(widths, -np.expm1(n * np.log1p(-np.minimum(p, 1.0 - 1e-16)))))


def fit_exponent(rows: int, n: int, distinct: int) -> float:
    """The exponent ``s`` in ``[0, MAX_EXPONENT]`` with ``expected_distinct(rows, s, n) == distinct`` (bisection to
    1e-4; the expectation falls as ``s`` grows). ``distinct`` at or above the uniform expectation gives 0 (the
    sample cannot tell a flatter law), below the expectation at ``MAX_EXPONENT`` gives ``MAX_EXPONENT``.

    Raises:
        ValueError: ``distinct`` outside ``[1, min(n, rows)]``.
    """
    if not 1 <= distinct <= min(n, rows):
        raise ValueError(f"{distinct} distinct rows among {n} ids of a {rows}-row table")
    lo, hi = 0.0, MAX_EXPONENT
    if distinct >= expected_distinct(rows, lo, n):
        return 0.0
    if distinct <= expected_distinct(rows, hi, n):
        return hi
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        if expected_distinct(rows, mid, n) > distinct:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 3)


def fit_rows(ids: np.ndarray, table_rows: Sequence[int]) -> List[Dict[str, float]]:
    """Fit every table of int64 ``[N, T]`` row ids (``0 <= ids[:, t] < table_rows[t]``): per table its rows,
    ``n``, distinct rows, repeat rate ``1 - distinct / n`` and fitted exponent."""
    n = int(ids.shape[0])
    out = []
    for t, rows in enumerate(table_rows):
        d = int(np.unique(ids[:, t]).size)
        out.append(
            {
                "table": t,
                "rows": int(rows),
                "n": n,
                "distinct": d,
                "repeat_rate": 1 - d / n,
                "s": fit_exponent(rows, n, d),
            }
        )
    return out


def fit_file(path: str, table_rows: Optional[Sequence[int]] = None) -> List[Dict[str, float]]:
    """:func:`fit_rows` of a Criteo TSV file read as the trainer reads it (``dlrm.data.criteo_tsv``: a category
    is ``int(hex, 16) % rows``, missing is row 0), for ``table_rows`` (default: the MLPerf cardinalities).

    Raises:
        FileNotFoundError / TsvFormatError: as ``dlrm.data.criteo_tsv.read_tsv``.
    """
    from dlrm.config import MLPERF_NUM_EMBEDDINGS
    from dlrm.data.criteo_tsv import hash_to_rows, read_tsv

    rows = list(table_rows or MLPERF_NUM_EMBEDDINGS)
    return fit_rows(hash_to_rows(read_tsv(path, config_key=None).cats, rows), rows)


def exponents(dist: str, tables: int) -> Tuple[float, ...]:
    """The fitted exponents of ``dist`` (a key of ``EXPONENTS``) for ``tables`` tables (the MLPerf model's 26)."""
    s = EXPONENTS[dist][1]
    if tables != len(s):
        raise ValueError(f"--ids {dist}: fitted for {len(s)} tables (the MLPerf features), the model has {tables}")
    return s


class PowerLawIds:
    """Draws 1-hot ids of the power laws ``exponents`` over tables of ``table_rows`` rows (module docstring)."""

    def __init__(self, table_rows: Sequence[int], exponents: Sequence[float]) -> None:
        self.rows = [int(r) for r in table_rows]
        self.grids = []
        for r, s in zip(self.rows, exponents):
            starts, widths, p = rank_probabilities(r, s)
            cdf = np.cumsum(widths * p)
            cdf /= cdf[-1]
            self.grids.append((torch.tensor(starts), torch.tensor(widths), torch.from_numpy(cdf)))

    def draw(self, t: int, n: int, generator: torch.Generator) -> torch.Tensor:
        """int64 ``[n]`` 1-hot ids of table ``t`` in ``[0, rows_t)``, on the CPU; the same ``generator`` state gives
        the same ids."""
        starts, widths, cdf = self.grids[t]
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        g = torch.searchsorted(cdf, u, right=True).clamp_(max=len(cdf) - 1)
        lo = torch.where(g > 0, cdf[(g - 1).clamp(min=0)], torch.zeros_like(u))
        # where u fell inside its group's mass picks the rank within the group, uniformly
        frac = ((u - lo) / (cdf[g] - lo)).clamp_(0.0, 1.0)
        rank = starts[g] + torch.minimum((frac * widths[g]).long(), widths[g] - 1)
        return (rank * SCATTER) % self.rows[t]


@functools.lru_cache(maxsize=2)
def _multi_hot(table_rows: Tuple[int, ...], sizes: Tuple[int, ...], seed: int) -> "MultiHot":
    from dlrm.data import MultiHot  # dlrm.data imports torchrec: only when skewed ids are drawn

    return MultiHot(table_rows, sizes, seed)


@functools.lru_cache(maxsize=4)
def _sampler(table_rows: Tuple[int, ...], dist: str) -> PowerLawIds:
    return PowerLawIds(table_rows, exponents(dist, len(table_rows)))


def skewed_values(
    table_rows: Sequence[int], sizes: Sequence[int], dist: str, batch: int, generator: torch.Generator
) -> torch.Tensor:
    """KJT values of one batch of ``dist`` (``criteo`` or ``criteo_kaggle``): int64 ``[batch * sum(sizes)]``, on the
    CPU, feature-major, each table's ``batch`` bags of ``sizes[t]`` ids (sample-major), the MLPerf expansion
    (seed 0) of 1-hot ids drawn by :class:`PowerLawIds`. The expansion tables are built once per process
    (about 2.5 GB and some seconds for the MLPerf tables capped at 4 M rows).

    Raises:
        ValueError: the model does not have the 26 tables the exponents were fitted for.
        dlrm.errors.ConfigError: expansion tables over ``dlrm.data.MULTI_HOT_MAX_BYTES``.
    """
    rows = tuple(int(r) for r in table_rows)
    sampler = _sampler(rows, dist)
    mh = _multi_hot(rows, tuple(int(m) for m in sizes), 0)
    return torch.cat([mh.bags(t, sampler.draw(t, batch, generator)) for t in range(len(rows))])


def expected_rows(rows: int, s: Optional[float], hot: int, batch: int) -> float:
    """Expected distinct rows a batch of ``batch`` samples touches in one table of ``rows`` rows with ``hot`` ids
    per sample. ``s`` None: uniform ids, every id independent, ``rows (1 - (1 - 1/rows) ** (hot * batch))``.
    Otherwise 1-hot ids of the power law ``s`` expanded by the MLPerf multi-hot: the ``D`` distinct 1-hot ids
    (:func:`expected_distinct`) are rows of the batch, and each brings ``hot - 1`` more ids uniform over the
    table, fixed per 1-hot id, so ``D + (rows - D) (1 - (1 - 1/rows) ** ((hot - 1) D))`` (``D`` taken at its
    expectation: it varies little between batches)."""
    if s is None:
        return rows * -math.expm1(hot * batch * math.log1p(-1 / rows)) if rows > 1 else 1.0
    d = expected_distinct(rows, s, batch)
    if hot == 1 or rows == 1:
        return d
    return d + (rows - d) * -math.expm1((hot - 1) * d * math.log1p(-1 / rows))


def main(argv: Optional[List[str]] = None) -> List[Dict[str, float]]:
    p = argparse.ArgumentParser(
        prog="python -m bench.ids", description="Fit the power-law exponent of each table to a Criteo TSV file."
    )
    p.add_argument("--fit", required=True, metavar="FILE", help="a Criteo TSV file (label, I1..I13, C1..C26)")
    args = p.parse_args(argv)
    from dlrm.errors import InputError

    try:
        fit = fit_file(args.fit)
    except (FileNotFoundError, InputError) as e:  # a missing or malformed file: its one line, not a traceback
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    print("| table | rows | n | distinct | repeat rate | s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in fit:
        print(
            f"| C{r['table'] + 1} | {r['rows']} | {r['n']} | {r['distinct']} | {r['repeat_rate']:.3f} | {r['s']:.3f} |"
        )
    print("(" + ", ".join(f"{r['s']:.3f}" for r in fit) + ")")
    return fit


if __name__ == "__main__":
    main()
