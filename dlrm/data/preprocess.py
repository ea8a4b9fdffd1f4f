"""Criteo TSV (1TB ``day_N`` files or Kaggle ``train.txt``, plain or gzip) to the binary format of
:mod:`dlrm.data.binary_format`, streaming in bounded memory, resumable per day, parallel over processes.

Run it with ``data/preprocess_criteo.py`` (its docstring has the commands). Passes:

1. **parse** (one process per day): read the input in blocks of ``--block-mb`` cut at line ends, parse each block
   vectorised in numpy (:func:`dlrm.data.preprocess_passes.parse_block`), hash categories into the tables
   (``hash % rows``, as torchrec's Criteo preprocessing), and append to ``day_{d}_dense_raw.npy`` (int32 counts,
   missing 0), ``day_{d}_sparse.npy`` and ``day_{d}_labels.npy``. Blocks that hold anything unusual (blank
   lines, ``\\r``, signs, non-digits, long values) are re-parsed line by line with
   :func:`dlrm.data.criteo_tsv.parse_line`, so the accepted rows and the error messages (``file:line``) are exactly
   those of ``data=criteo_tsv``. Memory: a few blocks per process (about 100 MB at the default 8 MB blocks).
2. **dense**: ``m`` = the minimum raw dense value (missing as 0, all 13 columns) over the *training* days only,
   fixed once and stored in ``meta.json``; every day, evaluation days included, is transformed with it:
   ``mlperf``: ``log(x - m + 2)`` (torchrec ``BinaryCriteoUtils.tsv_to_npys``, int32 shift then float32 log, but
   with ``m`` global instead of per file) or ``log1p``: ``log(max(x, 0) + 1)`` (original DLRM, identical to
   ``data=criteo_tsv``).
3. **meta**: ``meta.json`` with rows, sha256 of every file, the transform and ``m``, and the split rule.

Each finished day leaves a ``day_{d}.*.json`` marker holding its inputs (path, size, mtime) and outputs
(sha256); a re-run skips days whose marker matches and redoes the rest (a killed run resumes). A finished dataset
(``meta.json``) built with other options is refused unless ``overwrite`` (``--overwrite``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from dlrm.config import MLPERF_NUM_EMBEDDINGS
from dlrm.data import binary_format as fmt
from dlrm.data import multihot as mh_mod
from dlrm.data.criteo_tsv import NUM_CAT, is_gzip
from dlrm.data.preprocess_passes import (
    PreprocessError,
    dense_day,
    iter_blocks,
    marker_path,
    multihot_day,
    parse_day,
    run_jobs,
)

KAGGLE_DAYS = 7  # original DLRM: Kaggle train.txt is cut into 7 equal "days"; the last one evaluates
TRANSFORMS = ("mlperf", "log1p")


# ------------------------------------------------------------------------------------------------- driver
def find_day_files(input_dir: str, days: Sequence[int]) -> List[str]:
    """``day_{d}`` or ``day_{d}.gz`` for each day.

    Raises:
        PreprocessError: a day file is missing (names the day and the names looked for).
    """
    out = []
    for d in days:
        for name in (f"day_{d}", f"day_{d}.gz", f"day_{d}.tsv", f"day_{d}.tsv.gz"):
            p = os.path.join(input_dir, name)
            if os.path.isfile(p):
                out.append(p)
                break
        else:
            raise PreprocessError(f"--input-dir {input_dir}: no day_{d} or day_{d}.gz; download it or pass --days")
    return out


def count_lines(path: str, block_bytes: int = 8 << 20) -> int:
    """Lines in a (plain or gzip) file, a last line without ``'\\n'`` included."""
    return sum(data.count(b"\n") for _, data, _ in iter_blocks(path, block_bytes=block_bytes))


def line_offsets(path: str, lines: Sequence[int], block_bytes: int = 8 << 20) -> List[int]:
    """Byte offsets where the given 1-based line numbers start in a plain (not gzip) file."""
    want = sorted(set(lines))
    out: Dict[int, int] = {1: 0}
    pos = 0
    for first, data, _ in iter_blocks(path, block_bytes=block_bytes):
        nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
        last = first + nl.size
        for ln in want:
            if first < ln <= last:
                out[ln] = pos + int(nl[ln - first - 1]) + 1
        pos += len(data)
    return [out.get(ln, pos) for ln in lines]


def days_text(days: Sequence[int]) -> str:
    """Day numbers in the ``--days`` syntax: ``[0, 1, 2, 5]`` as ``0-2,5``."""
    parts: List[str] = []
    for d in days:
        lo, _, hi = parts[-1].partition("-") if parts else ("", "", "")
        if parts and int(hi or lo) + 1 == d:
            parts[-1] = f"{lo}-{d}"
        else:
            parts.append(str(d))
    return ",".join(parts)


def check_days(days: Sequence[int], spec: Optional[str] = None) -> None:
    """Refuse fewer than 2 days: the last one evaluates, so one day leaves nothing to train on.

    Raises:
        PreprocessError: naming ``--days`` (``spec`` as given, else ``days``) and a range of two days.
    """
    if len(days) < 2:
        d = days[0] if days else 0
        what = f"only day {d}" if days else "no days"
        raise PreprocessError(
            f"--days {spec or days_text(days)}: {what}; give at least 2 days, the training days and then the last "
            f"day for validation/test, e.g. --days {d}-{d + 1}"
        )


def _rows_text(rows: Sequence[int]) -> str:
    """Table sizes as the flags that give them: ``--table-rows mlperf``, ``--row-cap N`` or the list."""
    rows = [int(r) for r in rows]
    if rows == list(MLPERF_NUM_EMBEDDINGS):
        return "--table-rows mlperf"
    if rows == [min(r, max(rows)) for r in MLPERF_NUM_EMBEDDINGS]:
        return f"--row-cap {max(rows)}"
    return "--table-rows " + ",".join(map(str, rows))


class _Options(NamedTuple):
    """The options of :func:`preprocess` that ``meta.json`` records: a re-run with others would replace the
    dataset (:func:`_changed_options`)."""

    layout: str
    inputs: Sequence[str]
    days: Sequence[int]
    table_rows: Sequence[int]
    transform: str
    dense_min: Optional[int]


def _changed_options(prev: Dict[str, Any], opts: _Options) -> List[str]:
    """The options of this run that differ from those ``prev`` (a ``meta.json``) was built with, each as
    ``<flag> was <old>, now <new>``; empty when a re-run would resume or skip every day of ``prev``.

    Raises:
        KeyError, TypeError, AttributeError, ValueError: ``prev`` lacks a key or has one of the wrong type.
    """
    layout, inputs, days, table_rows, transform, dense_min = opts
    out: List[str] = []
    if prev["layout"] != layout:
        return [f"--layout was {prev['layout']}, now {layout}"]
    if layout == "kaggle":
        old_in, new_in = prev["days"][0]["source"]["path"], os.path.abspath(inputs[0])
        if old_in != new_in:
            out.append(f"--input was {old_in}, now {new_in}")
    else:
        old_days = [int(d["day"]) for d in prev["days"]]
        if old_days != list(days):
            out.append(f"--days was {days_text(old_days)}, now {days_text(days)}")
        old_dirs = sorted({os.path.dirname(d["source"]["path"]) for d in prev["days"]})
        new_dirs = sorted({os.path.dirname(os.path.abspath(p)) for p in inputs})
        if old_dirs != new_dirs:
            out.append(f"--input-dir was {', '.join(old_dirs)}, now {', '.join(new_dirs)}")
    if [int(r) for r in prev["table_rows"]] != [int(r) for r in table_rows]:
        out.append(f"table rows were {_rows_text(prev['table_rows'])}, now {_rows_text(table_rows)}")
    if prev["dense_transform"] != transform:
        out.append(f"--dense-transform was {prev['dense_transform']}, now {transform}")
    elif transform == "mlperf":
        given = prev["dense_min_source"] == "given"
        old = f"{prev['dense_min']}" if given else f"not given (m = {prev['dense_min']}, the training days' minimum)"
        # a given m equal to the one computed before writes the same files; an m still to be computed may not
        if (dense_min is None and given) or (dense_min is not None and dense_min != prev["dense_min"]):
            out.append(f"--dense-min was {old}, now {'not given' if dense_min is None else dense_min}")
    return out


def preprocess(
    *,
    out: str,
    layout: str,
    inputs: Sequence[str],
    days: Sequence[int],
    table_rows: Sequence[int],
    transform: str,
    workers: int,
    block_bytes: int = 8 << 20,
    keep_raw: bool = False,
    dense_min: Optional[int] = None,
    overwrite: bool = False,
    timings: Optional[Dict[str, float]] = None,
) -> Dict[str, Any]:
    """Run the passes; returns the written ``meta.json`` content. ``timings``, if given, receives each pass's
    wall seconds under ``parse`` and ``dense``.

    Args:
        out: dataset directory (created). One that already holds a ``meta.json`` is resumed: days whose marker
            matches are kept, the others redone.
        layout: ``terabyte`` (``inputs`` are day files, one per entry of ``days``) or ``kaggle`` (``inputs`` is one
            ``train.txt``, cut into 7 days of ``N*k//7 .. N*(k+1)//7`` rows).
        table_rows: rows of the 26 tables the category hashes are mapped into (MLPerf cardinalities).
        transform: ``mlperf`` or ``log1p`` (module doc).
        dense_min: fix ``m`` instead of computing it from the training days (e.g. to add days to a dataset).
        overwrite: rebuild a dataset in ``out`` that was built with other options (layout, days, input files,
            table rows, transform, ``m``); without it such a run is refused before anything is written, since it
            would replace the dataset (hours of work on Criteo 1TB).

    Raises:
        TsvFormatError / PreprocessError: bad input, naming file and line; fewer than 2 days (:func:`check_days`);
            a Kaggle file of fewer than 7 lines; ``out`` a file, or holding a dataset built with other options
            (without ``overwrite``).
    """
    days = _check_options(out, _Options(layout, inputs, days, table_rows, transform, dense_min), overwrite)
    jobs = _day_jobs(layout, inputs, days, block_bytes)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:  # a file on the way, or no permission
        raise PreprocessError(f"--out {out}: cannot create it ({e.strerror}); give a directory you can write") from None
    full = _parse_jobs(jobs, out, table_rows, block_bytes)
    t0 = time.perf_counter()
    parsed = run_jobs(parse_day, full, workers, "parse", total_bytes=sum(j["progress_bytes"] for j in jobs))
    t1 = time.perf_counter()
    train = parsed[:-1]
    m = dense_min if dense_min is not None else min(r["dense_min"] for r in train)
    m_src = "given" if dense_min is not None else f"days {jobs[0]['day']}-{jobs[-2]['day']} (training)"
    djobs = [
        _day_job(
            out,
            j["day"],
            r["rows"],
            dict(transform=transform, dense_min=m if transform == "mlperf" else None, parse_files=r["files"]),
            keep_raw=keep_raw,
            source=j["path"],
            start_line=j["start_line"],
            parse_job=fj,
        )
        for j, r, fj in zip(jobs, parsed, full)
    ]
    dense = run_jobs(dense_day, djobs, workers, "dense")
    if timings is not None:
        timings.update(parse=t1 - t0, dense=time.perf_counter() - t1)
    meta = _dataset_meta(layout, table_rows, transform, m, m_src, keep_raw, jobs, parsed, dense)
    _carry_multi_hot(out, meta)
    fmt.write_meta(out, meta)
    return meta


def _check_options(out: str, opts: _Options, overwrite: bool) -> List[int]:
    """Refuse options :func:`preprocess` cannot use, before anything is written; returns the days to build
    (``0 .. 6`` for the Kaggle layout).

    Raises:
        PreprocessError: as :func:`preprocess` says (all but a Kaggle file that is too short).
    """
    layout, inputs, days, table_rows, transform, _ = opts
    if transform not in TRANSFORMS:
        raise PreprocessError(f"--dense-transform {transform!r}: choose one of {', '.join(TRANSFORMS)}")
    if len(table_rows) != NUM_CAT or min(table_rows) < 1:
        raise PreprocessError(f"--table-rows: give {NUM_CAT} positive table sizes, got {list(table_rows)}")
    if layout == "kaggle":
        days = list(range(KAGGLE_DAYS))
    elif layout == "terabyte":
        check_days(days)
        if len(inputs) != len(days):
            raise PreprocessError(f"{len(inputs)} input files for {len(days)} days")
    else:
        raise PreprocessError(f"--layout {layout!r}: choose terabyte or kaggle")
    if os.path.exists(out) and not os.path.isdir(out):
        raise PreprocessError(
            f"--out {out}: a file, not a directory; give a directory (a new one, or a dataset to resume)"
        )
    if not overwrite:
        try:
            with open(os.path.join(out, fmt.META), encoding="utf-8") as f:
                prev = json.load(f)
            changed = _changed_options(prev, opts._replace(days=days))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            changed = []  # no finished dataset, or a damaged meta.json that this run rewrites
        if changed:
            raise PreprocessError(
                f"--out {out} holds a dataset built with other options ({'; '.join(changed)}), which this run "
                "would replace; give another --out, or add --overwrite to rebuild it there"
            )
    return list(days)


def _day_jobs(layout: str, inputs: Sequence[str], days: Sequence[int], block_bytes: int) -> List[Dict[str, Any]]:
    """One parse job per day: its file, first byte and line, line count (None: to the end) and the bytes it reads
    (for the progress bar). The Kaggle layout cuts its one file into :data:`KAGGLE_DAYS` equal days.

    Raises:
        PreprocessError: a Kaggle file of fewer than :data:`KAGGLE_DAYS` lines.
    """
    jobs = []
    if layout == "kaggle":
        (path,) = inputs
        st = os.stat(path)
        n = count_lines(path, block_bytes)
        if n < KAGGLE_DAYS:
            raise PreprocessError(
                f"--input {path}: {n} lines, fewer than the {KAGGLE_DAYS} days --layout kaggle cuts it into (day k: "
                f"lines N*k//{KAGGLE_DAYS}+1 .. N*(k+1)//{KAGGLE_DAYS}); give a file of at least "
                f"{KAGGLE_DAYS} rows"
            )
        bounds = [n * k // KAGGLE_DAYS for k in range(KAGGLE_DAYS + 1)]
        gz = is_gzip(path)
        offs = [0] * KAGGLE_DAYS if gz else line_offsets(path, [b + 1 for b in bounds[:-1]], block_bytes)
        for k in days:
            jobs.append(
                dict(
                    path=path,
                    day=k,
                    start_byte=offs[k],
                    start_line=bounds[k] + 1,
                    max_lines=bounds[k + 1] - bounds[k],
                    progress_bytes=(offs[k + 1] if k + 1 < KAGGLE_DAYS else st.st_size) - offs[k]
                    if not gz
                    else st.st_size // KAGGLE_DAYS,
                )
            )
    else:
        for d, path in zip(days, inputs):
            jobs.append(
                dict(path=path, day=d, start_byte=0, start_line=1, max_lines=None, progress_bytes=os.path.getsize(path))
            )
    return jobs


def _parse_jobs(
    jobs: List[Dict[str, Any]], out: str, table_rows: Sequence[int], block_bytes: int
) -> List[Dict[str, Any]]:
    """:func:`dlrm.data.preprocess_passes.parse_day`'s job for each of :func:`_day_jobs`' days, with ``expect``:
    the inputs its marker records (a re-run skips the day when they match)."""
    full = []
    for j in jobs:
        st = os.stat(j["path"])
        expect = dict(
            version=fmt.VERSION,
            path=os.path.abspath(j["path"]),
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
            start_line=j["start_line"],
            max_lines=j["max_lines"],
            table_rows=[int(r) for r in table_rows],
            progress_bytes=j["progress_bytes"],
        )
        full.append(dict(j, root=out, table_rows=list(table_rows), block_bytes=block_bytes, expect=expect))
    return full


def _day_job(root: str, day: int, rows: int, expect: Dict[str, Any], **fields: Any) -> Dict[str, Any]:
    """The job of a day pass after the parse (:mod:`dlrm.data.preprocess_passes`): the dataset ``root``, the
    ``day`` and its ``rows``, what the pass's marker must record for the day to count as done (``expect``), and
    the pass's own ``fields``."""
    return dict(root=root, day=day, rows=rows, expect=expect, **fields)


def _dataset_meta(
    layout: str,
    table_rows: Sequence[int],
    transform: str,
    m: int,
    m_src: str,
    keep_raw: bool,
    jobs: List[Dict[str, Any]],
    parsed: List[Dict[str, Any]],
    dense: List[Dict[str, Any]],
) -> Dict[str, Any]:
    """The ``meta.json`` content of a dataset whose days ``jobs`` went through the parse (``parsed``) and dense
    (``dense``) passes, with the dense transform's ``m`` and where it came from (``m_src``)."""
    return {
        "format": fmt.FORMAT,
        "version": fmt.VERSION,
        "layout": layout,
        "table_rows": [int(r) for r in table_rows],
        "dense_transform": transform,
        "dense_transform_formula": "log(x - m + 2), missing x = 0"
        if transform == "mlperf"
        else "log(max(x, 0) + 1), missing x = 0",
        "dense_min": m if transform == "mlperf" else None,
        "dense_min_source": m_src if transform == "mlperf" else None,
        "train_dense_min": min(r["dense_min"] for r in parsed[:-1]),
        "splits": "train = all days but the last; val = first ceil(N/2) rows of the last day; test = the rest",
        "days": [
            {
                "day": j["day"],
                "rows": r["rows"],
                "positives": r["positives"],
                "dense_min": r["dense_min"],
                "source": {"path": r["path"], "first_line": r["start_line"]},
                "files": {k: v for k, v in {**r["files"], **dd["files"]}.items() if "dense_raw" not in k or keep_raw},
            }
            for j, r, dd in zip(jobs, parsed, dense)
        ],
        "multi_hot": None,
    }


def _carry_multi_hot(out: str, meta: Dict[str, Any]) -> None:
    """Keep the multi-hot record of the ``meta.json`` that ``meta`` replaces only if it was built for the same
    days, table sizes and 1-hot files (sha256 of every ``day_{d}_sparse.npy``): bags expanded from other ids would
    train on the wrong rows without an error. Otherwise the record is dropped and the materialized days whose 1-hot
    file or table sizes changed are deleted; unchanged days keep theirs, which ``multihot`` then reuses."""
    try:
        with open(os.path.join(out, fmt.META), encoding="utf-8") as f:
            prev = json.load(f)
        prev_mh = prev.get("multi_hot")
        prev_days = {pd["day"]: pd["files"] for pd in prev["days"]}
        same_rows = prev.get("table_rows") == meta["table_rows"]
        sha = {d["day"]: d["files"][f"day_{d['day']}_sparse.npy"] for d in meta["days"]}
        stale = [
            day for day, s in sha.items() if not same_rows or prev_days.get(day, {}).get(f"day_{day}_sparse.npy") != s
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return  # none, or unreadable: no record to carry (day_*.multihot.json markers guard leftover files)
    if not prev_mh:
        return
    if not stale and list(prev_days) == list(sha):
        meta["multi_hot"] = prev_mh
        for d in meta["days"]:
            d["files"].update({k: v for k, v in prev_days[d["day"]].items() if "multi_hot" in k})
        return
    for day in stale:
        for path in (fmt.day_file(out, day, "sparse_multi_hot"), marker_path(out, day, "multihot")):
            if os.path.isfile(path):
                os.remove(path)


def multihot(*, out: str, sizes: Sequence[int], seed: int, materialize: bool, workers: int) -> Dict[str, Any]:
    """Build the expansion tables under ``multi_hot_tables/`` and (``materialize``) every day's
    ``day_{d}_sparse_multi_hot.npy``; record them in ``meta.json``.

    Raises:
        BinaryFormatError: ``out`` holds no usable ``meta.json`` (:func:`dlrm.data.binary_format.read_dataset_meta`),
            a day's 1-hot file is missing or truncated, an id is outside its table, or the expansion tables on disk
            are damaged (:func:`dlrm.data.multihot.load_tables`).
    """
    meta = fmt.read_dataset_meta(out, "--out")
    rows = meta["table_rows"]
    tdir = os.path.join(out, mh_mod.TABLES_DIR)
    if mh_mod.load_tables(tdir, rows, sizes, seed) is None:
        mh_mod.build_tables(rows, sizes, seed, out_dir=tdir, progress=True)
    mat = None
    if materialize:
        expect = dict(sizes=list(sizes), seed=seed, table_rows=[int(r) for r in rows])
        jobs = [
            _day_job(
                out,
                d["day"],
                d["rows"],
                dict(expect, sparse_sha=d["files"][f"day_{d['day']}_sparse.npy"]),
                table_rows=rows,
            )
            for d in meta["days"]
        ]
        mat = run_jobs(multihot_day, jobs, workers, "multi-hot")
    for i, d in enumerate(meta["days"]):
        d["files"] = {k: v for k, v in d["files"].items() if "multi_hot" not in k}
        if mat:
            d["files"].update(mat[i]["files"])
    meta["multi_hot"] = {
        "sizes": list(sizes),
        "seed": seed,
        "distribution": "uniform",
        "tables": True,
        "materialized": materialize,
    }
    fmt.write_meta(out, meta)
    return meta


def verify(out: str) -> List[str]:
    """Recompute every sha256 in ``meta.json``; returns the mismatching or missing files (empty: all good).

    Raises:
        BinaryFormatError: ``out`` holds no usable ``meta.json`` (:func:`dlrm.data.binary_format.read_dataset_meta`).
    """
    meta = fmt.read_dataset_meta(out, "--out")
    bad = []
    for d in meta["days"]:
        for name, sha in d["files"].items():
            p = os.path.join(out, name)
            if not os.path.isfile(p) or fmt.sha256_file(p) != sha:
                bad.append(p)
    return bad
