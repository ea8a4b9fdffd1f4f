"""The memory-mapped loader of the preprocessed Criteo binary format (``data=criteo_binary``).

The format (files, ``meta.json``, the MLPerf split rule) is :mod:`dlrm.data.binary_format`'s.

Loader: every batch is a contiguous row range (rank ``r`` takes the ``r``-th block of global batch ``i``, as
:mod:`dlrm.data` lays out in-memory splits), read from the memory maps with vectorised copies (``np.copyto`` /
``np.take``, which release the GIL) into a pinned buffer (when CUDA is present), then wrapped into a KJT whose
lengths and offsets are constants of the batch size. Materialized multi-hot batches read dense, labels and the
26 multi-hot sections only (each bag already holds the sample's 1-hot id, so the 1-hot file is not read), and
range-check each 1 MB piece of ids right after copying it, while it is in cache. A background thread keeps
``data.prefetch`` batches ready (:mod:`dlrm.data.prefetch`). Why our own loader rather than torchrec's
``InMemoryBinaryCriteoIterDataPipe``: that one loads whole days into RAM (hundreds of GB for 1TB) and builds no
multi-hot.

Bad files raise :class:`~dlrm.data.binary_format.BinaryFormatError` naming the file and row: truncated files, row
counts that differ between dense, sparse and labels, ids at or above their table size (never remapped). Every id a
batch uses is checked when that batch is read (the multi-hot file's ids with materialized multi-hot, the 1-hot
file's otherwise), so a bad id stops training at the first batch holding it.

Benchmark: ``python bench/loader.py --rows 10000000``.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import dlrm.data.multihot as mh_mod
from dlrm.data.binary_format import (
    META,
    NUM_DENSE,
    NUM_SPARSE,
    BinaryFormatError,
    day_file,
    open_npy,
    read_dataset_meta,
    redo_hint,
    split_ranges,
)
from dlrm.data.layout import eval_spans
from dlrm.data.prefetch import expanded, prefetched
from dlrm.data.source import EvalRequest, TrainRequest


# ------------------------------------------------------------------------------------------------- split
@dataclass
class _Piece:
    day: int
    lo: int  # first row in the day file
    n: int  # rows
    start: int  # first row in the split
    dense: np.ndarray
    sparse: np.ndarray
    labels: np.ndarray
    multi_hot: Optional[np.ndarray]
    day_rows: int

    def __post_init__(self) -> None:
        # plain-ndarray uint32 view of the memory map: slicing an np.memmap runs Python code per slice
        self.multi_hot_u32 = None if self.multi_hot is None else self.multi_hot.view(np.ndarray).view(np.uint32)


class BinarySplit:
    """A split of a preprocessed dataset: a concatenation of row ranges of day files, memory-mapped.

    Implements :class:`dlrm.data.source.Source`: its batches are read by a :class:`BatchReader`, :attr:`prefetch`
    of them ahead (``data.prefetch``), in pinned memory per :attr:`pin_memory` (``data.pin_memory``).
    """

    def __init__(
        self,
        root: str,
        meta: Dict[str, Any],
        name: str,
        ranges: Sequence[Tuple[int, int, int]],
        max_rows: Optional[int] = None,
        multi_hot_files: bool = False,
    ) -> None:
        self.root, self.name, self.source = root, name, root
        self.prefetch: int = 2  # loader settings (data.prefetch / data.pin_memory), set by load_splits
        self.pin_memory: Optional[bool] = None
        self.table_rows = np.asarray(meta["table_rows"], dtype=np.int64)
        rows_of = {d["day"]: d["rows"] for d in meta["days"]}
        self.pieces: List[_Piece] = []
        start = 0
        for day, lo, hi in ranges:
            if max_rows is not None:
                hi = min(hi, lo + max_rows - start)
            if hi <= lo:
                continue
            n_day = rows_of[day]
            mh = None
            if multi_hot_files:
                mh = open_npy(
                    day_file(root, day, "sparse_multi_hot"),
                    np.int32,
                    None,
                    n_day * int(sum(meta["multi_hot"]["sizes"])),
                )
            self.pieces.append(
                _Piece(
                    day,
                    lo,
                    hi - lo,
                    start,
                    open_npy(day_file(root, day, "dense"), np.float32, NUM_DENSE, n_day),
                    open_npy(day_file(root, day, "sparse"), np.int32, NUM_SPARSE, n_day),
                    open_npy(day_file(root, day, "labels"), np.int32, 1, n_day),
                    mh,
                    n_day,
                )
            )
            start += hi - lo
        self.n = start
        self._starts = np.asarray([p.start for p in self.pieces], dtype=np.int64)

    def __len__(self) -> int:
        return self.n

    def locate(self, start: int, stop: int) -> List[Tuple[_Piece, int, int, int]]:
        """``(piece, first_row_in_day, rows, offset_in_batch)`` covering split rows ``[start, stop)``."""
        out = []
        i = int(np.searchsorted(self._starts, start, side="right")) - 1
        pos = start
        while pos < stop:
            p = self.pieces[i]
            n = min(stop, p.start + p.n) - pos
            out.append((p, p.lo + pos - p.start, n, pos - start))
            pos += n
            i += 1
        return out

    def describe_rows(self, start: int, stop: int) -> str:
        """Where split rows ``[start, stop)`` are, e.g. ``/data/bin day_3 rows 100-163`` (0-based file rows)."""
        parts = [f"day_{p.day} rows {lo}-{lo + n - 1}" for p, lo, n, _ in self.locate(start, stop)]
        return f"{self.root} " + ", ".join(parts)

    def train_batches(self, req: TrainRequest) -> Iterator[Batch]:
        """:meth:`dlrm.data.source.Source.train_batches`, :attr:`prefetch` batches ahead. Rows are read in file
        order: ``data.shuffle`` is refused for this source at config time (MLPerf: no shuffling), so
        ``req.shuffle`` and ``req.seed`` are unused."""
        reader = BatchReader(self, req.feature_names, req.multi_hot, self.pin_memory)

        def gen() -> Iterator[Batch]:
            step = 0
            for _ in range(req.epochs):
                for start, size in req.plan:
                    if req.max_steps is not None and step >= req.max_steps:
                        return
                    if step >= req.start_step:
                        yield reader.read(start + req.rank * size, start + (req.rank + 1) * size)
                    step += 1

        it = prefetched(gen(), self.prefetch)
        return expanded(reader.expand, it) if reader.on_device else it

    def eval_batches(self, req: EvalRequest) -> Iterator[Tuple[Batch, torch.Tensor]]:
        """:meth:`dlrm.data.source.Source.eval_batches`, :attr:`prefetch` batches ahead."""
        reader = BatchReader(self, req.feature_names, req.multi_hot, self.pin_memory)
        batch_size, spans = eval_spans(len(self), req.batch_size, req.rank, req.world_size)

        def gen() -> Iterator[Tuple[Batch, torch.Tensor]]:
            for start, real in spans:
                weight = torch.zeros(batch_size)
                weight[:real] = 1.0
                if real == 0:
                    yield reader.read(0, 0, pad_to=batch_size), weight
                else:
                    yield reader.read(start, start + real, pad_to=batch_size), weight

        it = prefetched(gen(), self.prefetch)
        if not reader.on_device:
            return it
        return expanded(lambda bw: (reader.expand(bw[0]), bw[1]), it)


# --------------------------------------------------------------------------------------------- multi-hot
class BinaryMultiHot:
    """How a binary split's batches get multi-hot ids.

    ``mode``: ``materialized`` (read ``day_*_sparse_multi_hot.npy``) or ``on_the_fly`` (gather from the MLPerf
    expansion tables: ``multi_hot_tables/`` memory-mapped when present, else built in memory).
    """

    def __init__(
        self,
        mode: str,
        sizes: Sequence[int],
        table_rows: Sequence[int],
        seed: int,
        tables: Optional[List[Optional[np.ndarray]]] = None,
    ) -> None:
        self.mode, self.sizes, self.seed = mode, [int(m) for m in sizes], seed
        self.table_rows = [int(r) for r in table_rows]
        self.tables = tables
        self.device: Optional[torch.device] = None
        self.device_tables: List[Optional[torch.Tensor]] = []

    def to(self, device: torch.device) -> "BinaryMultiHot":
        """Expand on ``device`` (``data.multi_hot_on_device``): copy the on-the-fly expansion tables there (int32
        ``[rows_t, m_t]`` per table with ``m_t > 1``); batches then leave the host with their 1-hot ids and are
        expanded on ``device`` by :meth:`BatchReader.expand`, the same gather as on the host (on a cpu ``device``:
        torch's gather in the consuming thread instead of numpy's in the loader). Materialized multi-hot is
        returned unchanged."""
        if self.mode != "on_the_fly":
            return self
        assert self.tables is not None
        self.device = device
        with warnings.catch_warnings():  # a read-only memory map: the tensor is only read, to copy it
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            self.device_tables = [
                None if t is None else torch.from_numpy(np.ascontiguousarray(t)).to(device) for t in self.tables
            ]
        return self

    def device_nbytes(self) -> int:
        """Bytes of the expansion tables on the device (0 when expanding on the host)."""
        return sum(t.numel() * t.element_size() for t in self.device_tables if t is not None)


def _no_materialized(root: str, which: str, record: Any) -> BinaryFormatError:
    """Materialized multi-hot asked for (``which``: for what sizes and seed) that ``root`` does not have."""
    return BinaryFormatError(
        f"config key `data.multi_hot_source`: {root} has no materialized multi-hot{which} ({META}: "
        f"{record or 'none'}); run `python data/preprocess_criteo.py multihot --out {root} --mode materialize` or "
        "set data.multi_hot_source=on_the_fly"
    )


def reads_materialized(root: str, meta: Dict[str, Any], source: str, sizes: Sequence[int], seed: int) -> bool:
    """Whether ``data.multi_hot_source`` = ``source`` reads the dataset's ``day_*_sparse_multi_hot.npy``:
    ``materialized`` always, ``auto`` when ``meta`` records them for ``sizes`` and ``seed``, ``on_the_fly`` never.

    Raises:
        BinaryFormatError: ``materialized`` asked for but the dataset has none, or built with other sizes/seed.
    """
    if source == "on_the_fly":
        return False
    mat = meta.get("multi_hot") or {}
    have = bool(mat.get("materialized")) and mat.get("sizes") == list(sizes) and mat.get("seed") == seed
    if source == "materialized" and not have:
        raise _no_materialized(root, f" for sizes {list(sizes)} seed {seed}", mat)
    return have


def make_multi_hot(root: str, meta: Dict[str, Any], source: str, sizes: Sequence[int], seed: int) -> BinaryMultiHot:
    """Pick materialized or on-the-fly multi-hot for ``data.multi_hot_source`` (:func:`reads_materialized`).

    Raises:
        BinaryFormatError: ``materialized`` asked for but the dataset has none, or built with other sizes/seed;
            on-the-fly expansion tables that are damaged on disk, or over 16 GiB and not on disk.
    """
    rows = meta["table_rows"]
    if reads_materialized(root, meta, source, sizes, seed):
        return BinaryMultiHot("materialized", sizes, rows, seed)
    tables = mh_mod.load_tables(os.path.join(root, mh_mod.TABLES_DIR), rows, sizes, seed)
    if tables is None:
        need = sum(r * m * 4 for r, m in zip(rows, sizes) if m > 1)
        if need > 16 * 2**30:
            raise BinaryFormatError(
                f"config key `data.multi_hot_source`: on-the-fly multi-hot needs expansion tables of "
                f"{need / 2**30:.1f} GiB; build them on disk once with `python data/preprocess_criteo.py multihot "
                f"--out {root} --mode tables` (memory-mapped afterwards)"
            )
        tables = mh_mod.build_tables(rows, sizes, seed)
    return BinaryMultiHot("on_the_fly", sizes, rows, seed, tables)


# ------------------------------------------------------------------------------------------------ batches
class _Layout:
    """Constant parts of a KJT for batch size ``b``: lengths, offsets, per-key lengths and sections."""

    def __init__(self, b: int, sizes: Sequence[int]) -> None:
        self.b = b
        self.sizes = list(sizes)
        self.length_per_key = [b * m for m in self.sizes]
        self.offset_per_key = [0] + list(np.cumsum(self.length_per_key).tolist())
        lengths = np.repeat(np.asarray(self.sizes, dtype=np.int32), b)
        self.lengths = torch.from_numpy(lengths)
        self.offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        self.total = self.offset_per_key[-1]
        self.ones = torch.ones(NUM_SPARSE * b, dtype=torch.int32)  # 1-hot lengths (expanded on the device)

    def kjt(
        self, keys: List[str], values: torch.Tensor, lengths: torch.Tensor, offsets: torch.Tensor
    ) -> KeyedJaggedTensor:
        """The KJT of ``values`` in this layout, its per-key sizes given (no device sync); ``lengths`` and
        ``offsets`` are :attr:`lengths` and :attr:`offsets` or their copies on ``values``' device."""
        return KeyedJaggedTensor(
            keys=keys,
            values=values,
            lengths=lengths,
            offsets=offsets,
            stride=self.b,
            length_per_key=self.length_per_key,
            offset_per_key=self.offset_per_key,
        )


