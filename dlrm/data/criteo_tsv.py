"""Reader for raw Criteo TSV click logs (Kaggle ``train.txt`` and the 1TB ``day_N`` files).

A line is ``label \\t I1 .. I13 \\t C1 .. C26`` (40 fields): ``label`` 0/1, ``I*`` integer counts (may be negative,
e.g. -1), ``C*`` 32-bit category hashes written as hex. An empty field is a missing value.

Transforms (original DLRM convention, facebookresearch/dlrm ``data_utils.py``): integer features that are missing
or negative become 0, then ``log(x + 1)``; a categorical hex value becomes ``int(hex, 16) % rows`` of its table
(missing: 0), as torchrec's Criteo preprocessing maps hashes into each table.

Files may be gzip-compressed (recognised by the gzip magic bytes ``1f 8b``, whatever the name: ``train.txt.gz``,
``day_0.gz``); :func:`open_input` opens both kinds, for this reader, ``data/check_tsv.py`` and
``data/preprocess_criteo.py``.

Bad input raises :class:`TsvFormatError` naming the file and the 1-based line number.

:func:`load_criteo_tsv` is the ``data=criteo_tsv`` source: the splits of ``data.train_path``, ``data.val_path`` and
``data.test_path`` as :class:`dlrm.data.in_memory.Split` objects.

Check a file by hand::

    python data/check_tsv.py /path/to/train.txt
"""

from __future__ import annotations

import gzip
import os
import re
import sys
import zlib
from dataclasses import dataclass
from typing import IO, List, Optional, Sequence, Tuple

import numpy as np
import torch

from dlrm.config import DataConfig
from dlrm.data.in_memory import Split
from dlrm.errors import ConfigError, InputError

NUM_INT = 13
NUM_CAT = 26
NUM_FIELDS = 1 + NUM_INT + NUM_CAT
GZIP_MAGIC = b"\x1f\x8b"
# other compressors' magic bytes: open_input names them rather than parse their bytes as text
COMPRESSED = ((b"\xfd7zXZ\x00", "xz"), (b"BZh", "bzip2"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"PK\x03\x04", "zip"))
# Criteo syntax, checked before int(): Python's int() also takes spaces, '+', '_' separators, '0x' and non-ASCII
# digits, which no Criteo file holds. Leading zeros are fine: a hex value of any length must still fit 32 bits.
_INT_FIELD = re.compile(r"-?[0-9]+", re.ASCII)
_HEX_FIELD = re.compile(r"[0-9a-fA-F]+", re.ASCII)
# The reader turns integer features into float64 (log1p): a count of more digits than the largest float64
# (1.8e308, 309 digits) cannot be one, and Python's int() refuses more than 4300 digits outright; no real Criteo
# count comes near either, so such a field is a corrupt line.
_MAX_FLOAT_INT = int(sys.float_info.max)


class TsvFormatError(InputError):
    """A Criteo TSV file is malformed; the message names the file, the line and the fix."""


