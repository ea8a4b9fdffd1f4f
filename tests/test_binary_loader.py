"""data=criteo_binary: multi-hot equal to the MLPerf reference procedure (materialized and on the fly), the
memory-mapped loader equal to the in-memory path, rank layout, MLPerf splits, bad files, and the trainer."""

from __future__ import annotations

from pathlib import Path
from typing import List

import numpy as np
import pytest
import torch

import dlrm.data as D
from conftest import REPO, run_gloo
from dlrm import traffic
from dlrm.config import DataConfig, ModelConfig, compose, to_config
from dlrm.data import binary as B
from dlrm.data import binary_format as BF
from dlrm.data import multihot as MH
from dlrm.data import preprocess as P
from dlrm.data.prefetch import Prefetcher
from dlrm.errors import InputError
from dlrm.model import FEATURE_NAMES

ROWS = [50, 7, 300, 3, 1000, 3, 20, 11, 63, 50, 90, 40, 10, 22, 19, 155, 4, 97, 14, 50, 400, 50, 59, 13, 108, 36]
SIZES = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]  # MLPerf sizes


def reference_tables(rows: List[int], sizes: List[int]) -> List[np.ndarray]:
    """The MLPerf reference procedure (torchrec_dlrm/multi_hot.py), written out: seed numpy's global legacy
    generator with 0, then per table in order ``randint(0, rows, (rows, m - 1))`` behind the id itself, int32."""
    np.random.seed(0)
    out = []
    for r, m in zip(rows, sizes):
        extra = np.random.randint(0, r, size=(r, m - 1))
        out.append(np.concatenate([np.arange(r)[:, None], extra], axis=1).astype(np.int32))
    return out


def make_days(n_rows: List[int], seed: int = 0):
    g = np.random.default_rng(seed)
    days = []
    for n in n_rows:
        dense = g.standard_normal((n, 13)).astype(np.float32)
        ids = np.stack([g.integers(0, r, n) for r in ROWS], axis=1).astype(np.int32)
        days.append((dense, ids, (g.random(n) < 0.3).astype(np.int32)))
    return days


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bin")
    BF.write_dataset(str(root), make_days([700, 555, 403]), ROWS)
    P.multihot(out=str(root), sizes=SIZES, seed=0, materialize=True, workers=1)
    return root


def whole(ds: Path):
    days = [
        (np.load(ds / f"day_{d}_dense.npy"), np.load(ds / f"day_{d}_sparse.npy"), np.load(ds / f"day_{d}_labels.npy"))
        for d in range(3)
    ]
    return days


def test_multi_hot_equals_reference_procedure(ds: Path) -> None:
    ref = reference_tables(ROWS, SIZES)
    for chunk in (7, 64, 1 << 17):  # chunked draws are the reference's single draw
        tabs = MH.build_tables(ROWS, SIZES, seed=0, chunk_rows=chunk)
        for t, m in enumerate(SIZES):
            if m == 1:
                assert tabs[t] is None
            else:
                np.testing.assert_array_equal(tabs[t], ref[t])
    # the existing in-memory MultiHot (int64) holds the same tables
    mem = D.MultiHot(ROWS, SIZES, seed=0)
    for t, m in enumerate(SIZES):
        if m > 1:
            np.testing.assert_array_equal(mem.tables[t].numpy(), ref[t])
    # materialized on disk: for the same 1-hot ids, the reference's bags
    for d, (_, ids, _) in enumerate(whole(ds)):
        flat = np.load(ds / f"day_{d}_sparse_multi_hot.npy")
        n, base = ids.shape[0], 0
        for t, m in enumerate(SIZES):
            np.testing.assert_array_equal(flat[n * base : n * (base + m)].reshape(n, m), ref[t][ids[:, t]])
            base += m


