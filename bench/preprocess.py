"""Time and disk of ``data/preprocess_criteo.py`` per stage, measured on generated Criteo 1TB-layout TSV, with a
projection to the whole Criteo 1TB (days 0-23).

    python -m bench.preprocess --days 4 --rows-per-day 250000 --workers 2

Generates ``--days`` files ``day_N`` of ``--rows-per-day`` lines each in the 1TB layout (label, 13 integer counts,
26 categories as 8 lowercase hex digits, tab-separated; per-column missing rates and value ranges like those of
the first lines of 1TB ``day_0``, a few -1 counts in I8, about 250 bytes per line), then runs the stages of
``data/preprocess_criteo.py`` in-process with the same functions and arguments as the commands of the README
(``--layout terabyte --dense-transform mlperf --workers W``):

1. convert (the command without a sub-command): the parse pass (TSV to 1-hot ids, raw dense counts and labels)
   and the dense pass (``log(x - m + 2)``), one process per day;
2. ``multihot --mode tables``: the expansion tables (one process; ``--workers`` does not apply);
3. ``multihot --mode materialize``: every day's multi-hot ids gathered through the tables, one process per day.

Printed per stage: wall seconds, input rows/s (all workers together), and bytes per row of every file kind, read
from the files written. Then the projection for Criteo 1TB: the disk of every output, exact from the format
(bytes per row x rows + the fixed ``.npy`` headers; the expansion tables from their shapes at the MLPerf table
sizes), and the time as rows / the measured rate. The time is a projection from this host at ``W`` workers, not a
measurement; it also prints the read and write rates that time implies: a disk slower than those bounds the run.

What the projection leaves out: the generated input is read from the page cache (it was just written), day files
are plain TSV (``day_N.gz`` adds gzip decompression to every parse process), and real days are about 182 M rows
each, so the work is shared out a whole day at a time (the printed day-granularity figure). Categories are uniform
32-bit hashes, so the materialize pass gathers from uniformly random table rows; real ids are skewed.

Tables are capped at ``--row-cap`` rows (default 1 M: about 0.65 GB of tables instead of 23.9 GB, and a much
shorter tables stage); ``--row-cap 0`` uses the MLPerf sizes. With a cap, the tables stage's time is projected
linearly in the table elements written, and the materialize pass gathers from smaller tables than in a real run.

Disk: about 1.3 KB per generated row (input 0.25 KB, outputs 1.0 KB) plus the tables; the defaults need about
2 GB, checked before starting. ``--dir`` (default: a new temporary directory) is deleted at the end unless
``--keep``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dlrm.config import MLPERF_MULTI_HOT_SIZES, MLPERF_NUM_EMBEDDINGS, ModelConfig
from dlrm.data import binary_format as BF
from dlrm.data import multihot as mh_mod
from dlrm.data import preprocess as P

# Criteo 1TB: days 0-22 train (4,195,197,692 rows, MLPerf training rules); day 23 holds the 89,137,319
# validation rows (its first ceil(N/2)) and the 89,137,318 test rows (MLPerf reference README).
TB_DAYS = 24
TB_TRAIN_ROWS = 4_195_197_692
TB_DAY23_ROWS = 89_137_319 + 89_137_318
TB_ROWS = TB_TRAIN_ROWS + TB_DAY23_ROWS

# I1..I13: (fraction missing, median, 90th percentile) of the counts, as in the first lines of 1TB day_0.
INT_COLUMNS: List[Tuple[float, int, int]] = [
    (0.225, 7, 60),
    (0.09, 228, 1068),
    (0.25, 4, 18),
    (0.52, 38, 332),
    (0.44, 5, 41),
    (0.09, 0, 2),
    (0.03, 0, 0),
    (0.0, 9, 258),
    (0.0, 4, 24),
    (0.09, 0, 1),
    (0.44, 2, 9),
    (0.014, 3975, 36489),
    (0.25, 5, 23),
]
NEG_COLUMN, NEG_FRACTION = 7, 0.055  # I8 holds -1 in about 5% of the rows
# C1..C26: fraction missing (C14, C16, C17, C23 are empty in about half the rows)
CAT_MISSING = [0.022 if c in (1, 10, 11, 20, 21, 22) else 0.46 if c in (14, 16, 17, 23) else 0.0 for c in range(1, 27)]
CLICK_RATE = 0.03
CHUNK_ROWS = 1 << 16  # rows formatted per numpy pass when generating
_HEXDIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)

# outputs of the convert stage and of materialize, per day: (file kind, dtype, columns)
DAY_KINDS = [("dense", np.float32, 13), ("sparse", np.int32, 26), ("labels", np.int32, 1)]
MULTI_HOT_KIND = ("sparse_multi_hot", np.int32, sum(MLPERF_MULTI_HOT_SIZES))


# ------------------------------------------------------------------------------------------------ the input
def tsv_rows(rng: np.random.Generator, n: int) -> bytes:
    """``n`` lines of 1TB-layout TSV (40 tab-separated fields, ``'\\n'``-terminated), formatted in numpy.

    Every field is laid out right-aligned in 8 byte slots plus its separator, then the unused slots are dropped.
    """
    f = 1 + 13 + 26
    chars = np.zeros((n, f, 9), dtype=np.uint8)
    lens = np.zeros((n, f), dtype=np.int64)
    chars[:, 0, 7] = 48 + (rng.random(n) < CLICK_RATE)
    lens[:, 0] = 1
    for j, (miss, p50, p90) in enumerate(INT_COLUMNS):
        sigma = math.log((p90 + 1) / (p50 + 1)) / 1.2816  # the 90th percentile of a lognormal
        v = np.floor(np.exp(math.log(p50 + 1) + sigma * rng.standard_normal(n))) - 1
        v = np.clip(v, 0, 10**8 - 1).astype(np.int64)
        nd = 1 + sum((v >= 10**k).astype(np.int64) for k in range(1, 8))
        for k in range(8):
            chars[:, 1 + j, 7 - k] = 48 + (v // 10**k) % 10
        length = nd
        if j == NEG_COLUMN:
            neg = rng.random(n) < NEG_FRACTION
            chars[neg, 1 + j, 7] = ord("1")
            chars[neg, 1 + j, 6] = ord("-")
            length = np.where(neg, 2, nd)
        lens[:, 1 + j] = np.where(rng.random(n) < miss, 0, length)
    h = rng.integers(0, 2**32, size=(n, 26), dtype=np.int64)
    for k in range(8):
        chars[:, 14:, 7 - k] = _HEXDIGITS[(h >> (4 * k)) & 15]
    lens[:, 14:] = np.where(rng.random((n, 26)) < np.asarray(CAT_MISSING), 0, 8)
    chars[:, :, 8] = 9
    chars[:, -1, 8] = 10
    keep = np.arange(9) >= (8 - lens)[:, :, None]
    return chars[keep].tobytes()


def write_day(job: Tuple[str, int, int]) -> int:
    """Write ``day_{day}`` with ``rows`` lines (seeded by the day); returns its bytes."""
    path, day, rows = job
    rng = np.random.default_rng((0, day))
    with open(path + ".partial", "wb") as f:
        for lo in range(0, rows, CHUNK_ROWS):
            f.write(tsv_rows(rng, min(CHUNK_ROWS, rows - lo)))
    os.replace(path + ".partial", path)
    return os.path.getsize(path)


# ---------------------------------------------------------------------------------------------- the format
def npy_header_bytes(path: str) -> int:
    """Bytes before the data of a ``.npy`` file."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        (np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0)(f)
        return f.tell()


