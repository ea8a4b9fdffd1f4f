"""Checkpoints: exact resume, SIGTERM, kill -9 mid-save with a torchrun restart, reshard on load, export, and
(GPU hosts: ``pytest -m gpu``) async staging on a CUDA stream.

    .venv/bin/python -m pytest -q tests/test_checkpoint.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from test_train_e2e import BIN, ENV, records, run

from conftest import REPO, output_lines, run_gloo

SMALL = [
    "data.batch_size=64",
    "data.num_train_samples=4096",
    "data.num_val_samples=256",
    "data.num_test_samples=0",
    "eval.every_n_steps=null",
    "eval.at_end=false",
    "logger.log_every_n_steps=1",
    "logger.train_auc=false",
]


def _losses(run_dir: Path) -> Dict[int, float]:
    """step -> logged loss (log_every_n_steps=1: the loss of that step); a re-run step keeps its last record."""
    return {r["step"]: r["loss"] for r in records(run_dir) if "loss" in r}


def _assert_same_checkpoints(a: Path, b: Path) -> None:
    from dlrm.export import full_state_dict

    sa, sb = full_state_dict(str(a)), full_state_dict(str(b))
    assert sorted(sa) == sorted(sb)
    diff = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not diff, f"differ bitwise: {diff[:5]}"


def test_exact_resume_sigterm_and_restart(tmp_path: Path) -> None:
    """40 steps straight == 10 steps, restart, SIGTERM at step k, restart, the rest: per-step losses, final
    weights and optimizer state bit-identical (1 process)."""
    straight, part = tmp_path / "straight", tmp_path / "part"
    ck = f"checkpoint.dir={part / 'ck'}"
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={straight}",
            *SMALL,
            "trainer.max_steps=40",
            "checkpoint.every_n_steps=10",
        ]
    )
    assert p.returncode == 0, p.stdout + p.stderr
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={part}",
            *SMALL,
            ck,
            "trainer.max_steps=10",
            "checkpoint.every_n_steps=10",
        ]
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert (part / "ck" / "step_10" / ".metadata").is_file()

    # resume from step 10 and preempt it with SIGTERM once step 12 is logged
    proc = subprocess.Popen(
        [sys.executable, "train.py", f"hydra.run.dir={part}", *SMALL, ck, "trainer.max_steps=40"],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out: List[str] = []
    for line in output_lines(proc, timeout=300):
        out.append(line)
        if line.startswith("step     12/"):
            os.kill(proc.pid, signal.SIGTERM)
    rc = proc.wait(timeout=60)
    text = "".join(out)
    assert rc == 0, text
    assert "resumed from" in text and "step_10 at step 10" in text, text
    sig = [line for line in out if "SIGTERM: finished step" in line]
    assert sig, f"the run ended before SIGTERM took effect:\n{text}"
    k = int(sig[0].split("SIGTERM: finished step ")[1].split(",")[0])
    assert 12 <= k < 40 and (part / "ck" / f"step_{k}" / ".metadata").is_file(), text

    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={part}",
            *SMALL,
            ck,
            "trainer.max_steps=40",
            "checkpoint.every_n_steps=10",
        ]
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"step_{k} at step {k}" in p.stdout
    a, b = _losses(straight), _losses(part)
    assert sorted(a) == list(range(1, 41)) and sorted(b) == list(range(1, 41))
    assert [b[s] for s in range(1, 41)] == [a[s] for s in range(1, 41)]
    _assert_same_checkpoints(straight / "checkpoints" / "step_40", part / "ck" / "step_40")
    # keep_last=2 (default) pruned the older ones
    assert sorted(os.listdir(straight / "checkpoints")) == ["step_30", "step_40"]


def test_kill9_mid_save_then_restart_resumes(tmp_path: Path) -> None:
    """2 gloo ranks under ``torchrun --max-restarts 1`` (torchx component ``--max_restarts``): rank 1 is SIGKILLed
    while writing step 10 (tests/kill_during_save.py); torchrun restarts both workers in place; the restart ignores
    (and removes) the partial step_10.tmp, resumes from step_5 and finishes; the re-run steps 6-10 log the same
    losses as the first attempt (exact resume with 2 processes).

    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (set by launch/components.py): without it the restarted rank 1 can
    read rank 0's gloo address of the first attempt from torchrun's shared store and fail to connect
    (pytorch/pytorch#135712); the trainer warns about that combination."""
    d = tmp_path / "run"
    cmd = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc_per_node",
        "2",
        "--max-restarts",
        "1",
        "tests/kill_during_save.py",
        "10:1",
        f"hydra.run.dir={d}",
        *SMALL,
        "trainer.max_steps=15",
        "checkpoint.every_n_steps=5",
    ]
    p = subprocess.run(
        cmd,
        cwd=REPO,
        env={**ENV, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    assert "killing rank 1 mid-save" in text and "exitcode: -9" in text, text
    assert "ignoring incomplete checkpoint" in text and "step_10.tmp" in text, text
    assert "step_5 at step 5" in text, text
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun" not in text, text
    assert sorted(os.listdir(d / "checkpoints")) == ["step_10", "step_15"]
    recs = [r for r in records(d) if "loss" in r]
    restart = next(i for i in range(1, len(recs)) if recs[i]["step"] <= recs[i - 1]["step"])
    first = {r["step"]: r["loss"] for r in recs[:restart]}
    again = {r["step"]: r["loss"] for r in recs[restart:]}
    assert sorted(again) == list(range(6, 16)) and set(range(1, 11)) <= set(first), (first, again)
    assert [again[s] for s in range(6, 11)] == [first[s] for s in range(6, 11)]


# ----------------------------------------------------------------------------------------- reshard on load
# Plans by name: per table index, a sharding type.
def _plan_types(name: str) -> Dict[int, str]:
    if name == "mixed":  # row_wise, table_wise, column_wise and data_parallel tables
        return {
            t: ("row_wise" if t < 8 else "table_wise" if t < 16 else "column_wise" if t < 21 else "data_parallel")
            for t in range(26)
        }
    if name == "table_wise":
        return {t: "table_wise" for t in range(26)}
    if name == "spread":  # from table_wise: to row_wise and data_parallel (whose state is the dense Adagrad's)
        return {t: ("data_parallel" if t < 8 else "row_wise" if t < 16 else "table_wise") for t in range(26)}
    if name == "reshuffled":  # from "mixed": row_wise -> data_parallel -> table_wise -> row_wise
        return {
            t: ("data_parallel" if t < 8 else "row_wise" if t < 16 else "column_wise" if t < 21 else "table_wise")
            for t in range(26)
        }
    if name == "column_wise_head":  # the row-wise tables 0-7 become column_wise: their momentum cannot carry over
        return {t: ("column_wise" if t < 8 else "table_wise") for t in range(26)}
    raise KeyError(name)


def _build(plan_name: str, cfg):
    """The trainer's model, DMP under a plan of sharding types by name, fused and dense optimizers."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.optim.keyed import CombinedOptimizer

    from dlrm.model import build_model
    from dlrm.process_group import init_distributed
    from dlrm.sharding import EmbeddingBagSharder, dense_optimizer, fuse_embedding_optimizer, topology

    info = init_distributed("cpu")
    torch.manual_seed(1)
    model = build_model(cfg.model, dense_device=torch.device("cpu"))
    fuse_embedding_optimizer(model, cfg.optimizer)
    cons = {
        f"t_cat_{t}": ParameterConstraints(sharding_types=[st], min_partition=8)
        for t, st in _plan_types(plan_name).items()
    }
    topo = topology(info.world_size, info.local_world_size, "cpu", cfg.sharding)
    planner = EmbeddingShardingPlanner(topology=topo, batch_size=64, constraints=cons)
    # the project's sharder: TorchRec's stock one refuses row_wise on CPU
    plan = planner.collective_plan(model, [EmbeddingBagSharder()], dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(
        module=model, device=torch.device("cpu"), plan=plan, sharders=[EmbeddingBagSharder()]
    )
    return info, dmp, CombinedOptimizer([dmp.fused_optimizer, dense_optimizer(dmp, cfg.optimizer)])


def _gathered(dmp, opt) -> Dict[str, torch.Tensor]:
    """Every model and optimizer value as a checkpoint names it, whole (the shards of all ranks assembled)."""
    import torch.distributed as dist

    from dlrm.checkpoint import app_state
    from dlrm.checkpoint.state_names import flatten_state

    flat = flatten_state(app_state(dmp, opt))
    mine = (_local_pieces(app_state(dmp, opt)), {k: (tuple(v.size()), v.dtype) for k, v in flat.items()})
    parts: List[tuple] = [()] * dist.get_world_size()
    dist.all_gather_object(parts, mine)  # a rank holds optimizer state only for the tables it has shards of
    out = {}
    for k, (size, dtype) in sorted({k: m for _, meta in parts for k, m in meta.items()}.items()):
        full = torch.full(size, float("nan"), dtype=dtype)
        for pieces, _ in parts:
            for off, t in pieces.get(k, []):
                full[tuple(slice(o, o + n) for o, n in zip(off, t.shape))] = t
        out[k] = full
    return out


def _reshard_worker(rank: int, world: int, ops: List[tuple]) -> List[object]:
    """Run ``ops`` in order, each on a fresh build: ``("train_save", plan, new, old)`` trains 4 steps and saves
    the checkpoint ``new`` (this code's layout) and ``old`` (the earlier layout: the ``CombinedOptimizer`` state
    as is); ``("load", plan, path)`` loads ``path``. Each returns :func:`_gathered` plus the data_parallel
    tables' and the first MLP parameter's Adagrad ``step``, and the validation logits; a load that fails
    returns its error text."""
    import torch.distributed.checkpoint as dcp
    from torchrec.distributed.train_pipeline import TrainPipelineBase

    from dlrm import data as data_mod
    from dlrm.checkpoint import CheckpointError, app_state, load_app_state
    from dlrm.config import compose, to_config
    from dlrm.model import FEATURE_NAMES

    cfg = to_config(
        compose(
            [
                "data.num_train_samples=1024",
                "data.num_val_samples=128",
                "data.multi_hot=false",
                "optimizer.sparse_type=rowwise_adagrad",
                "optimizer.lr=0.05",
            ]
        )
    )
    train, val, _ = data_mod.load_splits(cfg.data, cfg.model, cfg.seed)
    results: List[object] = []
    for op, plan_name, *paths in ops:
        _, dmp, opt = _build(plan_name, cfg)
        if op == "load":
            try:
                load_app_state(paths[0], dmp, opt)
            except CheckpointError as e:
                results.append(str(e))
                continue
        else:  # train 4 steps so that weights and Adagrad state are non-trivial
            pipe = TrainPipelineBase(dmp, opt, torch.device("cpu"))
            it = data_mod.train_batches(
                train,
                global_batch=128,
                rank=rank,
                world_size=world,
                epochs=1,
                max_steps=4,
                feature_names=FEATURE_NAMES,
                multi_hot=None,
                shuffle=False,
                seed=0,
            )
            for _ in range(4):
                pipe.progress(it)
            dcp.save(app_state(dmp, opt), checkpoint_id=paths[0])
            dcp.save({"model": dmp.state_dict(), "optim": opt.state_dict()["state"]}, checkpoint_id=paths[1])
        types = {n: ps.sharding_type for mp in dmp.plan.plan.values() for n, ps in mp.items()}
        named = [(k, v["step"]) for k, v in opt.state_dict()["state"].items() if "step" in v]
        steps = [s for k, s in named if "embedding_bags" in k]  # data_parallel tables' dense Adagrad
        mlp_step = next(s for k, s in named if "embedding_bags" not in k)
        dmp.eval()
        batch = data_mod.to_batch(val, torch.arange(128), FEATURE_NAMES, None)  # the same rows on every rank
        with torch.no_grad():
            logits = dmp(batch)[1][1].clone()
        results.append(
            {
                "types": types,
                "state": _gathered(dmp, opt),
                "steps": [float(s) for s in steps],
                "mlp_step": float(mlp_step),
                "logits": logits,
            }
        )
    return results


def _assert_same_state(got: dict, saved: dict) -> None:
    assert isinstance(got, dict), got  # else the load's error
    assert sorted(got["state"]) == sorted(saved["state"])
    diff = [k for k, v in saved["state"].items() if not torch.equal(got["state"][k], v)]
    assert not diff, f"differ bitwise: {diff[:5]}"
    assert torch.equal(got["logits"], saved["logits"]) or torch.allclose(got["logits"], saved["logits"], atol=1e-5)
    assert all(s == got["mlp_step"] == 4.0 for s in got["steps"])  # a data_parallel table's step: the MLPs'


def test_reshard_on_load_restores_every_value_and_export(tmp_path: Path) -> None:
    """Saved by 1 rank (all table_wise) and by 2 ranks (row_wise, table_wise, column_wise and data_parallel
    tables), row-wise Adagrad: loaded 2 -> 1, 1 -> 4 and 2 -> 4 ranks under other plans (tables moving
    between fused shardings and data_parallel, whose state is the dense Adagrad's), every model and optimizer
    value gathered whole equals the saved one bitwise, from this layout and from the earlier one (the
    optimizer's own names, which differ between 1 and several ranks). Row-wise momentum into a column_wise
    table is refused, naming the table. The export loads into the plain model with the same predictions."""
    from dlrm.config import compose, to_config
    from dlrm.data import load_splits, to_batch
    from dlrm.export import main as export_main
    from dlrm.model import FEATURE_NAMES

    a1, o1, a2, o2 = (str(tmp_path / x) for x in ("a1", "o1", "a2", "o2"))
    (s2,) = run_gloo(2, _reshard_worker, [("train_save", "mixed", a2, o2)])[0]
    assert set(s2["types"].values()) == {"row_wise", "table_wise", "column_wise", "data_parallel"}, s2["types"]
    r21, r21_old, s1 = run_gloo(
        1,
        _reshard_worker,
        [("load", "reshuffled", a2), ("load", "reshuffled", o2), ("train_save", "table_wise", a1, o1)],
    )[0]
    r14, r14_old, r24, r24_cw = run_gloo(
        4,
        _reshard_worker,
        [("load", "spread", a1), ("load", "spread", o1), ("load", "reshuffled", a2), ("load", "column_wise_head", a2)],
    )[0]
    assert r14["types"]["t_cat_0"] == "data_parallel" and r24["types"]["t_cat_21"] == "table_wise", r24["types"]
    for got, saved in ((r21, s2), (r21_old, s2), (r14, s1), (r14_old, s1), (r24, s2)):
        _assert_same_state(got, saved)
    assert isinstance(r24_cw, str) and "t_cat_0's optimizer state does not carry over to this plan" in r24_cw, r24_cw

    # export: the unsharded model, loaded with one call
    from dlrm.export import load_model

    out = tmp_path / "model.pt"
    assert export_main([a2, str(out)]) == 0
    cfg = to_config(compose(["data.num_train_samples=1024", "data.num_val_samples=128", "data.multi_hot=false"]))
    plain = load_model(str(out), cfg.model)  # a bare DCP checkpoint (no meta.json): the model config is given
    _, val, _ = load_splits(cfg.data, cfg.model, cfg.seed)
    with torch.no_grad():
        logits = plain(to_batch(val, torch.arange(128), FEATURE_NAMES, None))[1][1]
    assert torch.allclose(logits, s2["logits"], atol=1e-5, rtol=0), (logits - s2["logits"]).abs().max()
    assert export_main([str(tmp_path / "nothing"), str(out)]) == 2


def test_resume_errors_are_clear(tmp_path: Path) -> None:
    from dlrm.checkpoint import resolve_checkpoint

    (tmp_path / "step_3.tmp").mkdir()
    with pytest.raises(FileNotFoundError, match="incomplete save"):
        resolve_checkpoint(str(tmp_path / "step_3.tmp"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_checkpoint(str(tmp_path / "nope"))


# ------------------------------------------------------------------------------------------ damaged checkpoints
@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of 8 steps saving step_4 and step_8 (synchronously), kept for the damage tests to copy."""
    d = tmp_path_factory.mktemp("ck") / "run"
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={d}",
            *SMALL,
            "trainer.max_steps=8",
            "checkpoint.every_n_steps=4",
            "checkpoint.async_save=false",
            "checkpoint.keep_last=null",
        ]
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return d


def _damaged_copy(src: Path, dst: Path, name: str, how: str) -> Path:
    """A copy of the run whose step_8 has file ``name`` truncated (``how="truncate"``) or one byte flipped in its
    middle (``"flip"``, same size)."""
    import shutil

    shutil.copytree(src, dst)
    f = dst / "checkpoints" / "step_8" / name
    data = bytearray(f.read_bytes())
    if how == "truncate":
        f.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    return dst / "checkpoints"


def test_every_checkpoint_has_a_manifest_of_its_files(two_checkpoints: Path) -> None:
    import json
    import zlib

    from dlrm.checkpoint import BLOCK, verify_checkpoint

    for step in (4, 8):
        ck = two_checkpoints / "checkpoints" / f"step_{step}"
        manifest = json.loads((ck / "manifest.json").read_text())
        names = sorted(p.name for p in ck.iterdir() if p.name != "manifest.json")
        assert sorted(manifest["files"]) == names  # every other file, the rank parts merged and removed
        assert {"meta.json", "plan.json", ".metadata", "rank_0.pt", "__0_0.distcp"} <= set(names)
        for name, entry in manifest["files"].items():
            data = (ck / name).read_bytes()
            assert entry["size"] == len(data)
            assert entry["crc32"] == [zlib.crc32(data[i : i + BLOCK]) for i in range(0, max(len(data), 1), BLOCK)]
        assert verify_checkpoint(str(ck)) is None


def test_a_saved_plan_is_reused_only_for_the_inputs_it_was_made_from(two_checkpoints: Path) -> None:
    """``meta.json`` records what the plan was made from; a resume whose batch, sharding or model config differs
    plans anew instead of loading a plan made for another problem."""
    from omegaconf import OmegaConf

    from dlrm.checkpoint import planning_inputs, read_checkpoint_meta, saved_plan
    from dlrm.config import Config
    from dlrm.process_group import DistInfo

    ck = str(two_checkpoints / "checkpoints" / "step_8")
    meta = read_checkpoint_meta(ck)
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), meta["config"]))
    inputs = planning_inputs(cfg, meta["global_batch"])
    assert inputs == meta["planning"]
    info = DistInfo(0, 1, 0, 1, torch.device("cpu"), "gloo")
    assert saved_plan(ck, info, inputs) == os.path.join(ck, "plan.json")
    assert saved_plan(ck, info, planning_inputs(cfg, 2 * meta["global_batch"])) is None
    cfg.sharding.hbm_cap_gb = 1.0
    assert saved_plan(ck, info, planning_inputs(cfg, meta["global_batch"])) is None