class BatchReader:
    """Assemble ``Batch`` objects from a :class:`BinarySplit` with vectorised copies (no per-sample loops).

    Args:
        split: the rows.
        feature_names: KJT keys, one per table (26).
        multi_hot: None for 1-hot ids, else a :class:`BinaryMultiHot`.
        pin_memory: allocate batches in pinned host memory (None: when CUDA is available).

    Batches: dense float32 ``[B, 13]``, labels float32 ``[B]``, KJT values int32 (feature-major, table ``t``'s
    ``B * m_t`` ids together), lengths int32 ``[26 * B]``.

    Raises:
        BinaryFormatError: materialized multi-hot on a split opened without its multi-hot files.
    """

    # ids copied and range-checked per piece: 1 MB, which stays in a core's L2 cache (1-2 MB on x86 server cores).
    CHECK_CHUNK = 1 << 18

    def __init__(
        self,
        split: BinarySplit,
        feature_names: Sequence[str],
        multi_hot: Optional[BinaryMultiHot],
        pin_memory: Optional[bool] = None,
    ) -> None:
        self.split, self.keys, self.mh = split, list(feature_names), multi_hot
        if len(self.keys) != NUM_SPARSE:
            raise ValueError(f"{len(self.keys)} feature names for {NUM_SPARSE} tables")
        self.sizes = multi_hot.sizes if multi_hot is not None else [1] * NUM_SPARSE
        if multi_hot is not None and multi_hot.table_rows != split.table_rows.tolist():
            raise BinaryFormatError(
                f"{split.root}: multi-hot built for table rows {multi_hot.table_rows}, the dataset "
                f"has {split.table_rows.tolist()}"
            )
        if (
            multi_hot is not None
            and multi_hot.mode == "materialized"
            and any(p.multi_hot is None for p in split.pieces)
        ):
            raise BinaryFormatError(
                f"{split.root}: materialized multi-hot asked for, but the {split.name} split was "
                "opened without its day_*_sparse_multi_hot.npy files (load_splits(..., "
                "multi_hot_files=True))"
            )
        self.pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._layouts: Dict[int, _Layout] = {}
        self._rows_u32 = split.table_rows.astype(np.uint32)
        # on-the-fly multi-hot expanded on the device: read() leaves the ids 1-hot, expand() builds the bags there
        self.on_device = multi_hot is not None and multi_hot.device is not None
        self._device_layouts: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}

    def _layout(self, b: int) -> _Layout:
        if b not in self._layouts:
            self._layouts[b] = _Layout(b, self.sizes)
        return self._layouts[b]

    def _empty(self, shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=self.pin)

    def read(self, start: int, stop: int, pad_to: Optional[int] = None) -> Batch:
        """Rows ``[start, stop)`` of the split; with ``pad_to``, followed by copies of split row 0 up to
        ``pad_to`` rows (evaluation padding, weight 0).

        Materialized multi-hot reads only the multi-hot file for the ids (the 1-hot file is not read: each bag
        already holds its sample's ids) and checks every id it copies (:meth:`_copy_multi_hot`); 1-hot and
        on-the-fly batches check the 1-hot ids before use.

        Raises:
            BinaryFormatError: an id at or above its table size (or negative), naming file, row and feature.
        """
        n = stop - start
        b = pad_to if pad_to is not None else n
        lay = self._layout(b)
        dense_t = self._empty((b, NUM_DENSE), torch.float32)
        labels_t = self._empty((b,), torch.float32)
        dense, labels = dense_t.numpy(), labels_t.numpy()
        mat = self.mh is not None and self.mh.mode == "materialized"
        ids = None
        if mat:
            values_t = self._empty((lay.total,), torch.int32)
        else:
            one_hot = self.mh is None or self.on_device
            ids_t = (
                self._empty((NUM_SPARSE, b), torch.int32)
                if self.on_device
                else torch.empty((NUM_SPARSE, b), dtype=torch.int32)
            )
            ids = ids_t.numpy()
            values_t = ids_t.view(-1) if one_hot else self._empty((lay.total,), torch.int32)
        values = values_t.numpy()
        pieces = self.split.locate(start, stop)
        if b > n:  # padding: split row 0 read once at position n, copied to the rest below
            p0, lo0, _, _ = self.split.locate(0, 1)[0]
            pieces.append((p0, lo0, 1, n))
        for p, lo, cnt, off in pieces:
            sl = slice(off, off + cnt)
            np.copyto(dense[sl], p.dense[lo : lo + cnt])
            np.copyto(labels[sl], p.labels[lo : lo + cnt, 0], casting="unsafe")
            if mat:
                self._copy_multi_hot(p, lo, cnt, off, values, lay)
            else:
                np.copyto(ids[:, sl], p.sparse[lo : lo + cnt].T)
        if b > n:
            pad = slice(n + 1, b)
            dense[pad] = dense[n]
            labels[pad] = labels[n]
            if mat:
                for t, m in enumerate(self.sizes):
                    o = lay.offset_per_key[t]
                    sec = values[o : o + b * m].reshape(b, m)
                    sec[n + 1 :] = sec[n]
            else:
                ids[:, pad] = ids[:, n : n + 1]
        if not mat:
            self._check(ids, pieces, "sparse")
            if self.on_device:  # 1-hot ids leave the host; expand() builds the bags on the device
                return Batch(
                    dense_features=dense_t,
                    sparse_features=KeyedJaggedTensor(keys=self.keys, values=values_t, lengths=self._layout(b).ones),
                    labels=labels_t,
                )
            if self.mh is not None:
                mh_mod.expand_into(self.mh.tables, self.sizes, ids, values, lay.offset_per_key)
        kjt = lay.kjt(self.keys, values_t, lay.lengths, lay.offsets)
        return Batch(dense_features=dense_t, sparse_features=kjt, labels=labels_t)

    def expand(self, batch: Batch) -> Batch:
        """``batch`` from :meth:`read` with 1-hot ids (on-the-fly multi-hot on the device): copied to the device
        (non-blocking from pinned memory) and its bags gathered there from the expansion tables, in the layout
        :meth:`read` gives on the host (values int32, feature-major); the ids were range-checked on the host."""
        mh = self.mh
        assert mh is not None and mh.device is not None
        dev = mh.device
        b = batch.dense_features.shape[0]
        lay = self._layout(b)
        if b not in self._device_layouts:
            self._device_layouts[b] = (lay.lengths.to(dev), lay.offsets.to(dev))
        lengths, offsets = self._device_layouts[b]
        ids = batch.sparse_features.values().to(dev, non_blocking=True).view(NUM_SPARSE, b)
        values = torch.empty((lay.total,), dtype=torch.int32, device=dev)
        for t, m in enumerate(self.sizes):
            dst = values[lay.offset_per_key[t] : lay.offset_per_key[t + 1]]
            table = mh.device_tables[t]
            if table is None:
                dst.copy_(ids[t])
            else:
                torch.index_select(table, 0, ids[t], out=dst.view(b, m))
        kjt = lay.kjt(self.keys, values, lengths, offsets)
        return Batch(
            dense_features=batch.dense_features.to(dev, non_blocking=True),
            sparse_features=kjt,
            labels=batch.labels.to(dev, non_blocking=True),
        )

    def _copy_multi_hot(self, p: _Piece, lo: int, cnt: int, off: int, values: np.ndarray, lay: _Layout) -> None:
        """Copy day rows ``[lo, lo + cnt)`` of ``p``'s materialized multi-hot into batch rows ``[off, off + cnt)``
        of ``values`` and check each id against its table size.

        The check runs on each ``CHECK_CHUNK``-id piece right after copying it, while it is still in the core's
        L2 cache: a separate pass over the batch's 14 MB (MLPerf sizes, batch 16384) re-reads it from memory
        and cost 0.4-0.7 ms a batch on a 2-core machine. Viewed as uint32, a
        negative id is above every table size, so one ``max`` per piece catches both.

        Raises:
            BinaryFormatError: an id outside its table, naming the multi-hot file, 0-based day row and feature.
        """
        src, dst, chunk = p.multi_hot_u32, values.view(np.uint32), self.CHECK_CHUNK
        top = np.maximum.reduce
        base = 0
        for t, m in enumerate(self.sizes):
            s = p.day_rows * base + lo * m
            d = lay.offset_per_key[t] + off * m
            n, lim = cnt * m, self._rows_u32[t]
            for a in range(0, n, chunk):
                part = dst[d + a : d + min(n, a + chunk)]
                np.copyto(part, src[s + a : s + a + part.shape[0]])
                if top(part) >= lim:
                    k = a + int(np.flatnonzero(part >= lim)[0])
                    self._raise_bad(p.day, lo + k // m, t, int(values[d + k]), "sparse_multi_hot")
            base += m

    def _check(self, ids: np.ndarray, pieces: list, kind: str) -> None:
        top = ids.view(np.uint32).max(axis=1, initial=0)  # negative ids become huge: one pass catches both
        bad = np.flatnonzero(top >= self._rows_u32)
        if bad.size:
            t = int(bad[0])
            k = int(np.flatnonzero(ids[t].view(np.uint32) >= self._rows_u32[t])[0])
            for p, lo, cnt, off in pieces:
                if off <= k < off + cnt:
                    self._raise_bad(p.day, lo + k - off, t, int(ids[t, k]), kind)
            raise AssertionError("bad id outside the batch")

    def _raise_bad(self, day: int, row: int, t: int, val: int, kind: str) -> None:
        path = day_file(self.split.root, day, kind)
        raise BinaryFormatError(
            f"{path}: row {row} (0-based), feature C{t + 1}: id {val} is outside table {t}'s "
            f"{int(self.split.table_rows[t])} rows (ids are never remapped); the file is corrupt or was built for "
            f"other table sizes: {redo_hint(path)}"
        )


# ------------------------------------------------------------------------------------------ trainer entry
def check_table_rows(meta: Dict[str, Any], root: str, table_rows: Sequence[int]) -> None:
    """Refuse a model whose table rows are not those the dataset at ``root`` (its ``meta``) was hashed into.

    Raises:
        BinaryFormatError: naming ``model.num_embeddings_per_feature`` / ``model.row_cap`` and both row lists.
    """
    if [int(r) for r in meta["table_rows"]] != [int(r) for r in table_rows]:
        raise BinaryFormatError(
            f"config key `model.num_embeddings_per_feature` / `model.row_cap`: the model's table rows "
            f"{list(table_rows)} differ from those {root} was hashed into ({meta['table_rows']}); set the model's "
            "rows to the dataset's or rebuild the dataset with data/preprocess_criteo.py --table-rows"
        )


def load_splits(
    root: str,
    table_rows: Sequence[int],
    max_rows: Optional[int],
    multi_hot_files: bool,
    prefetch: int = 2,
    pin_memory: Optional[bool] = None,
) -> Tuple[BinarySplit, BinarySplit, BinarySplit]:
    """Train, validation and test splits of the dataset at ``root`` (MLPerf split rule, see module doc).

    ``max_rows`` (``data.max_rows``) caps the training split at its first ``max_rows`` rows, in day order; the
    validation and test splits are never capped.

    Raises:
        BinaryFormatError: no usable ``meta.json`` (:func:`~dlrm.data.binary_format.read_dataset_meta`); fewer
            than two days; the dataset's table sizes differ from ``model`` table rows (the ids were hashed into
            other sizes); ``multi_hot_files`` on a dataset without materialized multi-hot; a day file is missing,
            truncated or disagrees on its row count.
    """
    meta = read_dataset_meta(root)
    if multi_hot_files and not (meta["multi_hot"] or {}).get("materialized"):
        raise _no_materialized(root, "", meta["multi_hot"])
    check_table_rows(meta, root, table_rows)
    r = split_ranges(meta, root)
    out = (
        BinarySplit(root, meta, "train", r["train"], max_rows, multi_hot_files),
        BinarySplit(root, meta, "val", r["val"], None, multi_hot_files),
        BinarySplit(root, meta, "test", r["test"], None, multi_hot_files),
    )
    for s in out:
        s.prefetch, s.pin_memory = prefetch, pin_memory
    return out