def table_file_bytes(rows: int, m: int) -> int:
    """Size of ``table_XX.npy`` for an int32 ``[rows, m]`` table, as ``np.lib.format.open_memmap`` writes it."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<i4", "fortran_order": False, "shape": (rows, m)})
    return len(buf.getvalue()) + rows * m * 4


def tables_bytes(table_rows: Sequence[int], sizes: Sequence[int]) -> int:
    """Bytes of ``multi_hot_tables/`` (``table_XX.npy`` for every table with m > 1, and ``tables.json``)."""
    spec = mh_mod.tables_spec(table_rows, sizes, seed=0)
    return sum(table_file_bytes(r, m) for r, m in zip(table_rows, sizes) if m > 1) + len(json.dumps(spec))


def table_elements(table_rows: Sequence[int], sizes: Sequence[int]) -> int:
    """int32 elements the tables stage writes (``rows x m`` of every table with m > 1)."""
    return sum(r * m for r, m in zip(table_rows, sizes) if m > 1)


def measure_kind(out: str, days: Sequence[int], kind: str, rows: int) -> Dict[str, Any]:
    """Sizes of ``day_{d}_{kind}.npy`` over ``days``: files, bytes, header bytes, and data bytes per row."""
    paths = [BF.day_file(out, d, kind) for d in days]
    size = sum(os.path.getsize(p) for p in paths)
    headers = sum(npy_header_bytes(p) for p in paths)
    return {
        "files": len(paths),
        "bytes": size,
        "header_bytes": headers,
        "header_bytes_per_file": headers // len(paths),
        "bytes_per_row": (size - headers) // rows if (size - headers) % rows == 0 else (size - headers) / rows,
    }


# ---------------------------------------------------------------------------------------------- the stages
def bench(root: str, days: int, rows_per_day: int, workers: int, row_cap: Optional[int]) -> Dict[str, Any]:
    """Generate the input under ``root/tsv``, run the three stages into ``root/bin``, measure and project.

    Returns the figures that :func:`report` prints: ``input``, ``stages`` (seconds, rows/s, per-pass seconds),
    ``outputs`` (per file kind: bytes, header bytes, bytes per row) and ``projection`` (Criteo 1TB bytes and
    seconds per output and stage).
    """
    tsv, out = os.path.join(root, "tsv"), os.path.join(root, "bin")
    for d in (tsv, out):  # a leftover dataset would let the resumable passes skip their work
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(tsv)
    day_ids = list(range(days))
    rows = days * rows_per_day
    table_rows = ModelConfig(row_cap=row_cap or None).table_rows  # the MLPerf tables; 0: uncapped
    sizes = list(MLPERF_MULTI_HOT_SIZES)

    t0 = time.perf_counter()
    jobs = [(os.path.join(tsv, f"day_{d}"), d, rows_per_day) for d in day_ids]
    with mp.get_context("fork").Pool(min(workers, days)) as pool:
        input_bytes = sum(pool.map(write_day, jobs))
    gen_s = time.perf_counter() - t0

    timings: Dict[str, float] = {}
    t0 = time.perf_counter()
    P.preprocess(
        out=out,
        layout="terabyte",
        inputs=P.find_day_files(tsv, day_ids),
        days=day_ids,
        table_rows=table_rows,
        transform="mlperf",
        workers=workers,
        timings=timings,
    )
    convert_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    P.multihot(out=out, sizes=sizes, seed=0, materialize=False, workers=workers)
    tables_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    P.multihot(out=out, sizes=sizes, seed=0, materialize=True, workers=workers)
    materialize_s = time.perf_counter() - t0

    outputs = {kind: measure_kind(out, day_ids, kind, rows) for kind, _, _ in DAY_KINDS + [MULTI_HOT_KIND]}
    tdir = os.path.join(out, mh_mod.TABLES_DIR)
    outputs["multi_hot_tables"] = {
        "files": len(os.listdir(tdir)),
        "bytes": sum(os.path.getsize(os.path.join(tdir, n)) for n in os.listdir(tdir)),
    }
    # deleted by the dense pass (unless --keep-raw-dense): the same int32 [N, 13] layout as dense
    outputs["dense_raw"] = {"bytes_per_row": 13 * 4, "header_bytes_per_file": BF.HEADER_BYTES, "transient": True}

    stages = {
        "convert": {
            "seconds": convert_s,
            "rows_per_s": rows / convert_s,
            "passes": {"parse": timings["parse"], "dense": timings["dense"]},
        },
        "tables": {"seconds": tables_s, "table_elements": table_elements(table_rows, sizes)},
        "materialize": {"seconds": materialize_s, "rows_per_s": rows / materialize_s},
    }
    res = {
        "host": {"node": platform.node(), "cpus": os.cpu_count(), "numpy": np.__version__},
        "config": {
            "days": days,
            "rows_per_day": rows_per_day,
            "rows": rows,
            "workers": workers,
            "row_cap": row_cap,
            "table_rows": table_rows,
        },
        "input": {"bytes": input_bytes, "bytes_per_row": input_bytes / rows, "generate_seconds": gen_s},
        "stages": stages,
        "outputs": outputs,
    }
    res["projection"] = project(res)
    return res


def project(res: Dict[str, Any]) -> Dict[str, Any]:
    """Criteo 1TB (:data:`TB_ROWS` rows in :data:`TB_DAYS` days) from the measured figures.

    Disk: ``TB_ROWS * bytes_per_row + TB_DAYS * header`` per day-file kind, :func:`tables_bytes` at the MLPerf
    sizes. Time: ``TB_ROWS / rows_per_s`` for convert and materialize (all workers busy); ``day_granularity_s``
    is the time when days of ``TB_ROWS / TB_DAYS`` rows are handed out whole: ``ceil(TB_DAYS / W)`` rounds of
    one day per worker at ``rows_per_s / W`` each. Tables: the measured seconds scaled by the table elements.
    """
    w, out, st = res["config"]["workers"], res["outputs"], res["stages"]
    disk = {
        kind: TB_ROWS * out[kind]["bytes_per_row"] + TB_DAYS * out[kind]["header_bytes_per_file"]
        for kind in [k for k, _, _ in DAY_KINDS + [MULTI_HOT_KIND]] + ["dense_raw"]
    }
    disk["multi_hot_tables"] = tables_bytes(MLPERF_NUM_EMBEDDINGS, MLPERF_MULTI_HOT_SIZES)
    rounds = math.ceil(TB_DAYS / w)
    time_s = {}
    for stage in ("convert", "materialize"):
        rate = st[stage]["rows_per_s"]
        time_s[stage] = {
            "seconds": TB_ROWS / rate,
            "day_granularity_s": rounds * (TB_ROWS / TB_DAYS) / (rate / w),
        }
    scale = TB_ROWS / res["config"]["rows"]
    time_s["convert"]["passes"] = {k: v * scale for k, v in st["convert"]["passes"].items()}
    full_elems = table_elements(MLPERF_NUM_EMBEDDINGS, MLPERF_MULTI_HOT_SIZES)
    time_s["tables"] = {"seconds": st["tables"]["seconds"] * full_elems / st["tables"]["table_elements"]}
    input_bytes = TB_ROWS * res["input"]["bytes_per_row"]
    convert_bytes = disk["dense"] + disk["sparse"] + disk["labels"]
    return {
        "rows": TB_ROWS,
        "days": TB_DAYS,
        "input_bytes": input_bytes,
        "disk": disk,
        "convert_bytes": convert_bytes,  # what convert leaves
        "time": time_s,
        # the parse pass reads the TSV; convert writes raw dense, sparse, labels, then reads raw and writes dense
        "parse_read_bytes_per_s": input_bytes / time_s["convert"]["passes"]["parse"],
        "convert_write_bytes_per_s": (convert_bytes + disk["dense_raw"]) / time_s["convert"]["seconds"],
        "materialize_write_bytes_per_s": disk["sparse_multi_hot"] / time_s["materialize"]["seconds"],
        "materialize_read_bytes_per_s": disk["sparse"] / time_s["materialize"]["seconds"],
    }


# ---------------------------------------------------------------------------------------------- the report
def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n < 1e12 else f"{n / 1e12:,.2f} TB"


def _dur(s: float) -> str:
    return f"{s:,.0f} s" if s < 120 else f"{s / 60:,.1f} min" if s < 7200 else f"{s / 3600:,.2f} h"


def report(res: Dict[str, Any]) -> str:
    """The printed summary of :func:`bench`'s figures."""
    c, st, o, pj = res["config"], res["stages"], res["outputs"], res["projection"]
    w = c["workers"]
    cap = f"tables capped at {c['row_cap']:,} rows" if c["row_cap"] else "MLPerf table sizes"
    lines = [
        f"host {res['host']['node']}: {res['host']['cpus']} CPUs, numpy {res['host']['numpy']}; "
        f"{c['days']} days x {c['rows_per_day']:,} rows = {c['rows']:,} rows, --workers {w}, {cap}",
        f"input: {res['input']['bytes']:,} bytes of TSV, {res['input']['bytes_per_row']:.1f} bytes/row "
        f"(generated in {res['input']['generate_seconds']:.1f} s)",
        "",
        "measured                           wall s      rows/s   bytes/row written (per file kind; + header per file)",
    ]

    def kinds(*names: str) -> str:
        return ", ".join(f"{n} {o[n]['bytes_per_row']:g} (+{o[n]['header_bytes_per_file']})" for n in names)

    cv = st["convert"]
    lines += [
        f"convert (parse + dense)        {cv['seconds']:10.2f} {cv['rows_per_s']:11,.0f}   "
        + kinds("dense", "sparse", "labels"),
        f"  parse pass                   {cv['passes']['parse']:10.2f} {c['rows'] / cv['passes']['parse']:11,.0f}"
        f"   dense_raw {o['dense_raw']['bytes_per_row']} (deleted by the dense pass)",
        f"  dense pass                   {cv['passes']['dense']:10.2f} {c['rows'] / cv['passes']['dense']:11,.0f}",
        f"multihot --mode tables         {st['tables']['seconds']:10.2f} {'-':>11}   "
        f"{o['multi_hot_tables']['bytes']:,} bytes in {o['multi_hot_tables']['files']} files (fixed, not per row)",
        f"multihot --mode materialize    {st['materialize']['seconds']:10.2f} "
        f"{st['materialize']['rows_per_s']:11,.0f}   " + kinds("sparse_multi_hot"),
        "",
        f"Criteo 1TB projection: {pj['rows']:,} rows in {pj['days']} days (days 0-22 train, day 23 evaluates)",
        "disk (exact: bytes/row x rows + headers):",
    ]
    for kind in ("dense", "sparse", "labels", "sparse_multi_hot", "multi_hot_tables"):
        lines.append(f"  {kind:<18} {_gb(pj['disk'][kind]):>10}   ({pj['disk'][kind]:,} bytes)")
    conv = pj["convert_bytes"]
    lines += [
        f"  convert total {_gb(conv)}, up to {_gb(conv + pj['disk']['dense_raw'])} while the raw dense counts "
        f"({_gb(pj['disk']['dense_raw'])}) exist; with multi-hot materialized "
        f"{_gb(conv + pj['disk']['sparse_multi_hot'] + pj['disk']['multi_hot_tables'])}",
        f"  input TSV at {res['input']['bytes_per_row']:.1f} bytes/row: {_gb(pj['input_bytes'])}",
        f"time (a projection from the rate measured here at --workers {w}, not a measurement):",
    ]
    t = pj["time"]
    lines += [
        f"  convert        {_dur(t['convert']['seconds']):>10}   (parse {_dur(t['convert']['passes']['parse'])}, "
        f"dense {_dur(t['convert']['passes']['dense'])}); whole days per worker: "
        f"{_dur(t['convert']['day_granularity_s'])}",
        f"  tables         {_dur(t['tables']['seconds']):>10}   (one process, scaled by the table elements"
        + (", measured at the MLPerf sizes)" if not c["row_cap"] else f" from the cap of {c['row_cap']:,} rows)"),
        f"  materialize    {_dur(t['materialize']['seconds']):>10}   whole days per worker: "
        f"{_dur(t['materialize']['day_granularity_s'])}",
        f"  these times need the parse pass to read {pj['parse_read_bytes_per_s'] / 1e9:.2f} GB/s of TSV, convert "
        f"to write {pj['convert_write_bytes_per_s'] / 1e9:.2f} GB/s, materialize to read "
        f"{pj['materialize_read_bytes_per_s'] / 1e9:.2f} GB/s and write "
        f"{pj['materialize_write_bytes_per_s'] / 1e9:.2f} GB/s; a slower disk bounds them (time = bytes / rate)",
        "  not in the measurement: reading the input from disk (it came from the page cache), gzip input "
        "(day_N.gz), skewed real ids",
    ]
    if c["days"] % w:
        lines.append(
            f"note: {c['days']} days on {w} workers leaves workers idle in the last round, which lowers the measured "
            "rates; give --days a multiple of --workers"
        )
    return "\n".join(lines)


