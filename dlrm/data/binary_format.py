"""The preprocessed Criteo binary format (``data=criteo_binary``): its layout, metadata, writer and errors.

On-disk layout (one directory; MLPerf / torchrec ``tsv_to_npys`` per-day files, readable by ``np.load``)::

    meta.json                         format, days and rows, table sizes, dense transform and its m, splits, sha256s
    day_{d}_dense.npy                 float32 [N_d, 13]  transformed dense features
    day_{d}_sparse.npy                int32   [N_d, 26]  1-hot ids, already hashed: 0 <= id < table_rows[t]
    day_{d}_labels.npy                int32   [N_d, 1]   0 or 1
    day_{d}_sparse_multi_hot.npy      int32   [N_d * 214] optional materialized multi-hot, feature-major per day:
                                      table t's [N_d, m_t] block starts at N_d * sum(m_0..m_{t-1})
    multi_hot_tables/table_XX.npy     int32   [rows_t, m_t] optional expansion tables for on-the-fly multi-hot

Splits (MLPerf, torchrec ``InMemoryBinaryCriteoIterDataPipe``): the last day in ``meta.json`` is the evaluation
day (MLPerf: day 23); train = every other day (days 0-22), validation = its first ``ceil(N/2)`` rows, test = the
rest (89,137,319 validation samples for day 23).

This module writes and checks the files (:class:`NpyWriter`, :func:`open_npy`, :func:`read_dataset_meta`,
:func:`write_meta`, :func:`write_dataset`); :mod:`dlrm.data.binary` reads batches from them and
``data/preprocess_criteo.py`` (:mod:`dlrm.data.preprocess`) builds them from the raw logs. Bad files raise
:class:`BinaryFormatError` naming the file and row.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dlrm.errors import InputError

FORMAT = "dlrm-criteo-binary"
VERSION = 1
NUM_DENSE = 13
NUM_SPARSE = 26
META = "meta.json"
HEADER_BYTES = 128  # fixed .npy header size, so a streamed file's header can be rewritten in place


class BinaryFormatError(InputError):
    """A preprocessed dataset is missing, inconsistent or corrupt; the message names the file, row and fix."""


def day_file(root: str, day: int, kind: str) -> str:
    """Path of ``day_{day}_{kind}.npy`` (kind: dense, sparse, labels, sparse_multi_hot, dense_raw)."""
    return os.path.join(root, f"day_{day}_{kind}.npy")


# which pass of data/preprocess_criteo.py writes a day file, i.e. the marker (``day_{d}.{pass}.json``) that makes
# a re-run skip it
_PASS_OF = {
    "dense": "dense",
    "sparse": "parse",
    "labels": "parse",
    "dense_raw": "parse",
    "sparse_multi_hot": "multihot",
}


def redo_hint(path: str) -> str:
    """How to rebuild the day file at ``path``: the re-run skips a day whose marker is present, so name the marker
    to delete first (falls back to a plain re-run for names outside the ``day_{d}_{kind}.npy`` pattern)."""
    m = re.fullmatch(r"day_(\d+)_(\w+)\.npy", os.path.basename(path))
    if not m or m.group(2) not in _PASS_OF:
        return "re-run data/preprocess_criteo.py"
    marker = os.path.join(os.path.dirname(path), f"day_{m.group(1)}.{_PASS_OF[m.group(2)]}.json")
    cmd = (
        "data/preprocess_criteo.py multihot --mode materialize"
        if m.group(2) == "sparse_multi_hot"
        else ("data/preprocess_criteo.py")
    )
    return f"delete {marker} and re-run {cmd} (it redoes only that pass of day {m.group(1)})"


# ------------------------------------------------------------------------------------------- .npy streaming
def _header(dtype: np.dtype, shape: Tuple[int, ...]) -> bytes:
    d = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    body = repr(d).encode("latin1")
    pad = HEADER_BYTES - 10 - len(body) - 1
    if pad < 0:
        raise ValueError(f"shape {shape} does not fit a {HEADER_BYTES}-byte .npy header")
    return b"\x93NUMPY\x01\x00" + (HEADER_BYTES - 10).to_bytes(2, "little") + body + b" " * pad + b"\n"


class NpyWriter:
    """Append rows to a ``.npy`` file whose row count is unknown until the end (bounded memory).

    Writes ``path + '.partial'`` with a placeholder header; :meth:`close` rewrites the header with the real row
    count and returns it. The caller renames the file once the whole day is done (resumability).
    """

    def __init__(self, path: str, dtype: Any, cols: Optional[int]) -> None:
        self.path, self.dtype, self.cols, self.rows = path, np.dtype(dtype), cols, 0
        self.f = open(path + ".partial", "wb")
        self.f.write(_header(self.dtype, (0,) if cols is None else (0, cols)))

    def append(self, arr: np.ndarray) -> None:
        """Write the rows of ``arr`` (``[n, cols]``, or ``[n]`` when ``cols`` is None; not checked), converted to
        the writer's dtype in C order."""
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        self.f.write(arr.data)
        self.rows += arr.shape[0]

    def close(self) -> int:
        """Rewrite the header with the row count, close the file (still ``path + '.partial'``) and return the
        count."""
        self.f.seek(0)
        self.f.write(_header(self.dtype, (self.rows,) if self.cols is None else (self.rows, self.cols)))
        self.f.close()
        return self.rows


