"""Preprocess Criteo click logs into the binary format that ``data=criteo_binary`` memory-maps.

Criteo 1TB (day_0 .. day_23, plain or .gz), MLPerf tables and dense transform, 16 processes::

    python data/preprocess_criteo.py --layout terabyte --input-dir /data/criteo1tb --out /data/criteo_bin \\
        --days 0-23 --dense-transform mlperf --workers 16

Kaggle ``train.txt`` (cut into 7 days; day 6 validates / tests), original DLRM dense transform::

    python data/preprocess_criteo.py --layout kaggle --input train.txt --out /data/kaggle_bin --dense-transform log1p

MLPerf multi-hot (uniform, seed 0): expansion tables only (23.9 GB, for on-the-fly multi-hot), or also
materialized per day (3.74 TB for 1TB)::

    python data/preprocess_criteo.py multihot --out /data/criteo_bin --mode tables
    python data/preprocess_criteo.py multihot --out /data/criteo_bin --mode materialize --workers 16

Check the written files against the sha256s in meta.json::

    python data/preprocess_criteo.py verify --out /data/criteo_bin

Runs are resumable: a killed run, re-run with the same arguments, redoes only the unfinished days. A dataset in
--out that was built with other options (days, input, table rows, dense transform or m) is refused; --overwrite
rebuilds it there, keeping the days whose input and options are unchanged. Memory: about 100 MB per worker.
Format, splits and transforms: docs/data.md and dlrm/data/binary_format.py.

Exit status: 0 done; 2 bad input (a flag's value, a missing file, a malformed line, a dataset directory it cannot
use), as one ``error:`` line naming the flag or file (and line) and the fix; ``verify``: 1 when a file differs from
meta.json (a ``MISMATCH <file>`` line each).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dlrm.config import MLPERF_MULTI_HOT_SIZES, MLPERF_NUM_EMBEDDINGS  # noqa: E402
from dlrm.data import preprocess as P  # noqa: E402
from dlrm.errors import InputError  # noqa: E402

SEED_MAX = 2**32 - 1  # numpy's legacy seeding (np.random.seed) takes 0 .. 2**32 - 1
# the first argument picks the command; without one of these it converts TSV files (the options --help lists)
SUBCOMMANDS = """subcommands (the first argument; without one, the TSV files are converted):
  multihot   write the MLPerf multi-hot expansion tables (--mode tables) or materialize them per day
             (--mode materialize) into a converted dataset
  verify     check the files of a dataset against the sha256s in its meta.json
  preprocess_criteo.py multihot --help / verify --help: their options. Commands and sizes: the module docstring,
  docs/data.md."""
DAYS_FIX = "give days as a range or a list, e.g. --days 0-23 or --days 0,1,23"


def _days(spec: str) -> List[int]:
    """``--days``: comma-separated days and ``lo-hi`` ranges (``0-23``, ``0,1,23``), as day numbers in order.

    Raises:
        PreprocessError: a part that is not a day number or a low-to-high range, or a day given twice; the message
            names ``--days`` and its value.
    """
    out: List[int] = []
    for part in spec.split(","):
        where = f"--days {spec!r}" + (f": {part!r}" if part != spec else "")
        lo, dash, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise P.PreprocessError(f"{where} is not a day number or a range; {DAYS_FIX}") from None
        if first < 0 or last < first:
            raise P.PreprocessError(f"{where} is not a range from a low to a high day; {DAYS_FIX}")
        out.extend(range(first, last + 1))
    twice = sorted({d for d in out if out.count(d) > 1})
    if twice:
        raise P.PreprocessError(f"--days {spec!r}: day(s) {twice} given more than once; give each day once")
    return out


def _ints(spec: str, mlperf: List[int], what: str) -> List[int]:
    """``--table-rows`` / ``--sizes`` (the flag is ``what``): ``mlperf`` or one positive integer per table.

    Raises:
        PreprocessError: not ``mlperf`` and not ``len(mlperf)`` comma-separated positive integers; the message names
            ``what`` and its value.
    """
    if spec == "mlperf":
        return list(mlperf)
    try:
        values = [int(x) for x in spec.split(",")]
    except ValueError:
        values = []
    if len(values) != len(mlperf) or min(values) < 1:
        raise P.PreprocessError(
            f"{what} {spec!r}: give {len(mlperf)} comma-separated positive whole numbers (one per table, C1..C26), "
            f"or {what} mlperf"
        )
    return values


def _check_convert_flags(args: argparse.Namespace) -> None:
    """Refuse flag values the conversion cannot use, and flags that the chosen layout or transform ignores.

    Raises:
        PreprocessError: naming the flag and the fix.
    """
    if args.block_mb < 1:
        raise P.PreprocessError(f"--block-mb {args.block_mb}: give a block size in MiB >= 1 (default 8)")
    if args.row_cap is not None and args.row_cap < 1:
        raise P.PreprocessError(f"--row-cap {args.row_cap}: give a positive number of rows, or leave it out")
    if args.layout == "kaggle":
        if args.days is not None:
            raise P.PreprocessError(
                f"--days {args.days}: --layout kaggle cuts train.txt into {P.KAGGLE_DAYS} days itself; drop --days"
            )
        if args.input_dir is not None:
            raise P.PreprocessError(
                f"--input-dir {args.input_dir}: --layout kaggle reads one file, --input train.txt; drop --input-dir"
            )
    elif args.input is not None:
        raise P.PreprocessError(
            f"--input {args.input}: --layout terabyte reads the day files in --input-dir; drop --input"
        )
    if args.dense_min is not None and args.dense_transform != "mlperf":
        raise P.PreprocessError(
            f"--dense-min {args.dense_min}: only the mlperf transform log(x - m + 2) has an m; drop --dense-min, "
            "or use --dense-transform mlperf"
        )


def main(argv: List[str]) -> int:
    if argv and argv[0] in ("multihot", "verify"):
        cmd, argv = argv[0], argv[1:]
    else:
        cmd = "convert"
    ap = argparse.ArgumentParser(
        prog=f"preprocess_criteo.py {cmd if cmd != 'convert' else ''}".strip(),
        description=__doc__.split("\n\n")[0],
        epilog=SUBCOMMANDS if cmd == "convert" else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True, help="dataset directory")
    ap.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes (days run in parallel); 0 or 1: one day after another in this process",
    )
    if cmd == "convert":
        ap.add_argument("--layout", choices=("terabyte", "kaggle"), required=True)
        ap.add_argument("--input-dir", help="terabyte: directory with day_N or day_N.gz")
        ap.add_argument("--input", help="kaggle: train.txt (or .gz)")
        ap.add_argument(
            "--days", default=None, help="terabyte days, e.g. 0-23 or 0,1,23 (default 0-23); the last one evaluates"
        )
        ap.add_argument("--dense-transform", choices=P.TRANSFORMS, default="mlperf")
        ap.add_argument(
            "--dense-min",
            type=int,
            default=None,
            help="fix m of the mlperf transform instead of taking the training days' minimum",
        )
        ap.add_argument("--table-rows", default="mlperf", help="26 comma-separated table sizes, or mlperf")
        ap.add_argument("--row-cap", type=int, default=None, help="cap every table at this many rows (> 0)")
        ap.add_argument("--block-mb", type=int, default=8, help="read/parse block size per worker (MiB, >= 1)")
        ap.add_argument(
            "--keep-raw-dense",
            action="store_true",
            help="keep day_N_dense_raw.npy (int32 counts) to re-derive the other transform later",
        )
        ap.add_argument(
            "--overwrite",
            action="store_true",
            help="rebuild a dataset in --out that was built with other options (refused without it); days whose "
            "input and options are unchanged are kept",
        )
    elif cmd == "multihot":
        ap.add_argument("--mode", choices=("tables", "materialize"), default="tables")
        ap.add_argument("--sizes", default="mlperf", help="26 comma-separated multi-hot sizes, or mlperf")
        ap.add_argument("--seed", type=int, default=0, help="legacy numpy seed (MLPerf reference: 0)")
    args = ap.parse_args(argv)
    try:
        if args.workers < 0:
            raise P.PreprocessError(
                f"--workers {args.workers}: give a number of processes >= 1 (0 or 1: one day after another in this "
                "process)"
            )
        if cmd == "verify":
            bad = P.verify(args.out)
            for p in bad:
                print(f"MISMATCH {p}", file=sys.stderr)
            print("all files match meta.json" if not bad else f"{len(bad)} file(s) differ from meta.json")
            return 1 if bad else 0
        if cmd == "multihot":
            if not 0 <= args.seed <= SEED_MAX:
                raise P.PreprocessError(
                    f"--seed {args.seed}: give a seed from 0 to 2**32 - 1 = {SEED_MAX} (the MLPerf reference uses 0)"
                )
            sizes = _ints(args.sizes, MLPERF_MULTI_HOT_SIZES, "--sizes")
            P.multihot(
                out=args.out, sizes=sizes, seed=args.seed, materialize=args.mode == "materialize", workers=args.workers
            )
            return 0
        _check_convert_flags(args)
        rows = _ints(args.table_rows, MLPERF_NUM_EMBEDDINGS, "--table-rows")
        if args.row_cap is not None:
            rows = [min(r, args.row_cap) for r in rows]
        if args.layout == "terabyte":
            if not args.input_dir:
                ap.error("--layout terabyte needs --input-dir")
            days = _days(args.days or "0-23")
            P.check_days(days, args.days)
            inputs = P.find_day_files(args.input_dir, days)
        else:
            if not args.input:
                ap.error("--layout kaggle needs --input train.txt")
            if not os.path.isfile(args.input):
                why = "a directory, not a file" if os.path.isdir(args.input) else f"no such file (cwd {os.getcwd()})"
                raise P.PreprocessError(f"--input {args.input!r}: {why}; pass Kaggle's train.txt (plain or gzip)")
            days, inputs = [], [args.input]
        meta = P.preprocess(
            out=args.out,
            layout=args.layout,
            inputs=inputs,
            days=days,
            table_rows=rows,
            transform=args.dense_transform,
            workers=args.workers,
            block_bytes=args.block_mb << 20,
            keep_raw=args.keep_raw_dense,
            dense_min=args.dense_min,
            overwrite=args.overwrite,
        )
    except (InputError, FileNotFoundError) as e:  # PreprocessError, TsvFormatError, BinaryFormatError
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = sum(d["rows"] for d in meta["days"])
    print(
        f"{args.out}: {len(meta['days'])} days, {n:,} rows; dense {meta['dense_transform_formula']}"
        + (f", m = {meta['dense_min']}" if meta["dense_min"] is not None else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
