"""The passes of the Criteo TSV to binary conversion (:mod:`dlrm.data.preprocess` drives them, one job per day).

* Parsing: :func:`iter_blocks` reads a file in blocks cut at line ends (plain or gzip); :func:`parse_block` parses
  one block vectorised in numpy, :func:`parse_block_slow` line by line with the ``data=criteo_tsv`` rules
  (:func:`dlrm.data.criteo_tsv.parse_line`) where the block holds anything unusual.
* Day passes, each run in a worker process by :func:`run_jobs`: :func:`parse_day` (TSV to 1-hot ids, raw dense
  counts and labels), :func:`dense_day` (the dense transform, :func:`transform_dense`) and :func:`multihot_day`
  (materialized multi-hot). Each writes its files through ``.partial`` names and leaves a marker
  (:func:`marker_path`) holding its inputs and outputs, so that a re-run skips the days already done.

Bad input raises :class:`PreprocessError` (or ``TsvFormatError``) naming the file and line.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dlrm.data import binary_format as fmt
from dlrm.data import multihot as mh_mod
from dlrm.data.criteo_tsv import (
    NUM_CAT,
    NUM_FIELDS,
    NUM_INT,
    TsvFormatError,
    decode_line,
    open_input,
    parse_line,
)
from dlrm.errors import InputError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i


class PreprocessError(InputError):
    """Input the preprocessing cannot use; the message names the flag or file (and line) and the fix
    (``data/preprocess_criteo.py`` prints it as one ``error:`` line, exit status 2)."""


# ------------------------------------------------------------------------------------------------ parsing
def parse_block(buf: bytes) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Parse ``'\\n'``-terminated lines without a per-line Python loop.

    Returns:
        ``(labels int32 [L], ints int32 [L, 13] (raw, missing 0), cats int64 [L, 26] (missing 0))``, or None when
        a line has anything the fast path does not handle (the caller re-parses those lines one by one, which
        either accepts them under the ``criteo_tsv`` rules or raises with the line number).
    """
    a = np.frombuffer(buf, dtype=np.uint8)
    seps = np.flatnonzero((a == 9) | (a == 10))
    if seps.size == 0 or seps.size % NUM_FIELDS:
        return None
    n_lines = seps.size // NUM_FIELDS
    is_nl = a[seps] == 10
    if int(is_nl.sum()) != n_lines or not is_nl[NUM_FIELDS - 1 :: NUM_FIELDS].all():
        return None
    ends = seps.reshape(n_lines, NUM_FIELDS)
    starts = np.empty_like(ends)
    starts[:, 1:] = ends[:, :-1] + 1
    starts[0, 0] = 0
    starts[1:, 0] = ends[:-1, -1] + 1
    lens = ends - starts
    if not (lens[:, 0] == 1).all():
        return None
    lab = a[starts[:, 0]]
    if not ((lab == 48) | (lab == 49)).all():
        return None
    last = a.size - 1
    # integers: optional '-', then up to 18 decimal digits (Horner over the digit position)
    s, ln = starts[:, 1 : 1 + NUM_INT], lens[:, 1 : 1 + NUM_INT]
    neg = (ln > 0) & (a[np.minimum(s, last)] == 45)
    ds, dl = s + neg, ln - neg
    if (neg & (dl == 0)).any() or dl.max() > 18:
        return None
    ints = np.zeros(s.shape, dtype=np.int64)
    for k in range(int(dl.max())):
        use = k < dl
        d = a[np.minimum(ds + k, last)].astype(np.int64) - 48
        if ((d < 0) | (d > 9))[use].any():
            return None
        ints = np.where(use, ints * 10 + d, ints)
    ints = np.where(neg, -ints, ints)
    if ints.min() < INT32_MIN or ints.max() > INT32_MAX:
        return None
    # categories: up to 8 hex digits
    s, ln = starts[:, 1 + NUM_INT :], lens[:, 1 + NUM_INT :]
    if ln.max() > 8:
        return None
    cats = np.zeros(s.shape, dtype=np.int64)
    for k in range(int(ln.max())):
        use = k < ln
        h = _HEX[a[np.minimum(s + k, last)]].astype(np.int64)
        if (h[use] == 255).any():
            return None
        cats = np.where(use, (cats << 4) | h, cats)
    return lab.astype(np.int32) - 48, ints.astype(np.int32), cats