@pytest.mark.parametrize("mode", ["one_hot", "materialized", "on_the_fly", "on_the_fly_on_device"])
def test_batches_equal_in_memory_path(ds: Path, mode: str) -> None:
    """Every rank's batches hold exactly the rows the in-memory Split path gives (dense, labels, KJT), also when
    the on-the-fly multi-hot is expanded by ``BatchReader.expand`` (``data.multi_hot_on_device``: here its torch
    gather on the CPU; on CUDA the same code on the GPU) instead of in the loader."""
    train, val, test = B.load_splits(str(ds), ROWS, None, multi_hot_files=mode == "materialized", prefetch=2)
    days = whole(ds)
    mem = D.Split(
        torch.from_numpy(np.concatenate([d[0] for d in days[:2]])),
        torch.from_numpy(np.concatenate([d[1] for d in days[:2]]).astype(np.int64)),
        torch.from_numpy(np.concatenate([d[2][:, 0] for d in days[:2]]).astype(np.float32)),
        "train",
    )
    meta = BF.read_dataset_meta(str(ds))
    bmh = None if mode == "one_hot" else B.make_multi_hot(str(ds), meta, mode.replace("_on_device", ""), SIZES, 0)
    if mode == "on_the_fly_on_device":
        bmh = bmh.to(torch.device("cpu"))
    mmh = None if mode == "one_hot" else D.MultiHot(ROWS, SIZES, 0)
    assert len(train) == 1255 and len(val) == 202 and len(test) == 201  # last day: ceil(403/2) validate
    world, gb = 2, 100
    per_rank = [
        list(
            D.train_batches(
                train,
                global_batch=gb,
                rank=r,
                world_size=world,
                epochs=1,
                max_steps=None,
                feature_names=FEATURE_NAMES,
                multi_hot=bmh,
                shuffle=False,
                seed=0,
            )
        )
        for r in range(world)
    ]
    ref = [
        list(
            D.train_batches(
                mem,
                global_batch=gb,
                rank=r,
                world_size=world,
                epochs=1,
                max_steps=None,
                feature_names=FEATURE_NAMES,
                multi_hot=mmh,
                shuffle=False,
                seed=0,
            )
        )
        for r in range(world)
    ]
    assert len(per_rank[0]) == len(per_rank[1]) == 13  # 12 full global batches + 55 rows -> 27 per rank
    assert [b.labels.shape[0] for b in per_rank[0]] == [50] * 12 + [27]
    for r in range(world):
        for got, want in zip(per_rank[r], ref[r]):
            assert torch.equal(got.dense_features, want.dense_features)
            assert torch.equal(got.labels, want.labels)
            assert got.sparse_features.keys() == want.sparse_features.keys()
            assert torch.equal(got.sparse_features.values().long(), want.sparse_features.values())
            assert torch.equal(got.sparse_features.lengths(), want.sparse_features.lengths())
            assert torch.equal(got.sparse_features.offsets().long(), want.sparse_features.offsets().long())
            # the KJT dtypes dlrm.traffic counts: int32 ids from the binary format, int64 in memory; int32 lengths
            assert got.sparse_features.values().element_size() == traffic.ID_BYTES["criteo_binary"]
            assert want.sparse_features.values().element_size() == traffic.DEFAULT_ID_BYTES
            assert got.sparse_features.lengths().element_size() == traffic.LENGTH_BYTES
            assert want.sparse_features.lengths().element_size() == traffic.LENGTH_BYTES
    # the batch crossing from day 0 into day 1 says so
    assert train.describe_rows(650, 750) == f"{ds} day_0 rows 650-699, day_1 rows 0-49"


def test_eval_batches_expanded_by_the_consumer_equal_the_loaders(ds: Path) -> None:
    _, val, _ = B.load_splits(str(ds), ROWS, None, multi_hot_files=False, prefetch=2)
    meta = BF.read_dataset_meta(str(ds))
    host = B.make_multi_hot(str(ds), meta, "on_the_fly", SIZES, 0)
    there = B.make_multi_hot(str(ds), meta, "on_the_fly", SIZES, 0).to(torch.device("cpu"))
    kw = dict(batch_size=64, rank=1, world_size=2, feature_names=FEATURE_NAMES)
    a, b = list(D.eval_batches(val, multi_hot=host, **kw)), list(D.eval_batches(val, multi_hot=there, **kw))
    assert len(a) == len(b) == 2
    for (x, wx), (y, wy) in zip(a, b):
        assert torch.equal(wx, wy) and torch.equal(x.dense_features, y.dense_features)
        assert torch.equal(x.sparse_features.values(), y.sparse_features.values())
        assert torch.equal(x.sparse_features.offsets().long(), y.sparse_features.offsets().long())


