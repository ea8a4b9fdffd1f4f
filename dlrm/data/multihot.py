"""MLPerf DLRM-v2 synthetic multi-hot: expansion tables in bounded memory, on disk, and gathered per batch.

The MLPerf reference (``recommendation_v2/torchrec_dlrm/multi_hot.py``) seeds numpy's legacy global generator
once with 0 and, for each table in order, draws ``randint(0, rows, size=(rows, m - 1))``; row ``i`` of the
expansion table ``[rows, m]`` is ``i`` followed by those ``m - 1`` ids, and a sample's bag for 1-hot id ``i`` is
that row. This module produces those tables as int32 (the reference stores them as int32 too) without holding a
whole table's draws at once; ``dlrm.data.MultiHot`` (the in-memory expansion) builds its tables with it too:

* :func:`build_tables` draws each table in row chunks from one ``RandomState(seed)``. For ranges below 2**32
  the legacy ``randint`` consumes exactly one 32-bit draw per accepted value with no buffering across calls,
  so chunked draws are the same stream as the reference's single call (checked in ``tests/test_binary_loader.py``
  against the reference procedure, chunk boundaries included).
* With ``out_dir`` the tables are written as ``table_XX.npy`` (memory-mapped later): 23.9 GB for the MLPerf
  cardinalities, instead of 3.74 TB of materialized multi-hot days.
* :func:`expand_into` gathers the bags of a batch of 1-hot ids (vectorised, one ``np.take`` per table).

Build the on-disk tables of a preprocessed dataset::

    python data/preprocess_criteo.py multihot --out /data/criteo_bin --mode tables
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from dlrm.data.binary_format import BinaryFormatError

TABLES_DIR = "multi_hot_tables"
# Rows drawn per randint call: bounds host memory to about CHUNK_ROWS * 99 * 8 bytes (80 MB) per table.
CHUNK_ROWS = 1 << 17


def table_path(out_dir: str, t: int) -> str:
    """Path of table ``t``'s expansion table in ``out_dir``: ``table_XX.npy``, ``t`` zero-padded to two digits."""
    return os.path.join(out_dir, f"table_{t:02d}.npy")


def build_tables(
    table_rows: Sequence[int],
    sizes: Sequence[int],
    seed: int = 0,
    out_dir: Optional[str] = None,
    chunk_rows: int = CHUNK_ROWS,
    progress: bool = False,
) -> List[Optional[np.ndarray]]:
    """The MLPerf expansion tables, int32 ``[rows_t, m_t]`` per table (None where ``m_t == 1``).

    Args:
        table_rows: rows of each table (the cardinalities the 1-hot ids were hashed into).
        sizes: multi-hot size of each table (MLPerf: ``MLPERF_MULTI_HOT_SIZES``).
        seed: legacy numpy seed (MLPerf reference: 0).
        out_dir: write ``table_XX.npy`` and ``tables.json`` there and return read-only memory maps; None: in memory.
        chunk_rows: rows drawn per ``randint`` call (any value gives the same tables).

    Raises:
        ValueError: a table has 2**31 rows or more (ids would not fit int32, as in the reference).
    """
    if len(table_rows) != len(sizes):
        raise ValueError(f"{len(table_rows)} tables but {len(sizes)} multi-hot sizes")
    rng = np.random.RandomState(seed)
    tables: List[Optional[np.ndarray]] = []
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=sum(r for r, m in zip(table_rows, sizes) if m > 1),
            unit="row",
            unit_scale=True,
            desc="multi-hot tables",
        )
    for t, (rows, m) in enumerate(zip(table_rows, sizes)):
        rows, m = int(rows), int(m)
        if rows >= 2**31:
            raise ValueError(
                f"table {t} has {rows} rows; multi-hot ids are int32 (MLPerf reference), so tables "
                "need fewer than 2**31 rows"
            )
        if m == 1:
            rng.randint(0, rows, size=(rows, 0))  # the reference draws an empty array here; keep the call
            tables.append(None)
            continue
        if out_dir:
            tab = np.lib.format.open_memmap(
                table_path(out_dir, t) + ".partial", mode="w+", dtype=np.int32, shape=(rows, m)
            )
        else:
            tab = np.empty((rows, m), dtype=np.int32)
        for lo in range(0, rows, chunk_rows):
            hi = min(rows, lo + chunk_rows)
            tab[lo:hi, 0] = np.arange(lo, hi, dtype=np.int32)
            tab[lo:hi, 1:] = rng.randint(0, rows, size=(hi - lo, m - 1))
            if bar is not None:
                bar.update(hi - lo)
        if out_dir:
            tab.flush()
            del tab
            os.replace(table_path(out_dir, t) + ".partial", table_path(out_dir, t))
            tab = np.load(table_path(out_dir, t), mmap_mode="r")
        tables.append(tab)
    if bar is not None:
        bar.close()
    if out_dir:
        with open(os.path.join(out_dir, "tables.json"), "w", encoding="utf-8") as f:
            json.dump(tables_spec(table_rows, sizes, seed), f)
    return tables