def test_a_manifest_of_the_wrong_shape_is_a_verdict_not_a_crash(two_checkpoints: Path, tmp_path: Path) -> None:
    """A manifest whose entries lack a field is reported as damage (so every rank of a job reaches the
    all-gather of verdicts) instead of raising."""
    import json
    import shutil

    from dlrm.checkpoint import verify_checkpoint

    ck = tmp_path / "step_8"
    shutil.copytree(two_checkpoints / "checkpoints" / "step_8", ck)
    manifest = json.loads((ck / "manifest.json").read_text())
    del manifest["files"]["rank_0.pt"]["size"]
    (ck / "manifest.json").write_text(json.dumps(manifest))
    assert verify_checkpoint(str(ck)) == "manifest.json does not describe the files (KeyError: 'size')"


@pytest.mark.parametrize(
    "name, how, says",
    [
        ("__0_0.distcp", "truncate", r"__0_0\.distcp has [\d,]+ bytes where the manifest records [\d,]+"),
        ("meta.json", "truncate", r"meta\.json has [\d,]+ bytes where the manifest records"),
        ("rank_0.pt", "flip", r"rank_0\.pt differs from its manifest checksum at bytes 0-"),
    ],
)
def test_resume_auto_skips_a_damaged_checkpoint(
    two_checkpoints: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, how: str, says: str
) -> None:
    """``resume=auto`` verifies the newest checkpoint; damaged, it is named with the file and the previous one is
    taken. ``resume=<that path>`` and ``python -m dlrm.export`` of it fail with one message naming the file."""
    import logging
    import re

    from dlrm.checkpoint import CheckpointError, choose_checkpoint
    from dlrm.config import CheckpointConfig
    from dlrm.export import main as export_main
    from dlrm.process_group import DistInfo

    root = _damaged_copy(two_checkpoints, tmp_path / "run", name, how)
    info = DistInfo(0, 1, 0, 1, torch.device("cpu"), "gloo")
    with caplog.at_level(logging.WARNING, logger="dlrm"):
        chosen = choose_checkpoint(CheckpointConfig(resume="auto"), str(root), info)
    assert chosen == str(root / "step_4")
    assert re.search(
        rf"checkpoint {re.escape(str(root / 'step_8'))} is damaged: {says}.*; trying the previous "
        "checkpoint",
        caplog.text,
    ), caplog.text
    with pytest.raises(CheckpointError, match=rf"^checkpoint .*step_8 is damaged: {says}"):
        choose_checkpoint(CheckpointConfig(resume=str(root / "step_8")), str(root), info)
    assert export_main([str(root / "step_8"), str(tmp_path / "m.pt")]) == 2
    if how == "truncate":  # sizes alone catch a truncation
        assert choose_checkpoint(CheckpointConfig(resume="auto", verify="size"), str(root), info) == str(
            root / "step_4"
        )