def needed_bytes(rows: int, table_rows: Sequence[int]) -> int:
    """Peak disk of a run: input at 256 bytes/row (the generated lines average about 250), every output, tables."""
    per_row = 256 + 13 * 4 * 2 + 26 * 4 + 4 + sum(MLPERF_MULTI_HOT_SIZES) * 4
    return rows * per_row + tables_bytes(table_rows, MLPERF_MULTI_HOT_SIZES)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.preprocess",
        description=__doc__.split("\n\n")[0].replace("``", ""),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--days", type=int, default=4, help="day files to generate (at least 2: the last evaluates)")
    ap.add_argument("--rows-per-day", type=int, default=250_000, help="lines per generated day file")
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="processes (days run in parallel)")
    ap.add_argument(
        "--row-cap", type=int, default=1_000_000, help="cap every table at this many rows; 0: the MLPerf sizes"
    )
    ap.add_argument(
        "--dir", default=None, help="working directory; its tsv/ and bin/ are rewritten (default: a new temporary one)"
    )
    ap.add_argument("--keep", action="store_true", help="keep tsv/ (the input) and bin/ (the dataset) afterwards")
    args = ap.parse_args(argv)
    if args.days < 2:
        ap.error(f"--days {args.days}: give at least 2 (training days and the evaluation day)")
    if args.rows_per_day < 1 or args.workers < 1 or args.row_cap < 0:
        ap.error("--rows-per-day and --workers must be positive, --row-cap 0 or more")
    root = args.dir or tempfile.mkdtemp(prefix="dlrm_bench_preprocess_")
    os.makedirs(root, exist_ok=True)
    need = needed_bytes(args.days * args.rows_per_day, ModelConfig(row_cap=args.row_cap or None).table_rows)
    free = shutil.disk_usage(root).free
    if need > free:
        print(
            f"error: --dir {root}: the run needs about {_gb(need)}, {_gb(free)} free; pass a --dir with more space "
            "or lower --days / --rows-per-day / --row-cap",
            file=sys.stderr,
        )
        return 2
    print(f"working in {root} (needs about {_gb(need)})", flush=True)
    try:
        res = bench(root, args.days, args.rows_per_day, args.workers, args.row_cap or None)
    finally:
        if not args.keep:
            for d in ("tsv", "bin"):
                shutil.rmtree(os.path.join(root, d), ignore_errors=True)
            if not args.dir:
                shutil.rmtree(root, ignore_errors=True)
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
