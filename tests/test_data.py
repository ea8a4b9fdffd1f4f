"""Multi-hot expansion, per-rank batch layout, eval padding and the synthetic teacher."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from dlrm import data as D
from dlrm.config import DataConfig, ModelConfig
from dlrm.errors import InputError
from dlrm.model import FEATURE_NAMES


def test_multi_hot_follows_the_mlperf_reference_procedure() -> None:
    rows, sizes = [50, 7, 3], [3, 1, 5]
    mh = D.MultiHot(rows, sizes, seed=0)
    # The reference: np.random.seed(0), then per table in order randint(0, rows, (rows, size - 1)),
    # prepended with the id itself.
    np.random.seed(0)
    expect = [
        np.concatenate([np.arange(r)[:, None], np.random.randint(0, r, size=(r, m - 1))], axis=1)
        for r, m in zip(rows, sizes)
    ]
    ids = torch.tensor([0, 49, 3])
    np.testing.assert_array_equal(mh.bags(0, ids).numpy(), expect[0][[0, 49, 3]].reshape(-1))
    np.testing.assert_array_equal(mh.bags(1, torch.tensor([6, 2])).numpy(), [6, 2])
    np.testing.assert_array_equal(mh.bags(2, torch.tensor([2])).numpy(), expect[2][2])
    assert mh.bags(0, ids)[::3].tolist() == [0, 49, 3]  # each bag starts with its 1-hot id


def test_multi_hot_refuses_huge_tables_with_a_fix() -> None:
    """The tables are int32 ``[rows, size]``: 50 M x 100 x 4 bytes = 18.6 GiB; a table of size 1 needs none."""
    from dlrm.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        D.MultiHot([50_000_000, 10**9], [100, 1])
    assert str(e.value) == (
        "data.multi_hot: the MLPerf expansion tables would take 18.6 GiB of memory (limit 16 GiB); cap the tables "
        "with model.row_cap=<rows> or keep ids 1-hot with data.multi_hot=false"
    )


def _split(n: int) -> D.Split:
    g = torch.Generator().manual_seed(0)
    return D.Split(
        torch.randn(n, 13, generator=g),
        torch.randint(0, 10, (n, 26), generator=g),
        (torch.rand(n, generator=g) < 0.5).float(),
        "train",
    )


def test_kjt_batch_shapes() -> None:
    sp = _split(8)
    mh = D.MultiHot([10] * 26, [2] * 25 + [5], seed=0)
    b = D.to_batch(sp, torch.arange(4), FEATURE_NAMES, mh)
    assert b.dense_features.shape == (4, 13) and b.labels.shape == (4,)
    kjt = b.sparse_features
    assert kjt.keys() == FEATURE_NAMES
    assert kjt.lengths().tolist() == [2] * (25 * 4) + [5] * 4
    assert kjt.values().numel() == 4 * (2 * 25 + 5)
    one_hot = D.to_batch(sp, torch.arange(4), FEATURE_NAMES, None).sparse_features
    assert one_hot["cat_3"].values().tolist() == sp.ids[:4, 3].tolist()


def _global_batches(n, gb, world):
    """Concatenate the ranks' batches of each step back into global batches of row labels."""
    sp = _split(n)
    sp.labels = torch.arange(n, dtype=torch.float32)  # row numbers as labels
    per_rank = [
        list(
            D.train_batches(
                sp,
                global_batch=gb,
                rank=r,
                world_size=world,
                epochs=1,
                max_steps=None,
                feature_names=FEATURE_NAMES,
                multi_hot=None,
                shuffle=False,
                seed=0,
            )
        )
        for r in range(world)
    ]
    assert len({len(p) for p in per_rank}) == 1, "every rank must run the same number of steps"
    return [torch.cat([p[i].labels for p in per_rank]).long().tolist() for i in range(len(per_rank[0]))]


def test_global_batches_do_not_depend_on_world_size() -> None:
    one, two = _global_batches(103, 16, 1), _global_batches(103, 16, 2)
    four = _global_batches(103, 16, 4)
    assert one[:-1] == two[:-1] == four[:-1]
    assert one[-1] == list(range(96, 103))  # the last partial batch is trained
    assert two[-1] == list(range(96, 102))  # 7 rows over 2 ranks: 3 each, 1 left out
    assert four[-1] == [96, 97, 98, 99]  # 7 rows over 4 ranks: 1 each