def is_gzip(path: str) -> bool:
    """Whether ``path`` starts with the gzip magic bytes ``1f 8b``."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_input(path: str) -> Tuple[IO[bytes], IO[bytes], bool]:
    """Open a plain or gzip-compressed file for reading bytes.

    gzip is recognised by the magic bytes ``1f 8b`` at the start of the file, whatever its name.

    Raises:
        TsvFormatError: the file starts with another compressor's magic bytes (:data:`COMPRESSED`).

    Returns:
        ``(raw, stream, is_gzip)``: ``raw`` is the file on disk (its ``tell()`` counts the bytes read from disk),
        ``stream`` yields the decompressed bytes (``raw`` itself for a plain file). Close ``stream``, then ``raw``.
    """
    raw = open(path, "rb")
    head = raw.read(6)
    kind = next((k for magic, k in COMPRESSED if head.startswith(magic)), None)
    if kind:
        raw.close()
        raise TsvFormatError(f"{path}: {kind}-compressed; only plain and gzip TSV files are read: decompress it first")
    gz = head[:2] == GZIP_MAGIC
    raw.seek(0)
    return raw, (gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw), gz


def check_file(path: str, config_key: Optional[str] = "data.train_path") -> None:
    """Refuse a ``path`` that is not an existing file, naming ``config_key`` (None: a command-line argument).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        InputError: ``path`` is a directory, or exists but is not a regular file (a pipe, device or socket).
    """
    where = f"config key `{config_key}`: " if config_key else ""
    if os.path.isdir(path):
        if config_key and os.path.isfile(os.path.join(path, "meta.json")):
            fix = (
                "it holds a preprocessed dataset (meta.json): train on it with "
                f"data=criteo_binary data.dataset_dir={path}"
            )
        elif config_key:
            fix = f"pass {config_key}=<a Criteo TSV file in it, plain or gzip>"
        else:
            fix = "pass a Criteo TSV file in it (plain or gzip)"
        raise InputError(f"{where}{path!r} is a directory, not a file; {fix}")
    if not os.path.isfile(path):
        fix = f"pass {config_key}=<path to a Criteo TSV file>" if config_key else "pass a Criteo TSV file"
        if os.path.exists(path):  # a FIFO, a device such as /dev/null, a socket: not a file that can be reread
            raise InputError(f"{where}{path!r} is not a regular file (a pipe, device or socket); {fix}")
        raise FileNotFoundError(f"{where}no such file {path!r} (cwd {os.getcwd()}); {fix}")


def count_rows(path: str) -> int:
    """Non-blank lines of a plain or gzip file (:func:`open_input`): its rows, unparsed."""
    raw, f, _ = open_input(path)
    try:
        return sum(1 for line in f if line.strip())
    finally:
        f.close()
        raw.close()


@dataclass
class RawRows:
    """Parsed rows before any model-dependent mapping.

    Attributes:
        labels: int8 ``[N]``, 0 or 1.
        ints: float32 ``[N, 13]``, ``log(max(x, 0) + 1)`` with missing values as 0.
        cats: int64 ``[N, 26]``, the 32-bit category hash (missing: 0).
    """

    labels: np.ndarray
    ints: np.ndarray
    cats: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def decode_line(data: bytes, path: str, lineno: int) -> str:
    """One raw TSV line as text, without its line end.

    Raises:
        TsvFormatError: the bytes are not UTF-8, naming ``path:lineno``.
    """
    try:
        return data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise TsvFormatError(
            f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start}); the file is corrupt or not a Criteo TSV"
        ) from None


def read_tsv(path: str, max_rows: Optional[int] = None, config_key: Optional[str] = "data.train_path") -> RawRows:
    """Parse a Criteo TSV file, plain or gzip-compressed (:func:`open_input`).

    Args:
        path: the file.
        max_rows: stop after this many rows (None: all).
        config_key: the config key that named ``path``, quoted when it is not a file (None: a command-line
            argument).

    Raises:
        FileNotFoundError: ``path`` does not exist (the message names ``config_key``).
        InputError: ``path`` is a directory (the message names ``config_key``).
        TsvFormatError: empty file, wrong field count, non-numeric integer feature, label other than 0/1,
            categorical value that is not 32-bit hex, bytes that are not UTF-8 text, a truncated or corrupt gzip
            stream; the message names ``path`` and the line number.
    """
    check_file(path, config_key)
    labels: List[int] = []
    ints = []
    cats = []
    blank_at = 0
    lineno = 0
    raw, f, gz = open_input(path)
    try:
        for lineno, data in enumerate(f, start=1):
            if max_rows is not None and len(labels) >= max_rows:
                break
            line = decode_line(data, path, lineno)
            if not line:
                blank_at = blank_at or lineno  # blank lines are fine only at the end of the file
                continue
            if blank_at:
                raise TsvFormatError(
                    f"{path}:{blank_at}: blank line before more rows; every line needs "
                    f"{NUM_FIELDS} tab-separated fields (label, I1..I13, C1..C26): delete it"
                )
            label, row_i, row_c = parse_line(line, path, lineno)
            labels.append(label)
            ints.append([x if x > 0 else 0 for x in row_i])
            cats.append(row_c)
    except (EOFError, OSError, zlib.error) as e:
        if not gz:
            raise
        raise TsvFormatError(
            f"{path}: truncated or corrupt gzip stream after line {lineno} ({e}); download the file again"
        ) from None
    finally:
        f.close()
        raw.close()
    if not labels:
        raise TsvFormatError(f"{path}: empty file, no rows; expected lines of {NUM_FIELDS} tab-separated fields")
    ints_arr = np.log1p(np.asarray(ints, dtype=np.float64)).astype(np.float32)
    return RawRows(
        labels=np.asarray(labels, dtype=np.int8),
        ints=ints_arr.reshape(-1, NUM_INT),
        cats=np.asarray(cats, dtype=np.int64).reshape(-1, NUM_CAT),
    )


def parse_line(line: str, path: str, lineno: int) -> Tuple[int, List[int], List[int]]:
    """Parse one non-blank line (without its line break) by the rules of :func:`read_tsv`.

    Returns:
        ``(label, ints, cats)``: label 0/1; the 13 integer features as written (negatives kept, missing: 0);
        the 26 category hashes (missing: 0).

    Raises:
        TsvFormatError: wrong field count, label other than 0/1, non-integer ``I*`` or one too large for a
            float64, ``C*`` not 32-bit hex; the message names ``path:lineno``.
    """
    fields = line.split("\t")
    if len(fields) != NUM_FIELDS:
        raise TsvFormatError(
            f"{path}:{lineno}: {len(fields)} tab-separated fields, expected {NUM_FIELDS} "
            "(label, I1..I13, C1..C26; missing values are empty fields, not absent ones)"
        )
    lab = fields[0]
    if lab not in ("0", "1"):
        if lineno == 1 and lab.startswith("\ufeff"):
            raise TsvFormatError(f"{path}:1: the file starts with a UTF-8 byte-order mark; save it without one")
        raise TsvFormatError(f"{path}:{lineno}: label {lab!r} is not 0 or 1 (first field)")
    row_i = []
    for j in range(NUM_INT):
        v = fields[1 + j]
        if v == "":
            row_i.append(0)
            continue
        if not _INT_FIELD.fullmatch(v):
            raise TsvFormatError(
                f"{path}:{lineno}: integer feature I{j + 1} is {v!r}, not an integer "
                "(decimal digits with an optional '-'; leave the field empty for a missing value)"
            )
        digits = v.lstrip("-").lstrip("0")
        if len(digits) > len(str(_MAX_FLOAT_INT)) or int(digits or "0") > _MAX_FLOAT_INT:
            raise TsvFormatError(
                f"{path}:{lineno}: integer feature I{j + 1} has {len(digits)} digits, too large for a float "
                f"(at most 1.8e308); Criteo counts are small integers: the line is corrupt, fix or delete it"
            )
        row_i.append(int(v))
    row_c = []
    for j in range(NUM_CAT):
        v = fields[1 + NUM_INT + j]
        if v == "":
            row_c.append(0)
            continue
        c = int(v, 16) if _HEX_FIELD.fullmatch(v) else -1
        if not 0 <= c < 2**32:
            raise TsvFormatError(
                f"{path}:{lineno}: categorical feature C{j + 1} is {v!r}, not a 32-bit "
                "hex value (leave the field empty for a missing value)"
            )
        row_c.append(c)
    return (1 if lab == "1" else 0), row_i, row_c


def hash_to_rows(cats: np.ndarray, table_rows: Sequence[int]) -> np.ndarray:
    """Map 32-bit category hashes into each table's rows: ``cats[:, t] % table_rows[t]``.

    Args:
        cats: int64 ``[N, 26]``.
        table_rows: rows of each of the 26 tables.

    Returns:
        int64 ``[N, 26]`` ids, ``0 <= ids[:, t] < table_rows[t]``.
    """
    rows = np.asarray(table_rows, dtype=np.int64)
    if cats.shape[1] != rows.shape[0]:
        raise ValueError(f"{cats.shape[1]} categorical columns but {rows.shape[0]} tables")
    return cats % rows[None, :]


# ---------------------------------------------------------------------------------------------------------
# data=criteo_tsv


def _split_from_raw(raw: RawRows, table_rows: Sequence[int], name: str, source: str) -> Split:
    return Split(
        dense=torch.from_numpy(raw.ints),
        ids=torch.from_numpy(hash_to_rows(raw.cats, table_rows)),
        labels=torch.from_numpy(raw.labels.astype(np.float32)),
        name=name,
        source=source,
    )


def held_out_rows(max_rows: int, val_fraction: float) -> int:
    """Validation rows beside ``max_rows`` training rows of one TSV file (``data.max_rows`` without
    ``data.val_path``): ``max(1, round(max_rows * val_fraction / (1 - val_fraction)))``, so that the rows read
    split ``1 - val_fraction : val_fraction`` as they do without a cap."""
    return max(1, int(round(max_rows * val_fraction / (1.0 - val_fraction))))


def load_criteo_tsv(cfg: DataConfig, table_rows: Sequence[int]) -> Tuple[Split, Split, Optional[Split]]:
    """Train, validation and (optional) test splits: ``data.train_path`` and ``data.val_path`` (or the last
    ``data.val_fraction`` of the training rows), and ``data.test_path``.

    ``data.max_rows`` caps the training rows at the first ``max_rows`` rows of ``data.train_path``, as
    ``data=criteo_binary`` caps its training days. Without ``data.val_path``, the :func:`held_out_rows` rows
    after them validate; when the file holds fewer rows than the two together it is split by
    ``data.val_fraction`` as without a cap (at most ``max_rows`` training rows either way). ``data.val_path`` and
    ``data.test_path`` are read whole.

    Every path is checked (an existing file, not a directory) before the first one is parsed.

    Raises:
        FileNotFoundError: a ``data.*_path`` does not exist (the message names the key).
        InputError: a ``data.*_path`` is a directory.
        TsvFormatError: a malformed file (names the file and line).
        ConfigError: without ``data.val_path``, too few rows to hold out ``data.val_fraction`` of them.
    """
    assert cfg.train_path
    for key in ("train_path", "val_path", "test_path"):
        if getattr(cfg, key):
            check_file(getattr(cfg, key), f"data.{key}")
    cap = cfg.max_rows
    n_val_cap = held_out_rows(cap, cfg.val_fraction) if cap is not None and not cfg.val_path else 0
    read_rows = None if cap is None else cap + n_val_cap
    raw = read_tsv(cfg.train_path, max_rows=read_rows, config_key="data.train_path")
    train = _split_from_raw(raw, table_rows, "train", cfg.train_path)
    test = (
        _split_from_raw(read_tsv(cfg.test_path, config_key="data.test_path"), table_rows, "test", cfg.test_path)
        if cfg.test_path
        else None
    )
    if cfg.val_path:
        val = _split_from_raw(read_tsv(cfg.val_path, config_key="data.val_path"), table_rows, "val", cfg.val_path)
        return train, val, test
    if cap is not None and len(train) == read_rows:
        n_train = cap
    else:
        n_train = int(round(len(train) * (1.0 - cfg.val_fraction)))
        if cap is not None:
            n_train = min(n_train, cap)
    if n_train == 0 or n_train == len(train):
        raise ConfigError(
            f"config key `data.train_path`: {cfg.train_path!r} has {len(train)} rows: too few to hold out "
            f"data.val_fraction={cfg.val_fraction}; give data.val_path or more rows"
        )
    return train.rows(0, n_train, "train"), train.rows(n_train, len(train), "val"), test