def sha256_file(path: str) -> str:
    """Hex SHA-256 of the file at ``path``, read in 16 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 24)
            if not b:
                return h.hexdigest()
            h.update(b)


def open_npy(path: str, dtype: Any, cols: Optional[int], rows: Optional[int] = None) -> np.ndarray:
    """Memory-map a ``.npy`` file after checking dtype, columns, row count and that the file is complete.

    Raises:
        BinaryFormatError: missing file, wrong dtype/shape, truncated data (names the first incomplete row), or a
            row count other than ``rows``.
    """
    if not os.path.isfile(path):
        raise BinaryFormatError(f"{path}: missing; {redo_hint(path)}")
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            shape, fortran, dt = (
                np.lib.format.read_array_header_1_0(f) if version == (1, 0) else np.lib.format.read_array_header_2_0(f)
            )
        except ValueError as e:
            raise BinaryFormatError(f"{path}: not a .npy file ({e}); {redo_hint(path)}") from None
        offset = f.tell()
    want = (cols,) if cols is not None else ()
    if dt != np.dtype(dtype) or fortran or tuple(shape[1:]) != want:
        raise BinaryFormatError(
            f"{path}: {dt} {shape}, expected {np.dtype(dtype)} [N{', ' + str(cols) if cols else ''}]"
            "; the file is not from data/preprocess_criteo.py"
        )
    row_bytes = dt.itemsize * (cols or 1)
    have = os.path.getsize(path) - offset
    if have < shape[0] * row_bytes:
        raise BinaryFormatError(
            f"{path}: truncated: {have} data bytes for {shape[0]} rows of {row_bytes} bytes; row {have // row_bytes} "
            f"is the first incomplete one: {redo_hint(path)}"
        )
    if rows is not None and shape[0] != rows:
        raise BinaryFormatError(
            f"{path}: {shape[0]} rows, but {META} and the other files of this day have {rows}; "
            f"the day's files come from different runs: {redo_hint(path)}"
        )
    if shape[0] == 0:
        return np.zeros(shape, dtype=dt)
    return np.memmap(path, dtype=dt, mode="r", offset=offset, shape=tuple(shape))


# -------------------------------------------------------------------------------------------------- meta
def read_dataset_meta(root: str, config_key: str = "data.dataset_dir") -> Dict[str, Any]:
    """The dataset's ``meta.json``; ``config_key`` is what named ``root``: a config key, or a command-line flag
    (``--out``).

    Raises:
        BinaryFormatError: ``root`` is not a directory, has no ``meta.json``, or one that is not JSON, not of this
            format and version, or lacks a key the loader reads (``days``: a non-empty list of ``{day, rows,
            files}``; ``table_rows``: 26 positive ints; ``multi_hot``: null or ``{sizes, seed, materialized}``).
    """
    path = os.path.join(root, META)
    flag = config_key.startswith("-")
    where, give = (config_key, f"{config_key} ") if flag else (f"config key `{config_key}`", f"{config_key}=")
    if os.path.isfile(root):
        fix = (os.path.dirname(root) or ".") if os.path.basename(root) == META else "<the directory holding meta.json>"
        raise BinaryFormatError(f"{where}: {root!r} is a file, not a directory; pass {give}{fix}")
    if not os.path.isdir(root):
        raise BinaryFormatError(
            f"{where}: no such directory {root!r} (cwd {os.getcwd()}); pass "
            f"{give}<the directory data/preprocess_criteo.py wrote, holding meta.json>"
        )
    if not os.path.isfile(path):
        raise BinaryFormatError(
            f"{where}: {root!r} has no {META}; build the dataset with "
            "`python data/preprocess_criteo.py --layout terabyte --input-dir <day files> "
            f"--out {root}`"
        )
    with open(path, encoding="utf-8") as f:
        try:
            meta = json.load(f)
        except ValueError as e:
            raise BinaryFormatError(
                f"{path}: not valid JSON ({e}); re-run data/preprocess_criteo.py to rewrite it"
            ) from None
    if not isinstance(meta, dict):
        meta = {}
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise BinaryFormatError(
            f"{path}: format {meta.get('format')!r} v{meta.get('version')}, expected {FORMAT!r} "
            f"v{VERSION}; rebuild with data/preprocess_criteo.py"
        )
    bad = _malformed_key(meta)
    if bad is not None:
        raise BinaryFormatError(
            f"{path}: key `{bad}` is missing or malformed; re-run data/preprocess_criteo.py --out {root} with the "
            "arguments that built it (finished days are kept, meta.json is written again)"
        )
    return meta


def _is_count(x: Any, least: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= least


def _malformed_key(meta: Dict[str, Any]) -> Optional[str]:
    """The first key of a ``meta.json`` that the loader reads and that is missing or of the wrong type, or None."""
    days = meta.get("days")
    if not isinstance(days, list) or not days:
        return "days"
    for i, d in enumerate(days):
        if not (isinstance(d, dict) and _is_count(d.get("day"), 0) and _is_count(d.get("rows"), 0)):
            return f"days[{i}]"
        files = d.get("files")
        if not isinstance(files, dict) or any(
            f"day_{d['day']}_{kind}.npy" not in files for kind in ("dense", "sparse", "labels")
        ):
            return f"days[{i}].files"
    rows = meta.get("table_rows")
    if not (isinstance(rows, list) and len(rows) == NUM_SPARSE and all(_is_count(r, 1) for r in rows)):
        return "table_rows"
    if "multi_hot" not in meta:
        return "multi_hot"
    mh = meta["multi_hot"]
    if mh is not None and not (
        isinstance(mh, dict)
        and isinstance(mh.get("sizes"), list)
        and len(mh["sizes"]) == NUM_SPARSE
        and all(_is_count(m, 1) for m in mh["sizes"])
        and _is_count(mh.get("seed"), 0)
        and isinstance(mh.get("materialized"), bool)
    ):
        return "multi_hot"
    return None


def split_ranges(meta: Dict[str, Any], root: str = ".") -> Dict[str, List[Tuple[int, int, int]]]:
    """``{train, val, test}`` -> list of ``(day, first_row, stop_row)``: the last day evaluates (its first
    ``ceil(N/2)`` rows validate, the rest test), every other day trains (MLPerf: days 0-22 / 23).

    Raises:
        BinaryFormatError: ``meta`` (the ``meta.json`` of ``root``) lists fewer than two days.
    """
    days = meta["days"]
    if len(days) < 2:
        raise BinaryFormatError(
            f"{os.path.join(root, META)} lists {len(days)} day(s); the splits need training days and one "
            "evaluation day (the last): preprocess at least two days (e.g. --days 0-1)"
        )
    ev = days[-1]
    half = (ev["rows"] + 1) // 2
    return {
        "train": [(d["day"], 0, d["rows"]) for d in days[:-1]],
        "val": [(ev["day"], 0, half)],
        "test": [(ev["day"], half, ev["rows"])],
    }


def write_dataset(
    root: str,
    days: Sequence[Tuple[np.ndarray, np.ndarray, np.ndarray]],
    table_rows: Sequence[int],
    dense_transform: str = "log1p",
    dense_min: Optional[int] = None,
    first_day: int = 0,
) -> Dict[str, Any]:
    """Write already-transformed arrays as a dataset (tests and ``bench/loader.py``; real data goes through
    ``data/preprocess_criteo.py``). ``days``: ``(dense float32 [N,13], ids int32 [N,26], labels int [N])``."""
    os.makedirs(root, exist_ok=True)
    entries = []
    for i, (dense, ids, labels) in enumerate(days):
        d = first_day + i
        files = {}
        for kind, arr in (
            ("dense", np.asarray(dense, np.float32)),
            ("sparse", np.asarray(ids, np.int32)),
            ("labels", np.asarray(labels, np.int32).reshape(-1, 1)),
        ):
            w = NpyWriter(day_file(root, d, kind), arr.dtype, arr.shape[1])
            for lo in range(0, arr.shape[0], 1 << 20):
                w.append(arr[lo : lo + (1 << 20)])
            w.close()
            os.replace(day_file(root, d, kind) + ".partial", day_file(root, d, kind))
            files[os.path.basename(day_file(root, d, kind))] = sha256_file(day_file(root, d, kind))
        entries.append({"day": d, "rows": int(labels.shape[0]), "files": files})
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "layout": "arrays",
        "days": entries,
        "table_rows": [int(r) for r in table_rows],
        "dense_transform": dense_transform,
        "dense_min": dense_min,
        "multi_hot": None,
    }
    write_meta(root, meta)
    return meta


def write_meta(root: str, meta: Dict[str, Any]) -> None:
    """Write ``meta`` as ``<root>/meta.json`` (indented JSON) through ``meta.json.partial`` and a rename, so a reader
    sees the old file or the new one, never part of one."""
    tmp = os.path.join(root, META + ".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    os.replace(tmp, os.path.join(root, META))


def parse_header_shape(path: str) -> Tuple[int, ...]:
    """Shape in a ``.npy`` header (tests)."""
    with open(path, "rb") as f:
        f.read(10)
        return tuple(ast.literal_eval(f.read(HEADER_BYTES - 10).decode("latin1").strip())["shape"])