def parse_block_slow(
    buf: bytes, path: str, first_line: int, state: Dict[str, int]
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Line-by-line parse of a block with :func:`dlrm.data.criteo_tsv.parse_line` (the ``criteo_tsv`` rules,
    blank lines allowed only at the end of the file), plus the int32 range of the stored dense counts.

    Raises:
        TsvFormatError: naming ``path:line``.
    """
    labels, ints, cats = [], [], []
    for i, raw in enumerate(buf.split(b"\n")[:-1]):
        lineno = first_line + i
        line = decode_line(raw, path, lineno)
        if not line:
            state["blank_at"] = state.get("blank_at") or lineno
            continue
        if state.get("blank_at"):
            raise TsvFormatError(
                f"{path}:{state['blank_at']}: blank line before more rows; every line needs "
                f"{NUM_FIELDS} tab-separated fields (label, I1..I13, C1..C26): delete it"
            )
        lab, row_i, row_c = parse_line(line, path, lineno)
        for j, x in enumerate(row_i):
            if not INT32_MIN <= x <= INT32_MAX:
                raise TsvFormatError(
                    f"{path}:{lineno}: integer feature I{j + 1} is {x}, outside the int32 range "
                    "the binary format stores dense counts in"
                )
        labels.append(lab)
        ints.append(row_i)
        cats.append(row_c)
    return (
        np.asarray(labels, dtype=np.int32),
        np.asarray(ints, dtype=np.int32).reshape(-1, NUM_INT),
        np.asarray(cats, dtype=np.int64).reshape(-1, NUM_CAT),
    )


def iter_blocks(
    path: str, start_byte: int = 0, start_line: int = 1, max_lines: Optional[int] = None, block_bytes: int = 8 << 20
) -> Iterator[Tuple[int, bytes, int]]:
    """Yield ``(first_line, data, compressed_bytes_read)`` with ``data`` whole lines ending in ``'\\n'``.

    Starts at line ``start_line`` (at ``start_byte`` for plain files; gzip streams are decompressed and the
    earlier lines skipped) and stops after ``max_lines`` lines. A last line without ``'\\n'`` is completed.

    Raises:
        PreprocessError: a gzip stream that ends early or is corrupt (names the file and the last whole line).
    """
    raw, f, gz = open_input(path)
    try:
        skip = 0
        if start_byte and not gz:
            f.seek(start_byte)
        elif start_line > 1:
            skip = start_line - 1
        lineno, left, carry, eof = start_line, max_lines, b"", False
        while not eof and (left is None or left > 0):
            try:
                chunk = f.read(block_bytes)
            except (EOFError, OSError, zlib.error) as e:
                whole = lineno - 1 + skip + carry.count(b"\n")
                raise PreprocessError(
                    f"{path}: truncated or corrupt gzip stream after line {whole} ({e}); download the file again"
                ) from None
            if not chunk:
                eof = True
                data, carry = (carry + b"\n" if carry else b""), b""
            else:
                data = carry + chunk
                cut = data.rfind(b"\n") + 1
                data, carry = data[:cut], data[cut:]
            if not data:
                continue
            if skip:
                nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
                if nl.size <= skip:
                    skip -= nl.size
                    continue
                data, skip = data[nl[skip - 1] + 1 :], 0
            if left is not None:
                nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
                if nl.size > left:
                    data = data[: nl[left - 1] + 1]
                left -= min(left, nl.size)
            yield lineno, data, raw.tell()
            lineno += data.count(b"\n")
    finally:
        f.close()
        raw.close()


# -------------------------------------------------------------------------------------------- day passes
_progress_q: Any = None


def _init_worker(q: Any) -> None:
    global _progress_q
    _progress_q = q


def _report(n: int) -> None:
    if _progress_q is not None and n:
        _progress_q.put(n)


def marker_path(root: str, day: int, kind: str) -> str:
    """Path of the marker ``day_{day}.{kind}.json`` that a finished pass ``kind`` of ``day`` leaves in ``root``."""
    return os.path.join(root, f"day_{day}.{kind}.json")


def _done(root: str, day: int, kind: str, expect: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The marker of a finished pass when it matches ``expect`` and its files are all there, else None."""
    try:
        with open(marker_path(root, day, kind), encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    if any(rec.get(k) != v for k, v in expect.items()):
        return None
    # the raw dense counts are deleted after the dense pass unless --keep-raw-dense; dense_day re-parses if needed
    if not all(os.path.isfile(os.path.join(root, name)) for name in rec.get("files", {}) if "dense_raw" not in name):
        return None
    return rec


def _write_marker(root: str, day: int, kind: str, rec: Dict[str, Any]) -> None:
    tmp = marker_path(root, day, kind) + ".partial"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(rec, f, indent=1)
    os.replace(tmp, marker_path(root, day, kind))


def _finish(root: str, day: int, kinds: Sequence[str]) -> Dict[str, str]:
    shas = {}
    for kind in kinds:
        path = fmt.day_file(root, day, kind)
        os.replace(path + ".partial", path)
        shas[os.path.basename(path)] = fmt.sha256_file(path)
    return shas


def parse_day(job: Dict[str, Any]) -> Dict[str, Any]:
    """Pass 1 for one day (see module doc). ``job``: root, day, path, start_byte, start_line, max_lines,
    table_rows, block_bytes, expect (the marker's input fields)."""
    root, day = job["root"], job["day"]
    rec = _done(root, day, "parse", job["expect"])
    if rec is not None:
        _report(job["expect"]["progress_bytes"])
        return rec
    rows = np.asarray(job["table_rows"], dtype=np.int64)
    w_dense = fmt.NpyWriter(fmt.day_file(root, day, "dense_raw"), np.int32, NUM_INT)
    w_sparse = fmt.NpyWriter(fmt.day_file(root, day, "sparse"), np.int32, NUM_CAT)
    w_labels = fmt.NpyWriter(fmt.day_file(root, day, "labels"), np.int32, 1)
    state: Dict[str, int] = {}
    dense_min, positives, done_bytes = 0, 0, 0
    for first, data, pos in iter_blocks(
        job["path"], job["start_byte"], job["start_line"], job["max_lines"], job["block_bytes"]
    ):
        parsed = None if state.get("blank_at") else parse_block(data)
        if parsed is None:
            parsed = parse_block_slow(data, job["path"], first, state)
        labels, ints, cats = parsed
        if labels.size:
            dense_min = min(dense_min, int(ints.min()))
            positives += int(labels.sum())
            w_dense.append(ints)
            w_sparse.append((cats % rows).astype(np.int32))
            w_labels.append(labels.reshape(-1, 1))
        _report(pos - job["start_byte"] - done_bytes)
        done_bytes = pos - job["start_byte"]
    n = w_dense.close()
    w_sparse.close()
    w_labels.close()
    if n == 0 and job["max_lines"]:
        # a Kaggle day: preprocess() counted its lines, so every one of them was blank
        first = job["start_line"]
        raise TsvFormatError(
            f"{job['path']}: lines {first}-{first + job['max_lines'] - 1} (Kaggle day {day}) are all blank; "
            "delete the blank lines"
        )
    if n == 0:
        raise TsvFormatError(
            f"{job['path']}: no rows for day {day}; expected lines of {NUM_FIELDS} tab-separated fields"
        )
    if job["max_lines"] is not None and n < job["max_lines"] and not state.get("blank_at"):
        raise PreprocessError(
            f"{job['path']}: day {day} should have {job['max_lines']} rows from line "
            f"{job['start_line']}, the file ended after {n}; the file changed since it was counted"
        )
    rec = dict(
        job["expect"],
        rows=n,
        positives=positives,
        dense_min=dense_min,
        files=_finish(root, day, ("dense_raw", "sparse", "labels")),
    )
    _write_marker(root, day, "parse", rec)
    return rec


def transform_dense(raw: np.ndarray, transform: str, m: Optional[int]) -> np.ndarray:
    """float32 ``[n, 13]`` from raw int32 counts (missing 0).

    ``mlperf``: ``log(x - m + 2)`` as torchrec ``BinaryCriteoUtils.tsv_to_npys`` computes it (int32 shift, float32
    log), with ``m`` the training-data minimum. ``log1p``: ``log(max(x, 0) + 1)`` in float64, then float32
    (original DLRM; the same values as ``dlrm.data.criteo_tsv.read_tsv``).
    """
    if transform == "mlperf":
        assert m is not None and m <= 0
        return np.log(raw.astype(np.int32) - np.int32(m - 2), dtype=np.float32)
    return np.log1p(np.maximum(raw, 0).astype(np.float64)).astype(np.float32)


def dense_day(job: Dict[str, Any]) -> Dict[str, Any]:
    """Pass 2 for one day: ``day_{d}_dense.npy`` from ``day_{d}_dense_raw.npy``."""
    root, day = job["root"], job["day"]
    rec = _done(root, day, "dense", job["expect"])
    if rec is not None:
        return rec
    if not os.path.isfile(fmt.day_file(root, day, "dense_raw")):  # deleted after an earlier dense pass
        os.remove(marker_path(root, day, "parse"))
        parse_day(job["parse_job"])
    raw = fmt.open_npy(fmt.day_file(root, day, "dense_raw"), np.int32, NUM_INT, job["rows"])
    w = fmt.NpyWriter(fmt.day_file(root, day, "dense"), np.float32, NUM_INT)
    m = job["expect"]["dense_min"]
    for lo in range(0, raw.shape[0], 1 << 20):
        chunk = np.asarray(raw[lo : lo + (1 << 20)])
        if m is not None and chunk.min() < m:
            r, c = (int(x[0]) for x in np.nonzero(chunk < m))
            w.f.close()
            raise PreprocessError(
                f"{job['source']}:{job['start_line'] + lo + r}: integer feature I{c + 1} is {int(chunk[r, c])}, below "
                f"m = {m} (the training days' minimum) of the mlperf transform log(x - m + 2); pass --dense-min "
                f"{int(chunk[r, c])} (or lower) to fix m for all days, or use --dense-transform log1p"
            )
        w.append(transform_dense(chunk, job["expect"]["transform"], m))
    w.close()
    del raw
    rec = dict(job["expect"], files=_finish(root, day, ("dense",)))
    _write_marker(root, day, "dense", rec)
    if not job["keep_raw"]:
        os.remove(fmt.day_file(root, day, "dense_raw"))
    return rec


def multihot_day(job: Dict[str, Any]) -> Dict[str, Any]:
    """Materialize ``day_{d}_sparse_multi_hot.npy`` (feature-major per day, see :mod:`dlrm.data.binary_format`)."""
    root, day = job["root"], job["day"]
    rec = _done(root, day, "multihot", job["expect"])
    if rec is not None:
        return rec
    sizes, rows = job["expect"]["sizes"], job["table_rows"]
    tables = mh_mod.load_tables(os.path.join(root, mh_mod.TABLES_DIR), rows, sizes, job["expect"]["seed"])
    assert tables is not None
    sparse = fmt.open_npy(fmt.day_file(root, day, "sparse"), np.int32, NUM_CAT, job["rows"])
    w = fmt.NpyWriter(fmt.day_file(root, day, "sparse_multi_hot"), np.int32, None)
    chunk = 1 << 18
    for t in range(len(sizes)):
        for lo in range(0, sparse.shape[0], chunk):
            ids = np.ascontiguousarray(sparse[lo : lo + chunk, t])
            if ids.size and (ids.min() < 0 or ids.max() >= rows[t]):
                bad = int(np.flatnonzero((ids < 0) | (ids >= rows[t]))[0])
                raise fmt.BinaryFormatError(
                    f"{fmt.day_file(root, day, 'sparse')}: row {lo + bad} (0-based), feature C{t + 1}: id "
                    f"{int(ids[bad])} is outside table {t}'s {rows[t]} rows; re-run the parse pass for day {day}"
                )
            w.append(ids if tables[t] is None else np.take(tables[t], ids, axis=0).reshape(-1))
    w.close()
    rec = dict(job["expect"], files=_finish(root, day, ("sparse_multi_hot",)))
    _write_marker(root, day, "multihot", rec)
    return rec


def run_jobs(
    fn: Callable[[Dict[str, Any]], Dict[str, Any]],
    jobs: List[Dict[str, Any]],
    workers: int,
    desc: str,
    total_bytes: Optional[int] = None,
) -> List[Dict[str, Any]]:
    """Run ``fn`` over ``jobs`` in ``workers`` processes with a tqdm bar (bytes read, or days done)."""
    from tqdm import tqdm

    bar = tqdm(
        total=total_bytes if total_bytes is not None else len(jobs),
        desc=desc,
        unit="B" if total_bytes is not None else "day",
        unit_scale=total_bytes is not None,
        smoothing=0.05,
    )
    results: Dict[int, Dict[str, Any]] = {}
    ctx = mp.get_context("fork")
    q = ctx.Queue() if total_bytes is not None else None

    def drain() -> None:
        while q is not None:
            try:
                bar.update(q.get_nowait())
            except Exception:  # queue.Empty
                return

    try:
        if workers <= 1:
            _init_worker(q)
            try:
                for i, job in enumerate(jobs):
                    results[i] = fn(job)
                    drain()
                    if total_bytes is None:
                        bar.update(1)
            finally:
                _init_worker(None)
        else:
            with ProcessPoolExecutor(
                max_workers=min(workers, len(jobs)), mp_context=ctx, initializer=_init_worker, initargs=(q,)
            ) as ex:
                futs = {ex.submit(fn, job): i for i, job in enumerate(jobs)}
                pending = set(futs)
                while pending:
                    for f in list(pending):
                        if f.done():
                            pending.discard(f)
                            results[futs[f]] = f.result()  # re-raises a worker's error (file:line message)
                            if total_bytes is None:
                                bar.update(1)
                    drain()
                    time.sleep(0.05)
        drain()
    finally:
        bar.close()  # ends the bar's line, so an error printed next starts one of its own
    return [results[i] for i in range(len(jobs))]