def test_max_steps_and_epochs_and_shuffle() -> None:
    sp = _split(40)
    kw = dict(global_batch=10, rank=0, world_size=1, feature_names=FEATURE_NAMES, multi_hot=None, seed=3)
    assert len(list(D.train_batches(sp, epochs=3, max_steps=None, shuffle=False, **kw))) == 12
    assert len(list(D.train_batches(sp, epochs=3, max_steps=7, shuffle=False, **kw))) == 7
    sp.labels = torch.arange(40, dtype=torch.float32)
    ep = [b.labels for b in D.train_batches(sp, epochs=2, max_steps=None, shuffle=True, **kw)]
    first, second = torch.cat(ep[:4]), torch.cat(ep[4:])
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(40))
    assert first.tolist() != second.tolist()


@pytest.mark.parametrize("n,world", [(10, 2), (1, 2), (7, 4), (0, 2)])
def test_eval_batches_cover_every_row_once_and_pad_with_zero_weight(n: int, world: int) -> None:
    sp = _split(max(n, 1))
    if n == 0:
        sp = D.Split(sp.dense[:0], sp.ids[:0], sp.labels[:0], "val")
    sp.labels = torch.arange(len(sp), dtype=torch.float32)
    seen, counts = [], []
    for r in range(world):
        out = (
            list(
                D.eval_batches(sp, batch_size=3, rank=r, world_size=world, feature_names=FEATURE_NAMES, multi_hot=None)
            )
            if n
            else []
        )
        counts.append(len(out))
        for b, w in out:
            assert b.labels.shape == (min(3, -(-n // world)),)  # never longer than the longest share
            seen += b.labels[w > 0].long().tolist()
    assert len(set(counts)) == 1
    assert sorted(seen) == list(range(n))


def test_synthetic_is_learnable_and_deterministic() -> None:
    cfg = DataConfig(num_train_samples=4000, num_val_samples=1000, num_test_samples=300)
    rows = ModelConfig().table_rows
    tr, va, te = D.load_synthetic(cfg, rows, seed=0)
    tr2, _, _ = D.load_synthetic(cfg, rows, seed=5)
    assert (len(tr), len(va), len(te)) == (4000, 1000, 300)
    assert D.load_synthetic(DataConfig(num_test_samples=0), rows, seed=0)[2] is None
    assert torch.equal(tr.ids, tr2.ids) and torch.equal(tr.labels, tr2.labels)
    assert 0.15 < float(tr.labels.mean()) < 0.4
    assert (tr.ids < torch.tensor(rows)).all()
    teacher = D.Teacher([min(r, D.SYNTHETIC_MAX_VOCAB) for r in rows], cfg.teacher_dim, cfg.teacher_seed)
    assert roc_auc_score(va.labels.numpy(), teacher.logits(va.dense, va.ids).numpy()) > 0.8


def _tsv(path, n: int) -> str:
    """``n`` valid Criteo lines whose I1 is the 0-based row number (to tell the rows apart after the split)."""
    lines = ["\t".join([str(i % 2), str(i)] + [""] * 12 + [""] * 26) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _row_numbers(split: D.Split) -> list:
    return torch.round(torch.expm1(split.dense[:, 0])).long().tolist()  # I1 = log(row + 1)


def test_max_rows_caps_the_training_rows_of_a_tsv(tmp_path) -> None:
    """``data.max_rows`` counts training rows: 40 train and, without val_path, the next 10 validate (the rows read
    split by val_fraction 0.2); a file too short for the cap splits as without one; val_path is read whole."""
    rows = ModelConfig().table_rows
    train_path = _tsv(tmp_path / "train.tsv", 100)
    tr, va, _ = D.load_criteo_tsv(DataConfig(name="criteo_tsv", train_path=train_path, max_rows=40), rows)
    assert (_row_numbers(tr), _row_numbers(va)) == (list(range(40)), list(range(40, 50)))
    assert va.describe_rows(0, len(va)) == f"{train_path} lines 41-50"
    tr, va, _ = D.load_criteo_tsv(DataConfig(name="criteo_tsv", train_path=train_path, max_rows=90), rows)
    assert (len(tr), len(va)) == (80, 20)  # 100 rows < 90 + 23: the whole file, split 80 / 20
    assert [len(s) for s in D.load_criteo_tsv(DataConfig(name="criteo_tsv", train_path=train_path), rows)[:2]] == [
        80,
        20,
    ]
    val_path = _tsv(tmp_path / "val.tsv", 30)
    tr, va, _ = D.load_criteo_tsv(
        DataConfig(name="criteo_tsv", train_path=train_path, val_path=val_path, max_rows=40), rows
    )
    assert (len(tr), len(va)) == (40, 30)
    assert D.held_out_rows(8000, 0.2) == 2000 and D.held_out_rows(1, 0.2) == 1 and D.held_out_rows(30, 0.5) == 30


def test_share_rare_ids_counts_training_rows_only() -> None:
    """Per table, ids seen fewer than min_id_count times in training, and ids unseen there, become row 0 in
    every split; the inputs are left as they were."""
    ids = torch.zeros(6, 26, dtype=torch.int64)
    ids[:, 0] = torch.tensor([5, 5, 7, 9, 9, 9])
    ids[:, 1] = torch.tensor([1, 2, 3, 4, 5, 6])
    val_ids = torch.zeros(4, 26, dtype=torch.int64)
    val_ids[:, 0] = torch.tensor([5, 7, 11, 9])
    val_ids[:, 1] = torch.tensor([1, 1, 1, 1])
    train = D.Split(torch.zeros(6, 13), ids, torch.zeros(6), "train")
    val = D.Split(torch.zeros(4, 13), val_ids, torch.zeros(4), "val")
    before = (ids.clone(), val_ids.clone())
    tr, va, te = D.share_rare_ids((train, val, None), 2)
    assert te is None
    assert tr.ids[:, 0].tolist() == [5, 5, 0, 9, 9, 9] and tr.ids[:, 1].tolist() == [0] * 6
    assert va.ids[:, 0].tolist() == [5, 0, 0, 9] and va.ids[:, 1].tolist() == [0] * 4
    assert int(tr.ids[:, 2:].abs().sum()) == 0 and tr.dense is train.dense and va.labels is val.labels
    assert torch.equal(ids, before[0]) and torch.equal(val_ids, before[1])
    tr3, va3, _ = D.share_rare_ids((train, val, None), 3)
    assert tr3.ids[:, 0].tolist() == [0, 0, 0, 9, 9, 9] and va3.ids[:, 0].tolist() == [0, 0, 0, 9]
    tr1, va1, _ = D.share_rare_ids((train, val, None), 1)  # only the ids unseen in training
    assert (
        torch.equal(tr1.ids, ids)
        and va1.ids[:, 0].tolist() == [5, 7, 0, 9]
        and torch.equal(va1.ids[:, 1:], val_ids[:, 1:])
    )
    assert D.share_rare_ids((train, val, None), 0)[0] is train


def test_min_id_count_applies_to_the_tsv_splits(tmp_path) -> None:
    """``data.min_id_count=2`` on a 10-line TSV: C1 ``a`` (twice) and ``c`` (3 times) keep their rows
    (``int(hex, 16) % rows``), ``b`` and ``d`` (once each) and the missing value share row 0; in the validation
    rows (lines 9-10) ``a`` keeps its row and ``b`` (once in training) does not."""
    c1 = ["a", "a", "b", "", "c", "c", "c", "d", "a", "b"]
    lines = ["\t".join(["0", str(i)] + [""] * 12 + [c1[i]] + [""] * 25) for i in range(10)]
    path = tmp_path / "t.tsv"
    path.write_text("\n".join(lines) + "\n")
    model = ModelConfig()
    assert model.table_rows[0] == 2000
    tr, va, _ = D.load_splits(DataConfig(name="criteo_tsv", train_path=str(path), min_id_count=2), model, 0)
    assert tr.ids[:, 0].tolist() == [10, 10, 0, 0, 12, 12, 12, 0] and va.ids[:, 0].tolist() == [10, 0]
    tr, va, _ = D.load_splits(DataConfig(name="criteo_tsv", train_path=str(path)), model, 0)
    assert tr.ids[:, 0].tolist() == [10, 10, 11, 0, 12, 12, 12, 13] and va.ids[:, 0].tolist() == [10, 11]


def test_every_tsv_path_is_checked_before_the_training_file_is_parsed(tmp_path) -> None:
    bad_train = tmp_path / "train.tsv"
    bad_train.write_text("label-is-not-a-row\n")  # parsing it would fail at line 1
    (tmp_path / "test_dir").mkdir()
    cfg = DataConfig(name="criteo_tsv", train_path=str(bad_train), test_path=str(tmp_path / "test_dir"))
    with pytest.raises(InputError) as e:
        D.load_criteo_tsv(cfg, ModelConfig().table_rows)
    assert str(e.value) == (
        f"config key `data.test_path`: {str(tmp_path / 'test_dir')!r} is a directory, not a file; "
        "pass data.test_path=<a Criteo TSV file in it, plain or gzip>"
    )
    cfg = DataConfig(name="criteo_tsv", train_path=str(bad_train), val_path=str(tmp_path / "nope.tsv"))
    with pytest.raises(FileNotFoundError, match=r"config key `data.val_path`: no such file .*nope\.tsv"):
        D.load_criteo_tsv(cfg, ModelConfig().table_rows)