def test_damaged_checkpoint_end_to_end(two_checkpoints: Path, tmp_path: Path) -> None:
    """train.py with the newest checkpoint truncated resumes from the previous one (into its saved plan) and
    finishes; pointed at the damaged one it exits 2 with one error line naming the file, and leaves no run directory."""
    root = _damaged_copy(two_checkpoints, tmp_path / "run", "__0_0.distcp", "truncate")
    d = root.parent
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={d}",
            *SMALL,
            "trainer.max_steps=10",
            "checkpoint.every_n_steps=4",
            "checkpoint.async_save=false",
        ]
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    log = (d / "train.log").read_text()
    assert "step_8 is damaged: __0_0.distcp has" in log and "resumed from" in log and "step_4 at step 4" in log
    assert "resuming into the plan saved with" in log
    assert (root / "step_8" / "manifest.json").is_file()  # the run saved step 8 again, intact
    root = _damaged_copy(two_checkpoints, tmp_path / "run2", "__0_0.distcp", "truncate")
    bad = tmp_path / "bad"
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={bad}",
            *SMALL,
            "trainer.max_steps=10",
            f"checkpoint.resume={root / 'step_8'}",
        ]
    )
    assert p.returncode == 2, p.stdout[-3000:] + p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "step_8 is damaged: __0_0.distcp has" in errors[0], p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert not bad.exists()  # a refused launch leaves no run directory behind