def test_eval_batches_pad_with_weight_zero_and_cover_each_row_once(ds: Path) -> None:
    _, val, _ = B.load_splits(str(ds), ROWS, None, multi_hot_files=True)
    mh = B.make_multi_hot(str(ds), BF.read_dataset_meta(str(ds)), "materialized", SIZES, 0)
    dense_day2 = whole(ds)[2][0]
    seen = []
    counts = []
    for r in range(3):
        out = list(D.eval_batches(val, batch_size=32, rank=r, world_size=3, feature_names=FEATURE_NAMES, multi_hot=mh))
        counts.append(len(out))
        for batch, w in out:
            assert batch.dense_features.shape == (32, 13) and batch.sparse_features.values().numel() == 32 * 214
            real = w.bool()
            seen.append(batch.dense_features[real])
            assert torch.equal(
                batch.dense_features[~real], torch.from_numpy(dense_day2[:1]).expand(int((~real).sum()), 13)
            )
    assert counts == [3, 3, 3]  # 202 rows: shares 67, 67, 68 -> 3 batches each
    np.testing.assert_array_equal(torch.cat(seen).numpy(), dense_day2[:202])


def _copy_ds(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.glob("day_*_*.npy"):
        (dst / p.name).write_bytes(p.read_bytes())
    (dst / "meta.json").write_bytes((src / "meta.json").read_bytes())
    return dst


def test_truncated_file_names_file_and_row(ds: Path, tmp_path: Path) -> None:
    d = _copy_ds(ds, tmp_path / "d")
    p = d / "day_1_sparse.npy"
    p.write_bytes(p.read_bytes()[: -(26 * 4 * 10 + 5)])
    with pytest.raises(BF.BinaryFormatError, match=r"day_1_sparse.npy: truncated: .* row 544 is the first incomplete"):
        B.load_splits(str(d), ROWS, None, multi_hot_files=False)


def test_row_count_mismatch_names_file(ds: Path, tmp_path: Path) -> None:
    d = _copy_ds(ds, tmp_path / "d")
    np.save(d / "day_0_labels.npy", np.zeros((699, 1), np.int32))
    with pytest.raises(BF.BinaryFormatError, match=r"day_0_labels.npy: 699 rows, but meta.json and the other files"):
        B.load_splits(str(d), ROWS, None, multi_hot_files=False)


@pytest.mark.parametrize("value", [ROWS[4], -1])
def test_id_outside_table_is_an_error_not_a_remap(ds: Path, tmp_path: Path, value: int) -> None:
    d = _copy_ds(ds, tmp_path / "d")
    ids = np.load(d / "day_1_sparse.npy")
    ids[123, 4] = value
    np.save(d / "day_1_sparse.npy", ids)
    train, _, _ = B.load_splits(str(d), ROWS, None, multi_hot_files=False)
    with pytest.raises(
        BF.BinaryFormatError,
        match=rf"day_1_sparse.npy: row 123 \(0-based\), feature C5: id {value} "
        rf"is outside table 4's {ROWS[4]} rows",
    ):
        list(
            D.train_batches(
                train,
                global_batch=200,
                rank=0,
                world_size=1,
                epochs=1,
                max_steps=None,
                feature_names=FEATURE_NAMES,
                multi_hot=None,
                shuffle=False,
                seed=0,
            )
        )
    with pytest.raises(BF.BinaryFormatError, match=r"model.num_embeddings_per_feature.*differ"):
        B.load_splits(str(d), [r + 1 for r in ROWS], None, multi_hot_files=False)


def test_bad_materialized_id_names_file(ds: Path, tmp_path: Path) -> None:
    d = _copy_ds(ds, tmp_path / "d")
    flat = np.load(d / "day_0_sparse_multi_hot.npy")
    flat[700 * 3 + 5] = 999  # table 1 (7 rows), sample 2
    np.save(d / "day_0_sparse_multi_hot.npy", flat)
    train, _, _ = B.load_splits(str(d), ROWS, None, multi_hot_files=True)
    mh = B.make_multi_hot(str(d), BF.read_dataset_meta(str(d)), "materialized", SIZES, 0)
    with pytest.raises(
        BF.BinaryFormatError, match=r"day_0_sparse_multi_hot.npy: row 2 \(0-based\), feature C2: id 999"
    ):
        next(
            iter(
                D.train_batches(
                    train,
                    global_batch=64,
                    rank=0,
                    world_size=1,
                    epochs=1,
                    max_steps=None,
                    feature_names=FEATURE_NAMES,
                    multi_hot=mh,
                    shuffle=False,
                    seed=0,
                )
            )
        )


def _mat_batches(d: Path, global_batch: int):
    train, _, _ = B.load_splits(str(d), ROWS, None, multi_hot_files=True)
    mh = B.make_multi_hot(str(d), BF.read_dataset_meta(str(d)), "materialized", SIZES, 0)
    return D.train_batches(
        train,
        global_batch=global_batch,
        rank=0,
        world_size=1,
        epochs=1,
        max_steps=None,
        feature_names=FEATURE_NAMES,
        multi_hot=mh,
        shuffle=False,
        seed=0,
    )


@pytest.mark.parametrize("chunk", [7, 64, 1 << 18])
def test_materialized_chunked_copy_equals_reference_bags(ds: Path, monkeypatch, chunk: int) -> None:
    """Copy-and-check in pieces of ``chunk`` ids (pieces ending mid-bag, mid-table, and a batch crossing from day 0
    into day 1) gives the reference procedure's bags for the batch's 1-hot ids."""
    monkeypatch.setattr(B.BatchReader, "CHECK_CHUNK", chunk)
    ref = reference_tables(ROWS, SIZES)
    days = whole(ds)
    ids = np.concatenate([days[0][1], days[1][1]])
    batches = list(_mat_batches(ds, 96))
    assert len(batches) == 14 and [b.labels.shape[0] for b in batches] == [96] * 13 + [7]  # 1255 rows
    for i in (0, 7, 13):  # 7: rows 672-767, 28 of day 0 then 68 of day 1
        rows = ids[96 * i : 96 * (i + 1)]
        want = np.concatenate([ref[t][rows[:, t]].reshape(-1) for t in range(len(ROWS))])
        np.testing.assert_array_equal(batches[i].sparse_features.values().numpy(), want)


@pytest.mark.parametrize("value", [ROWS[20], 2**31 - 1, -5])
def test_bad_materialized_id_in_a_later_chunk_exact_message(ds: Path, tmp_path: Path, monkeypatch, value: int) -> None:
    """An id past the first checked piece of a table's section (day 1 row 2, bag position 37 of table 20, batch
    crossing days) is caught when its batch is read, not before, with the exact message."""
    monkeypatch.setattr(B.BatchReader, "CHECK_CHUNK", 16)
    d = _copy_ds(ds, tmp_path / "d")
    flat = np.load(d / "day_1_sparse_multi_hot.npy")
    flat[555 * sum(SIZES[:20]) + 2 * 100 + 37] = value
    np.save(d / "day_1_sparse_multi_hot.npy", flat)
    it = iter(_mat_batches(d, 64))
    assert len([next(it) for _ in range(10)]) == 10  # rows 0-639: all of day 0's before the bad one pass
    with pytest.raises(BF.BinaryFormatError) as e:
        next(it)  # rows 640-703: day 0 rows 640-699, day 1 rows 0-3
    assert str(e.value) == (
        f"{d}/day_1_sparse_multi_hot.npy: row 2 (0-based), feature C21: id {value} is outside table 20's 400 rows "
        "(ids are never remapped); the file is corrupt or was built for other table sizes: "
        f"delete {d}/day_1.multihot.json and re-run data/preprocess_criteo.py multihot --mode materialize "
        "(it redoes only that pass of day 1)"
    )


def test_materialized_without_multi_hot_files_is_an_error(ds: Path) -> None:
    train, _, _ = B.load_splits(str(ds), ROWS, None, multi_hot_files=False)
    mh = B.make_multi_hot(str(ds), BF.read_dataset_meta(str(ds)), "materialized", SIZES, 0)
    with pytest.raises(
        BF.BinaryFormatError,
        match=r"materialized multi-hot asked for, but the train split was opened "
        r"without its day_\*_sparse_multi_hot.npy files",
    ):
        B.BatchReader(train, FEATURE_NAMES, mh)


def test_materialized_source_on_a_dataset_without_it_names_the_key(ds: Path, tmp_path: Path) -> None:
    """``data.multi_hot_source=materialized`` is refused when the splits are opened, before any day file is read."""
    import json

    d = _copy_ds(ds, tmp_path / "d")
    meta = json.loads((d / "meta.json").read_text())
    meta["multi_hot"] = None
    (d / "meta.json").write_text(json.dumps(meta))
    data = DataConfig(name="criteo_binary", dataset_dir=str(d), multi_hot_source="materialized")
    with pytest.raises(BF.BinaryFormatError) as e:
        D.load_splits(data, ModelConfig(num_embeddings_per_feature=ROWS, row_cap=None), 0)
    assert str(e.value) == (
        f"config key `data.multi_hot_source`: {d} has no materialized multi-hot for sizes {SIZES} seed 0 (meta.json: "
        f"none); run `python data/preprocess_criteo.py multihot --out {d} --mode materialize` or set "
        "data.multi_hot_source=on_the_fly"
    )


def _drop(key: str, *path):
    def edit(meta: dict) -> None:
        for k in path:
            meta = meta[k]
        del meta[key]

    return edit


@pytest.mark.parametrize(
    "edit,key",
    [
        (_drop("days"), "days"),
        (_drop("rows", "days", 1), "days[1]"),
        (_drop("day_0_sparse.npy", "days", 0, "files"), "days[0].files"),
        (lambda m: m.update(table_rows=m["table_rows"][:25]), "table_rows"),
        (lambda m: m.update(table_rows=[0] + m["table_rows"][1:]), "table_rows"),
        (_drop("multi_hot"), "multi_hot"),
        (_drop("seed", "multi_hot"), "multi_hot"),
    ],
)
def test_meta_json_with_a_key_missing_or_malformed_names_it(ds: Path, tmp_path: Path, edit, key: str) -> None:
    import json

    meta = json.loads((ds / "meta.json").read_text())
    edit(meta)
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(BF.BinaryFormatError) as e:
        BF.read_dataset_meta(str(tmp_path))
    assert str(e.value) == (
        f"{tmp_path / 'meta.json'}: key `{key}` is missing or malformed; re-run data/preprocess_criteo.py --out "
        f"{tmp_path} with the arguments that built it (finished days are kept, meta.json is written again)"
    )


def test_a_dataset_of_one_day_names_meta_json_and_the_fix(ds: Path, tmp_path: Path) -> None:
    import json

    meta = json.loads((ds / "meta.json").read_text())
    meta["days"] = meta["days"][:1]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(BF.BinaryFormatError) as e:
        B.load_splits(str(tmp_path), ROWS, None, multi_hot_files=False)
    assert str(e.value) == (
        f"{tmp_path / 'meta.json'} lists 1 day(s); the splits need training days and one evaluation day (the last): "
        "preprocess at least two days (e.g. --days 0-1)"
    )


@pytest.mark.parametrize("damage", ["truncated", "missing", "shape", "tables.json"])
def test_damaged_expansion_tables_name_the_file_and_the_fix(ds: Path, tmp_path: Path, damage: str) -> None:
    import json
    import re
    import shutil

    d = _copy_ds(ds, tmp_path / "d")
    tables = d / MH.TABLES_DIR
    shutil.copytree(ds / MH.TABLES_DIR, tables)
    t4 = tables / "table_04.npy"
    if damage == "truncated":
        t4.write_bytes(t4.read_bytes()[:-100])
        what = r"missing, unreadable or truncated \(mmap length is greater than file size\)"
    elif damage == "missing":
        t4.unlink()
        what = rf"missing, unreadable or truncated \(\[Errno 2\] No such file or directory: '{re.escape(str(t4))}'\)"
    elif damage == "shape":
        np.save(t4, np.zeros((ROWS[4], 5), np.int32))
        what = rf"shape \({ROWS[4]}, 5\) int32, expected \({ROWS[4]}, 6\) int32"
    else:
        spec = json.loads((tables / "tables.json").read_text())
        del spec["seed"]
        (tables / "tables.json").write_text(json.dumps(spec))
        t4 = tables / "tables.json"
        what = r"unreadable or incomplete \(KeyError: 'seed'\)"
    fix = f"; delete {tables} and rebuild it with `python data/preprocess_criteo.py multihot --out {d} --mode tables`"
    with pytest.raises(BF.BinaryFormatError) as e:
        B.make_multi_hot(str(d), BF.read_dataset_meta(str(d)), "on_the_fly", SIZES, 0)
    assert re.fullmatch(re.escape(f"{t4}: ") + what + re.escape(fix), str(e.value)), str(e.value)


def test_prefetcher_forwards_errors_and_stops() -> None:
    def gen():
        yield 1
        raise RuntimeError("boom at item 2")

    it = iter(Prefetcher(gen(), 2))
    assert next(it) == 1
    with pytest.raises(RuntimeError, match="boom at item 2"):
        next(it)
    p = Prefetcher(iter(range(10**9)), 2)
    it = iter(p)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()
    p.thread.join(timeout=5)
    assert not p.thread.is_alive()


def test_config_keys() -> None:
    cfg = to_config(compose(["data=criteo_binary", "data.dataset_dir=/x"]))
    assert (cfg.data.name, cfg.data.multi_hot_source, cfg.data.prefetch) == ("criteo_binary", "auto", 2)
    from dlrm.errors import ConfigError

    with pytest.raises(ConfigError, match="config key `data.dataset_dir`: data=criteo_binary needs"):
        to_config(compose(["data=criteo_binary"]))
    with pytest.raises(ConfigError, match="config key `data.shuffle`"):
        to_config(compose(["data=criteo_binary", "data.dataset_dir=/x", "data.shuffle=true"]))


def _train_both(rank: int, world: int, tmp: str, common: List[str]) -> List[List[dict]]:
    from dlrm.trainer import Trainer

    out = []
    for name, extra in (
        ("tsv", [f"data.train_path={tmp}/train.tsv", f"data.val_path={tmp}/val.tsv", f"data.test_path={tmp}/test.tsv"]),
        ("bin", [f"data.dataset_dir={tmp}/bin", "eval.cache_on_device=true"]),
    ):
        data = "criteo_tsv" if name == "tsv" else "criteo_binary"
        t = Trainer(compose([f"data={data}", *common, *extra]), f"{tmp}/run_{name}")
        try:
            t.fit()
        finally:
            t.close()
        out.append(
            [
                {k: v for k, v in r.items() if k == "step" or k.endswith("auc") or k.endswith("logloss")}
                for r in t.history
                if "loss" not in r
            ]
        )
    return out


def test_trainer_on_binary_equals_trainer_on_tsv(tmp_path: Path) -> None:
    """The same rows through data=criteo_tsv and data=criteo_binary (log1p transform, MLPerf multi-hot on the
    fly) train to bitwise the same validation and test metrics; the binary run holds its validation batches
    (eval.cache_on_device): its second to fourth validations replay them."""
    from test_binary_preprocess import gen_tsv

    days = []
    for k, n in enumerate((700, 500, 301)):
        gen_tsv(tmp_path / f"day_{k}", n, seed=10 + k)
        days.append((tmp_path / f"day_{k}").read_text().splitlines(keepends=True))
    (tmp_path / "train.tsv").write_text("".join(days[0] + days[1]))
    (tmp_path / "val.tsv").write_text("".join(days[2][:151]))  # MLPerf: first ceil(N/2) rows validate
    (tmp_path / "test.tsv").write_text("".join(days[2][151:]))
    rows = to_config(compose([])).model.table_rows
    P.preprocess(
        out=str(tmp_path / "bin"),
        layout="terabyte",
        inputs=[str(tmp_path / f"day_{k}") for k in range(3)],
        days=[0, 1, 2],
        table_rows=rows,
        transform="log1p",
        workers=1,
    )
    common = [
        "data.global_batch_size=64",
        "eval.batch_size=50",
        "trainer.epochs=1",
        "data.multi_hot=true",
        "eval.per_epoch=3",
        "eval.every_n_steps=null",
    ]
    res = run_gloo(1, _train_both, str(tmp_path), common)
    tsv, binary = res[0]
    assert [sorted(r) for r in tsv] == [["step", "val_auc", "val_logloss"]] * 4 + [["step", "test_auc", "test_logloss"]]
    assert [r["step"] for r in tsv] == [6, 12, 18, 19, 19]
    assert tsv == binary
    held = [line for line in (tmp_path / "run_bin" / "train.log").read_text().splitlines() if "held on" in line]
    assert len(held) == 1 and held[0].endswith(
        "evaluation: 4 batches (0.00 GiB) of this split held on cpu for the later passes (eval.cache_on_device)"
    )


def test_binary_format_error_is_an_input_error() -> None:
    """A subclass of InputError, which dlrm/cli.py prints as one ``error:`` line with exit 2."""
    assert issubclass(BF.BinaryFormatError, InputError)


def test_dataset_dir_that_is_a_file_or_missing_names_the_key(ds: Path, tmp_path: Path) -> None:
    with pytest.raises(BF.BinaryFormatError) as e:
        BF.read_dataset_meta(str(ds / "meta.json"))
    assert str(e.value) == (
        f"config key `data.dataset_dir`: {str(ds / 'meta.json')!r} is a file, not a directory; "
        f"pass data.dataset_dir={ds}"
    )
    with pytest.raises(BF.BinaryFormatError, match=r"config key `data.dataset_dir`: no such directory '.*nope' "):
        BF.read_dataset_meta(str(tmp_path / "nope"))
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(BF.BinaryFormatError, match=r"meta.json: not valid JSON \("):
        BF.read_dataset_meta(str(tmp_path))


@pytest.mark.parametrize("max_rows", [300, 750])
def test_max_rows_caps_training_rows_alike_for_tsv_and_binary(ds: Path, tmp_path: Path, max_rows: int) -> None:
    """``data.max_rows`` is the number of training rows for both formats: binary (training days 700 + 555 rows;
    750 crosses into day 1) and TSV, with or without data.val_path; validation rows are never capped."""
    from test_binary_preprocess import gen_tsv

    gen_tsv(tmp_path / "train.tsv", 1255, seed=1)
    gen_tsv(tmp_path / "val.tsv", 202, seed=2)
    model = ModelConfig(num_embeddings_per_feature=ROWS, row_cap=None)
    common = dict(max_rows=max_rows, multi_hot=False)
    b_train, b_val, _ = D.load_splits(DataConfig(name="criteo_binary", dataset_dir=str(ds), **common), model, 0)
    t_train, t_val, _ = D.load_splits(
        DataConfig(name="criteo_tsv", train_path=str(tmp_path / "train.tsv"), **common), model, 0
    )
    v_train, v_val, _ = D.load_splits(
        DataConfig(
            name="criteo_tsv", train_path=str(tmp_path / "train.tsv"), val_path=str(tmp_path / "val.tsv"), **common
        ),
        model,
        0,
    )
    assert len(b_train) == len(t_train) == len(v_train) == max_rows
    assert (len(b_val), len(v_val)) == (202, 202)
    assert len(t_val) == round(max_rows * 0.25)  # the rows read split 80 / 20, as without a cap
    uncapped = D.load_splits(DataConfig(name="criteo_binary", dataset_dir=str(ds), max_rows=5000), model, 0)[0]
    assert len(uncapped) == 1255


def test_missing_meta_json_is_one_error_line_exit_2(tmp_path: Path) -> None:
    """`python train.py data=criteo_binary` on a directory without meta.json: exit 2, one `error:` line naming the
    key and the fix, no traceback, no run directory left."""
    import subprocess
    import sys

    empty = tmp_path / "empty"
    empty.mkdir()
    run = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            "train.py",
            "data=criteo_binary",
            f"data.dataset_dir={empty}",
            "device=cpu",
            f"hydra.run.dir={run}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = (
        f"error: config key `data.dataset_dir`: {str(empty)!r} has no meta.json; build the dataset with "
        f"`python data/preprocess_criteo.py --layout terabyte --input-dir <day files> --out {empty}`"
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert line in r.stderr.splitlines()
    assert "Traceback" not in r.stderr
    assert not run.exists()  # a refused launch leaves no run directory behind


def test_resumed_binary_batches_continue_where_the_checkpoint_stopped(ds: Path) -> None:
    """``start_step`` (a resumed run's step count) skips that many batches: the binary loader then yields the
    same batches as the tail of an uninterrupted pass, as the in-memory sources do."""
    train, _, _ = B.load_splits(str(ds), ROWS, None, multi_hot_files=False)
    mh = B.make_multi_hot(str(ds), BF.read_dataset_meta(str(ds)), "on_the_fly", SIZES, 0)
    kw = dict(
        global_batch=100,
        rank=1,
        world_size=2,
        epochs=2,
        max_steps=20,
        feature_names=FEATURE_NAMES,
        multi_hot=mh,
        shuffle=False,
        seed=0,
    )
    whole = list(D.train_batches(train, **kw))
    resumed = list(D.train_batches(train, start_step=15, **kw))
    assert len(whole) == 20 and len(resumed) == 5  # 13 batches an epoch: step 15 is the second epoch's third
    for got, want in zip(resumed, whole[15:]):
        assert torch.equal(got.dense_features, want.dense_features) and torch.equal(got.labels, want.labels)
        assert torch.equal(got.sparse_features.values(), want.sparse_features.values())