def tables_spec(table_rows: Sequence[int], sizes: Sequence[int], seed: int) -> Dict[str, Any]:
    """The content of ``tables.json``: what :func:`build_tables` built the tables from."""
    return {
        "table_rows": [int(r) for r in table_rows],
        "sizes": [int(m) for m in sizes],
        "seed": int(seed),
        "distribution": "uniform",
    }


def load_tables(
    out_dir: str, table_rows: Sequence[int], sizes: Sequence[int], seed: int
) -> Optional[List[Optional[np.ndarray]]]:
    """Memory-map tables written by :func:`build_tables` (int32 ``[rows_t, m_t]``, None where ``m_t == 1``); None
    when absent or built for other rows/sizes/seed.

    Raises:
        BinaryFormatError: ``tables.json`` is not JSON or lacks a field, or a ``table_XX.npy`` is missing,
            truncated or of another shape or dtype; the message names the file and says to rebuild ``out_dir``.
    """
    fix = (
        f"delete {out_dir} and rebuild it with `python data/preprocess_criteo.py multihot --out "
        f"{os.path.dirname(os.path.normpath(out_dir)) or '.'} --mode tables`"
    )
    meta_path = os.path.join(out_dir, "tables.json")
    if not os.path.isfile(meta_path):
        return None
    want = tables_spec(table_rows, sizes, seed)
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        other = any(meta[k] != want[k] for k in ("table_rows", "sizes", "seed"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BinaryFormatError(f"{meta_path}: unreadable or incomplete ({type(e).__name__}: {e}); {fix}") from None
    if other:
        return None
    out: List[Optional[np.ndarray]] = []
    for t, (rows, m) in enumerate(zip(table_rows, sizes)):
        if m == 1:
            out.append(None)
            continue
        path = table_path(out_dir, t)
        try:
            tab = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as e:  # missing (FileNotFoundError), or shorter than its header says
            raise BinaryFormatError(f"{path}: missing, unreadable or truncated ({e}); {fix}") from None
        if tab.shape != (rows, m) or tab.dtype != np.int32:
            raise BinaryFormatError(f"{path}: shape {tab.shape} {tab.dtype}, expected ({rows}, {m}) int32; {fix}")
        out.append(tab)
    return out


def expand_into(
    tables: Sequence[Optional[np.ndarray]],
    sizes: Sequence[int],
    ids: np.ndarray,
    out: np.ndarray,
    offsets: Sequence[int],
) -> None:
    """Write the bags of 1-hot ``ids`` into ``out``, feature-major (the KJT values layout).

    Args:
        tables: from :func:`build_tables` / :func:`load_tables`.
        sizes: multi-hot size per table.
        ids: int32 ``[T, B]`` 1-hot ids, feature-major, already checked to be in range.
        out: int32 ``[B * sum(sizes)]``; table ``t``'s ``[B, m_t]`` bags start at ``offsets[t]``.
        offsets: start of each table's section in ``out``.
    """
    b = ids.shape[1]
    for t, m in enumerate(sizes):
        dst = out[offsets[t] : offsets[t] + b * m]
        if tables[t] is None:
            dst[:] = ids[t]
        else:
            # mode="clip" only skips numpy's buffered bounds check: ids were validated against the table size
            # before this call, so no id is ever clipped.
            np.take(tables[t], ids[t], axis=0, out=dst.reshape(b, m), mode="clip")