def _copy_step(src: Path, dst: Path, drop: tuple = ()) -> Path:
    import shutil

    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    return dst


class _StateOnly:
    """What load_app_state reads of a model or an optimizer: ``state_dict()``."""

    def __init__(self, sd: dict) -> None:
        self.sd = sd

    def state_dict(self) -> dict:
        return self.sd


def test_unreadable_checkpoint_data_names_the_checkpoint_and_the_cause(
    two_checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """DCP reports a read failure as a CheckpointException, a BaseException: a truncated ``.distcp`` that no
    manifest describes (a bare DCP checkpoint) is one CheckpointError naming the first rank's cause, in a resume's
    load and in ``python -m dlrm.export`` (exit 2)."""
    import re

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from dlrm.checkpoint import CheckpointError, load_app_state
    from dlrm.export import main as export_main

    ck = _copy_step(two_checkpoints / "checkpoints" / "step_8", tmp_path / "bare", ("manifest.json", "meta.json"))
    data = ck / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:1000])
    md = FileSystemReader(str(ck)).read_metadata().state_dict_metadata
    model = {
        k[len("model.") :]: torch.empty(tuple(m.size), dtype=m.properties.dtype)
        for k, m in md.items()
        if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }
    optim: Dict[str, dict] = {}  # {parameter: {state name: tensor}} for every optimizer entry of the checkpoint
    for k, m in md.items():
        if k.startswith("optim.") and isinstance(m, TensorStorageMetadata):
            fqn = max((f for f in model if k.startswith(f"optim.{f}.")), key=len)
            optim.setdefault(fqn, {})[k[len(f"optim.{fqn}.") :]] = torch.empty(tuple(m.size), dtype=m.properties.dtype)
    cause = r"\(RuntimeError: PytorchStreamReader failed reading zip archive: [^\n]*\)"
    with pytest.raises(CheckpointError) as e:
        load_app_state(str(ck), _StateOnly(model), _StateOnly({"state": optim}))
    fix = "give another checkpoint.resume (auto takes the newest intact one)"
    assert re.fullmatch(
        rf"checkpoint {re.escape(str(ck))}: its data cannot be read {cause}; {re.escape(fix)}", str(e.value)
    )
    assert export_main([str(ck), str(tmp_path / "m.pt")]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"error: checkpoint {re.escape(str(ck))}: its data cannot be read {cause}; restore the file, or export "
        r"another checkpoint\n",
        err,
    ), err


def test_export_to_a_missing_directory_is_refused_before_loading(
    two_checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from dlrm.export import main as export_main

    ck = str(two_checkpoints / "checkpoints" / "step_8")
    out = tmp_path / "nonexist" / "m.pt"
    assert export_main([ck, str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: OUT {str(out)!r}: no such directory {str(out.parent)!r}; create it or pass another path\n"
    )
    assert export_main([ck, str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err
        == f"error: OUT {str(tmp_path)!r}: a directory; give the path of the .pt file to write\n"
    )
    assert not out.parent.exists()


def _no_gathering(*args, **kwargs):
    raise AssertionError("tables gathered before OUT was checked")


def test_export_refuses_an_existing_or_unwritable_out_before_loading(
    two_checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An existing OUT is kept unless ``--force``; an OUT that cannot be created (``/proc``, where ``os.access``
    passes for root) is refused before any table is gathered."""
    import dlrm.export
    from dlrm.export import main as export_main

    ck = str(two_checkpoints / "checkpoints" / "step_8")
    out = tmp_path / "m.pt"
    out.write_bytes(b"keep")
    with monkeypatch.context() as m:
        m.setattr(dlrm.export, "full_state_dict", _no_gathering)
        assert export_main([ck, str(out)]) == 2
        assert capsys.readouterr().err == (
            f"error: OUT {str(out)!r}: already exists; pass another path, or --force to overwrite it\n"
        )
        if Path("/proc/self").is_dir():
            assert export_main([ck, "/proc/model.pt"]) == 2
            assert capsys.readouterr().err == (
                "error: OUT '/proc/model.pt': directory '/proc' is not writable; pass another path\n"
            )
    assert out.read_bytes() == b"keep"
    assert export_main([ck, str(out), "--force"]) == 0
    assert sorted(torch.load(out)["state_dict"]) == sorted(dlrm.export.full_state_dict(ck, "model."))


@pytest.mark.parametrize(
    "raised,why",
    [
        (
            RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 64 vs 12"),
            "unexpected pos 64 vs 12",
        ),
        (OSError(28, "No space left on device"), "No space left on device"),
    ],
)
def test_export_write_failure_is_one_error_line_and_leaves_no_partial_file(
    two_checkpoints: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    raised: BaseException,
    why: str,
) -> None:
    from dlrm.export import main as export_main

    out = tmp_path / "m.pt"

    def failing_save(obj, f) -> None:
        Path(f).write_bytes(b"PK\x03\x04")  # the start of torch's zip, then the write fails
        raise raised

    monkeypatch.setattr(torch, "save", failing_save)
    assert export_main([str(two_checkpoints / "checkpoints"), str(out)]) == 2
    assert capsys.readouterr().err == f"error: OUT {str(out)!r}: cannot be written ({why}); pass another path\n"
    assert not out.exists()


def test_export_of_a_run_directory_names_its_checkpoint_directory(
    two_checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A run directory is not a checkpoint: the error gives the run's checkpoint directory (``checkpoint.dir`` of
    its config.yaml, else ``<run>/checkpoints``) where it holds complete checkpoints."""
    from dlrm.export import main as export_main

    neither = "is neither a step_<N> checkpoint (with .metadata and meta.json) nor a directory holding one"
    out = str(tmp_path / "m.pt")
    assert export_main([str(two_checkpoints), out]) == 2
    ck = str(two_checkpoints / "checkpoints")
    assert capsys.readouterr().err == (
        f"error: checkpoint {str(two_checkpoints)!r} {neither}; it is a run directory: give its checkpoint "
        f"directory {ck!r} (or a step_<N> in it)\n"
    )
    elsewhere = tmp_path / "run"  # trained with checkpoint.dir=<ck>
    elsewhere.mkdir()
    (elsewhere / "config.yaml").write_text(f"checkpoint:\n  dir: {ck}\n")
    assert export_main([str(elsewhere), out]) == 2
    assert capsys.readouterr().err == (
        f"error: checkpoint {str(elsewhere)!r} {neither}; it is a run directory: give its checkpoint "
        f"directory {ck!r} (or a step_<N> in it)\n"
    )
    (elsewhere / "config.yaml").unlink()
    assert export_main([str(elsewhere), out]) == 2
    assert capsys.readouterr().err == f"error: checkpoint {str(elsewhere)!r} {neither}\n"
    assert not Path(out).exists()


def test_a_checkpoint_without_its_manifest_is_damaged(two_checkpoints: Path, tmp_path: Path) -> None:
    """Every save writes manifest.json: a step_<N> without one was copied or written incompletely. ``resume=auto``
    falls back to the previous checkpoint; ``resume=<it>`` is refused."""
    from dlrm.checkpoint import CheckpointError, choose_checkpoint, verify_checkpoint
    from dlrm.config import CheckpointConfig
    from dlrm.process_group import DistInfo

    root = tmp_path / "ck"
    for step in (4, 8):
        _copy_step(two_checkpoints / "checkpoints" / f"step_{step}", root / f"step_{step}")
    (root / "step_8" / "manifest.json").unlink()
    missing = "manifest.json is missing (every save writes one: the checkpoint was copied or written incompletely)"
    assert verify_checkpoint(str(root / "step_8")) == missing
    info = DistInfo(0, 1, 0, 1, torch.device("cpu"), "gloo")
    assert choose_checkpoint(CheckpointConfig(resume="auto"), str(root), info) == str(root / "step_4")
    with pytest.raises(CheckpointError) as e:
        choose_checkpoint(CheckpointConfig(resume=str(root / "step_8")), str(tmp_path / "new"), info)
    assert str(e.value) == (
        f"checkpoint {root / 'step_8'} is damaged: {missing}; give another checkpoint.resume (auto takes the newest "
        "intact one)"
    )


def test_resuming_an_older_checkpoint_of_the_same_directory_is_refused(two_checkpoints: Path) -> None:
    """Saves beside step_8 of the abandoned run would be pruned against it and ``resume=auto`` would take it; in
    another ``checkpoint.dir`` the same checkpoint resumes."""
    from dlrm.checkpoint import choose_checkpoint
    from dlrm.config import CheckpointConfig
    from dlrm.errors import ConfigError
    from dlrm.process_group import DistInfo

    root = two_checkpoints / "checkpoints"
    info = DistInfo(0, 1, 0, 1, torch.device("cpu"), "gloo")
    with pytest.raises(ConfigError) as e:
        choose_checkpoint(CheckpointConfig(resume=str(root / "step_4")), str(root), info)
    assert str(e.value) == (
        f"config key `checkpoint.resume`: {root} holds step_8, newer than step_4; set checkpoint.dir=<a new "
        "directory> to branch from step_4, or move the newer checkpoints aside"
    )
    other = str(two_checkpoints / "branch")
    assert choose_checkpoint(CheckpointConfig(resume=str(root / "step_4")), other, info) == str(root / "step_4")
    assert choose_checkpoint(CheckpointConfig(resume=str(root / "step_8")), str(root), info) == str(root / "step_8")


def _run_facts(meta: dict, **data: object):
    from omegaconf import OmegaConf

    from dlrm.checkpoint import RunFacts
    from dlrm.config import Config

    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), meta["config"]))
    for k, v in data.items():
        if k == "seed":
            cfg.seed = v
        else:
            setattr(cfg.data, k, v)
    return RunFacts(meta["global_batch"], meta["steps_per_epoch"], 8, None, cfg)


@pytest.mark.parametrize(
    "change,line",
    [
        (
            dict(num_train_samples=2048),
            "config key `data.num_train_samples`: checkpoint {ck} was trained with data.num_train_samples=4096, this "
            "run has 2048; its step 8 would point at other rows: set data.num_train_samples=4096, or "
            "checkpoint.resume=none in a new checkpoint.dir to start fresh",
        ),
        (
            dict(shuffle=True),
            "config key `data.shuffle`: checkpoint {ck} was trained with data.shuffle=false, this run has true; its "
            "step 8 would point at other rows: set data.shuffle=false, or checkpoint.resume=none in a new "
            "checkpoint.dir to start fresh",
        ),
        (
            dict(name="criteo_binary", dataset_dir="/data/bin"),
            "config key `data.name`: checkpoint {ck} was trained with data.name=synthetic, this run has "
            "criteo_binary; its step 8 would point at other rows: set data.name=synthetic, or checkpoint.resume=none "
            "in a new checkpoint.dir to start fresh",
        ),
    ],
)
def test_resume_refuses_other_data_settings(two_checkpoints: Path, change: dict, line: str) -> None:
    from dlrm.checkpoint import check_resume, read_checkpoint_meta
    from dlrm.errors import ConfigError

    ck = str(two_checkpoints / "checkpoints" / "step_8")
    meta = read_checkpoint_meta(ck)
    check_resume(ck, meta, _run_facts(meta))  # the run that wrote it
    check_resume(ck, meta, _run_facts(meta, seed=7))  # unshuffled: the seed does not move the rows
    with pytest.raises(ConfigError) as e:
        check_resume(ck, meta, _run_facts(meta, **change))
    assert str(e.value) == line.format(ck=ck)


def test_resume_refuses_another_shuffle_seed_or_epoch_length(two_checkpoints: Path) -> None:
    from dlrm.checkpoint import check_resume, read_checkpoint_meta
    from dlrm.errors import ConfigError

    ck = str(two_checkpoints / "checkpoints" / "step_8")
    meta = read_checkpoint_meta(ck)
    meta["config"]["data"]["shuffle"] = True
    with pytest.raises(ConfigError) as e:
        check_resume(ck, meta, _run_facts(meta, seed=meta["config"]["seed"] + 1))
    assert str(e.value) == (
        f"config key `seed`: checkpoint {ck} shuffled its rows with seed={meta['config']['seed']}, this run has "
        f"{meta['config']['seed'] + 1}; set seed={meta['config']['seed']} so the shuffled order carries over, or "
        "checkpoint.resume=none in a new checkpoint.dir"
    )
    meta = read_checkpoint_meta(ck)
    facts = _run_facts(meta)
    facts.steps_per_epoch = 63
    with pytest.raises(ConfigError) as e:
        check_resume(ck, meta, facts)
    assert str(e.value) == (
        f"config key `data`: checkpoint {ck} was trained at 64 steps per epoch on 1 ranks, this run has 63: its "
        "training split has another size, or this world size drops a last partial batch (fewer rows than ranks) "
        "that the other kept; resume on 1 ranks with the data settings of its meta.json `config.data`, or "
        "checkpoint.resume=none in a new checkpoint.dir"
    )


def test_resume_refuses_another_table_optimizer(two_checkpoints: Path) -> None:
    """Element-wise and row-wise Adagrad keep differently shaped state: resuming across them would restart the
    tables' optimizer silently."""
    from dlrm.checkpoint import check_resume, read_checkpoint_meta
    from dlrm.errors import ConfigError

    ck = str(two_checkpoints / "checkpoints" / "step_8")
    meta = read_checkpoint_meta(ck)
    facts = _run_facts(meta)
    was = facts.config.optimizer.sparse_type
    other = "adagrad" if was == "rowwise_adagrad" else "rowwise_adagrad"
    facts.config.optimizer.sparse_type = other
    with pytest.raises(ConfigError) as e:
        check_resume(ck, meta, facts)
    assert str(e.value) == (
        f"config key `optimizer.sparse_type`: checkpoint {ck} was trained with optimizer.sparse_type={was}, this run "
        f"has {other}; the tables' optimizer state would start fresh: set optimizer.sparse_type={was}, or "
        "checkpoint.resume=none in a new checkpoint.dir"
    )


def test_resume_into_another_model_is_refused_naming_entry_and_config_key(
    two_checkpoints: Path, tmp_path: Path
) -> None:
    """A checkpoint of a 3-layer DCN does not load into a 2-layer one (its third layer would be dropped): one
    ``error:`` line naming the first entry that differs and the config key behind it, exit 2."""
    ck = two_checkpoints / "checkpoints" / "step_8"
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={tmp_path / 'run'}",
            *SMALL,
            "trainer.max_steps=10",
            "model.dcn_num_layers=2",
            f"checkpoint.resume={ck}",
        ]
    )
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: checkpoint {ck}: model entry 'model.inter_arch.crossnet.V_kernels.2' of the checkpoint has no "
        "place in this model: model.dcn_num_layers was 3 in the checkpoint's config (meta.json), is 2 now; set it "
        "back (the checkpoint's meta.json `config.model` holds its model config)"
    ], p.stderr[-3000:]


def test_export_and_load_model_refuse_another_model(
    two_checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The export's model file loads with one call into the model it was trained as; a checkpoint whose tensors
    are not those of its own config, or a load into another model config, is refused naming the first entry."""
    import json
    import shutil

    from dlrm.checkpoint import MANIFEST, CheckpointError, file_entry
    from dlrm.config import ModelConfig
    from dlrm.export import load_model
    from dlrm.export import main as export_main

    ck = two_checkpoints / "checkpoints" / "step_8"
    out = tmp_path / "m.pt"
    assert export_main([str(ck), str(out)]) == 0
    model = load_model(str(out))
    assert len(model.model.inter_arch.crossnet.V_kernels) == 3 and not model.training
    with pytest.raises(CheckpointError) as e:
        load_model(str(out), ModelConfig(dcn_num_layers=2))
    assert str(e.value) == (
        f"{out}: model entry 'model.inter_arch.crossnet.V_kernels.2' of the checkpoint has no place in this model: "
        "model.dcn_num_layers was 3 in the checkpoint's config (meta.json), is 2 now; set it back (the "
        "checkpoint's meta.json `config.model` holds its model config)"
    )
    # a checkpoint whose meta.json describes another model than its tensors (manifest updated: not damage)
    other = tmp_path / "step_8"
    shutil.copytree(ck, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["config"]["model"]["dcn_num_layers"] = 2
    (other / "meta.json").write_text(json.dumps(meta))
    manifest = json.loads((other / MANIFEST).read_text())
    manifest["files"]["meta.json"] = file_entry(str(other / "meta.json"))
    (other / MANIFEST).write_text(json.dumps(manifest))
    capsys.readouterr()
    assert export_main([str(other), str(tmp_path / "o.pt")]) == 2
    assert capsys.readouterr().err == (
        f"error: checkpoint {other}: model entry 'model.inter_arch.crossnet.V_kernels.2' of the checkpoint has no "
        "place in this model: it was written by another model (compare the checkpoint's meta.json `config.model` "
        "with this model's config)\n"
    )
    assert not (tmp_path / "o.pt").exists()


@pytest.mark.parametrize("key", ["global_batch", "scheduler", "step", "samples", "world_size", "config"])
def test_resume_from_a_meta_json_without_a_key_is_a_checkpoint_error(two_checkpoints: Path, key: str) -> None:
    """A same-size edit of meta.json passes ``checkpoint.verify=size``; its missing keys are named, no KeyError."""
    from dlrm.checkpoint import CheckpointError, check_resume, read_checkpoint_meta

    ck = str(two_checkpoints / "checkpoints" / "step_8")
    meta = read_checkpoint_meta(ck)
    facts = _run_facts(meta)
    del meta[key]
    kind = "object" if key in ("scheduler", "config") else "int"
    with pytest.raises(CheckpointError) as e:
        check_resume(ck, meta, facts)
    assert str(e.value) == (
        f"checkpoint {ck}: meta.json lacks `{key}` (or it is not a JSON {kind}); it is damaged: give another "
        "checkpoint.resume (auto takes the newest intact one)"
    )


def test_a_damaged_saved_plan_is_a_warning_and_a_new_plan(
    two_checkpoints: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from dlrm.checkpoint import planning_inputs, read_checkpoint_meta, saved_plan
    from dlrm.process_group import DistInfo

    ck = _copy_step(two_checkpoints / "checkpoints" / "step_8", tmp_path / "step_8")
    meta = read_checkpoint_meta(str(ck))
    inputs = planning_inputs(_run_facts(meta).config, meta["global_batch"])
    (ck / "plan.json").write_text('{"format": "dlrm-plan/1"}')
    info = DistInfo(0, 1, 0, 1, torch.device("cpu"), "gloo")
    with caplog.at_level(logging.WARNING, logger="dlrm"):
        assert saved_plan(str(ck), info, inputs) is None
    assert (
        f"checkpoint {ck}: plan.json or meta.json is unreadable or incomplete (KeyError: 'world_size'); planning anew"
        in caplog.text
    )


# ------------------------------------------------------------------------------------------------- CUDA (GPU)
def _local_pieces(state: dict) -> Dict[str, List[tuple]]:
    """name -> [(offsets, tensor)] of this rank's data (ShardedTensor: its local shards), cloned on the device."""
    from torchrec.distributed import ShardedTensor

    from dlrm.checkpoint.state_names import flatten_state

    out: Dict[str, List[tuple]] = {}
    for k, v in flatten_state(state).items():
        if isinstance(v, ShardedTensor):
            out[k] = [(tuple(s.metadata.shard_offsets), s.tensor.detach().clone()) for s in v.local_shards()]
        elif isinstance(v, torch.Tensor):
            out[k] = [((0,) * v.dim(), v.detach().clone())]
    return out


@pytest.mark.gpu
def test_async_save_on_cuda_staging_stream_is_the_step_state(tmp_path: Path) -> None:
    """1 GPU, DLRM-v2 tables capped at 1 M rows (~3.7 GB): an async save issued right after step 3 was enqueued
    (no host sync) holds exactly step 3's weights and optimizer state, although steps 4-6 were enqueued right
    after it and update the same tensors in place (fused TBE Adagrad in backward, dense Adagrad)."""
    from dlrm.checkpoint import app_state, step_dir
    from dlrm.checkpoint.writers import StreamStagedWriter
    from dlrm.config import compose
    from dlrm.export import full_state_dict
    from dlrm.trainer import Trainer

    cfg = compose(
        [
            "device=cuda",
            "model=dlrm_v2",
            "model.row_cap=1000000",
            "data.multi_hot=false",
            "data.batch_size=8192",
            "data.num_train_samples=65536",
            "data.num_val_samples=8192",
            "data.num_test_samples=0",
            "eval.every_n_steps=null",
            "eval.at_end=false",
            "checkpoint.resume=none",
            f"checkpoint.dir={tmp_path / 'ck'}",
            "optimizer.lr=0.05",
        ]
    )
    t = Trainer(cfg, str(tmp_path))
    t.setup()
    try:
        it = t._train_iter()
        for _ in range(3):
            t.pipeline.progress(it)
            t.step += 1
        t.ckpt.save(t.state, block=False)
        assert isinstance(t.ckpt._writer, StreamStagedWriter)
        ref = _local_pieces(app_state(t.model, t.optimizer))  # on the training stream: step 3's values
        for _ in range(3):
            t.pipeline.progress(it)
        now = _local_pieces(app_state(t.model, t.optimizer))
        t.ckpt.wait()
        saved = full_state_dict(step_dir(str(tmp_path / "ck"), 3))
        changed = 0
        for k, pieces in ref.items():
            for (off, a), (_, b) in zip(pieces, now[k]):
                region = saved[k][tuple(slice(o, o + n) for o, n in zip(off, a.shape))]
                assert torch.equal(region, a.cpu()), f"{k} at {off}: the saved state is not step 3's"
                changed += int(not torch.equal(a, b))
        # the later steps did change the state, so a copy racing with them would have been seen
        assert changed > len(ref) // 2, (changed, len(ref))
    finally:
        t.close()
