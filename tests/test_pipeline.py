"""Pipelines, the dedicated input-dist process group and host offload (dlrm/pipeline.py, comms.py, offload.py).

One launch of 2 gloo processes covers every case: for table_wise, row_wise, column_wise and table_row_wise,
with the shared and the dedicated input-dist group, TorchRec's pipelines give the same losses as a plain loop,
bit for bit, over 20 steps whose last batch is partial; two epochs of 4 batches through a fresh iterator each
give 8 optimizer steps; every input-dist collective runs on the dedicated group and nothing else does.

    .venv/bin/python -m pytest -q tests/test_pipeline.py
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Dict, List, Tuple

import pytest
import torch
import torch.distributed as dist

from conftest import CUDA_SMALL_RUN, REPO, run_gloo
from dlrm.config import ModelConfig, OffloadConfig, PipelineConfig, compose, to_config
from dlrm.errors import ConfigError

SHARDING_TYPES = ["table_wise", "row_wise", "column_wise", "table_row_wise"]
BATCH = 16
STEPS = 20  # the last one partial (BATCH // 2 rows)
DIM = 8


def _model_cfg() -> ModelConfig:
    return ModelConfig(
        name="tiny",
        embedding_dim=DIM,
        row_cap=40,
        multi_hot_sizes=[2] * 26,
        dense_arch_layer_sizes=[16, DIM],
        over_arch_layer_sizes=[16, 1],
        dcn_num_layers=1,
        dcn_low_rank_dim=4,
    )


def _cpu_sharder():
    """The stock EBC sharder, allowing row_wise and table_row_wise on CPU too (they train correctly there)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    class CpuEBCSharder(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> List[str]:
            return ["table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise", "data_parallel"]

    return CpuEBCSharder()


def _batches(rank: int, n: int, seed: int, partial_last: bool) -> list:
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from dlrm.model import FEATURE_NAMES

    g = torch.Generator().manual_seed(seed * 1000 + rank)
    rows = torch.tensor(_model_cfg().table_rows)
    out = []
    for i in range(n):
        b = BATCH // 2 if (partial_last and i == n - 1) else BATCH
        lengths = torch.randint(0, 4, (26 * b,), generator=g, dtype=torch.int32)
        # KJT layout is feature-major: ids of feature f are below that table's row count
        values = (
            torch.rand(int(lengths.sum()), generator=g) * rows.repeat_interleave(b).repeat_interleave(lengths.long())
        ).long()
        out.append(
            Batch(
                dense_features=torch.randn(b, 13, generator=g),
                sparse_features=KeyedJaggedTensor.from_lengths_sync(FEATURE_NAMES, values, lengths),
                labels=torch.randint(0, 2, (b,), generator=g).float(),
            )
        )
    return out


def _build(stype: str, world: int):
    """A sharded tiny DLRM-v2 with every table on ``stype``, and its optimizer (fused sparse + dense Adagrad)."""
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        row_wise,
        table_row_wise,
        table_wise,
    )
    from torchrec.distributed.types import ShardingPlan
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

    from dlrm.config import OptimizerConfig
    from dlrm.model import build_model
    from dlrm.sharding import dense_params, fuse_embedding_optimizer

    torch.manual_seed(0)
    model = build_model(_model_cfg())
    fuse_embedding_optimizer(model, OptimizerConfig(lr=0.05))
    ebc = model.model.sparse_arch.embedding_bag_collection
    gen = {
        "table_wise": lambda i: table_wise(rank=i % world),
        "row_wise": lambda i: row_wise(),
        "column_wise": lambda i: column_wise(ranks=list(range(world))),
        "table_row_wise": lambda i: table_row_wise(host_index=0),
    }[stype]
    sharder = _cpu_sharder()
    mplan = construct_module_sharding_plan(
        ebc,
        {f"t_cat_{i}": gen(i) for i in range(26)},
        sharder=sharder,
        local_size=world,
        world_size=world,
        device_type="cpu",
    )
    plan = ShardingPlan({"model.sparse_arch.embedding_bag_collection": mplan})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    dense = KeyedOptimizerWrapper(dense_params(dmp), lambda p: torch.optim.Adagrad(p, lr=0.05, eps=1e-8))
    opt = CombinedOptimizer([dmp.fused_optimizer, dense])
    steps = [0]
    step = opt.step

    def counting_step(*a, **k):
        steps[0] += 1
        return step(*a, **k)

    opt.step = counting_step  # type: ignore[method-assign]
    return dmp, opt, steps


def _plain_losses(stype: str, world: int, rank: int, epochs: List[list]) -> List[torch.Tensor]:
    dmp, opt, _ = _build(stype, world)
    losses = []
    for batches in epochs:
        for b in batches:
            opt.zero_grad()
            loss, _out = dmp(b)
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
    return losses


class _CollectiveLog:
    """Records (caller, group) of every all-to-all / reduce-scatter / all-gather issued through torch.distributed."""

    NAMES = (
        "all_to_all_single",
        "all_to_all",
        "reduce_scatter_tensor",
        "reduce_scatter",
        "all_gather",
        "all_gather_into_tensor",
        "all_reduce",
    )

    def __init__(self) -> None:
        self.calls: List[Tuple[str, Any]] = []
        self._saved: Dict[str, Any] = {}

    def __enter__(self) -> "_CollectiveLog":
        for name in self.NAMES:
            fn = getattr(dist, name)
            self._saved[name] = fn
            params = list(inspect.signature(fn).parameters)
            pos = params.index("group")

            def wrapper(*args, _fn=fn, _pos=pos, **kwargs):
                group = kwargs["group"] if "group" in kwargs else (args[_pos] if len(args) > _pos else None)
                caller = sys._getframe(1).f_code
                self.calls.append((getattr(caller, "co_qualname", caller.co_name), group))
                return _fn(*args, **kwargs)

            setattr(dist, name, wrapper)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, fn in self._saved.items():
            setattr(dist, name, fn)


# the classes whose constructors issue the input dist's collectives (torchrec.distributed.dist_data): the splits
# all-to-all (also the pipeline's fused one) and the lengths / values all-to-alls
INPUT_DIST_SITES = (
    "SplitsAllToAllAwaitable.",
    "KJTAllToAllSplitsAwaitable.",
    "KJTAllToAllTensorsAwaitable.",
    "FusedKJTListSplitsAwaitable.",
)


def _is_input_dist_site(qualname: str) -> bool:
    return qualname.startswith(INPUT_DIST_SITES)


def _worker(rank: int, world: int) -> Dict[str, Any]:
    from torchrec.distributed.dist_data import KJTAllToAll
    from torchrec.distributed.model_parallel import get_module

    from dlrm import comms
    from dlrm.pipeline import build_pipeline
    from dlrm.torchrec_compat import kjt_all_to_all_group

    torch.set_num_threads(1)  # 2 processes on 2 cores: more intra-op threads make gloo steps ~50x slower
    data = _batches(rank, STEPS, seed=1, partial_last=True)
    epoch = _batches(rank, 4, seed=2, partial_last=False)
    res: Dict[str, Any] = {}
    for stype in SHARDING_TYPES:
        ref = _plain_losses(stype, world, rank, [data])
        ref_epochs = _plain_losses(stype, world, rank, [epoch, epoch])
        for group in ("shared", "dedicated"):
            for name in ("sparse_dist", "base"):
                key = f"{stype}/{group}/{name}"
                dmp, opt, steps = _build(stype, world)
                pipe = build_pipeline(dmp, opt, torch.device("cpu"), PipelineConfig(name, group))
                it = iter(data)
                losses, rows = [], []
                with _CollectiveLog() as log:
                    while True:
                        try:
                            out = pipe.progress(it)
                        except StopIteration:
                            break
                        losses.append(out[0].detach().clone())
                        rows.append(int(out[2].shape[0]))
                ded = comms.input_dist_group() if group == "dedicated" else None
                a2as = comms.input_dist_all_to_alls(dmp)
                site_groups = {(_is_input_dist_site(q), g is not None and g is ded) for q, g in log.calls}
                res[key] = {
                    "equal": len(losses) == len(ref) and all(torch.equal(a, b) for a, b in zip(losses, ref)),
                    "max_diff": max((float((a - b).abs()) for a, b in zip(losses, ref)), default=None),
                    "n": len(losses),
                    "rows": rows,
                    "steps": steps[0],
                    "a2a": len(a2as),
                    "a2a_on_dedicated": sum(kjt_all_to_all_group(m) is ded for m in a2as if ded is not None),
                    "a2a_types": sorted({type(m).__name__ for m in a2as}),
                    # (input-dist call site?, on the dedicated group?) pairs seen
                    "sites": sorted(site_groups),
                    "n_calls": len(log.calls),
                    "qualnames": sorted({(q, g is not None and g is ded) for q, g in log.calls}),
                }
            # two epochs of 4 batches, each through a fresh iterator, with the pipeline kept
            dmp, opt, steps = _build(stype, world)
            pipe = build_pipeline(dmp, opt, torch.device("cpu"), PipelineConfig("sparse_dist", group))
            losses = []
            for _ in range(2):
                it = iter(epoch)
                while True:
                    try:
                        losses.append(pipe.progress(it)[0].detach().clone())
                    except StopIteration:
                        break
            res[f"{stype}/{group}/epochs"] = {
                "n": len(losses),
                "steps": steps[0],
                "equal": len(losses) == len(ref_epochs) and all(torch.equal(a, b) for a, b in zip(losses, ref_epochs)),
            }
    ddp = get_module(dmp)  # DMP's DDP wrapper
    res["ddp_group_is_dedicated"] = getattr(ddp, "process_group", None) is comms.input_dist_group()
    res["isinstance_kjta2a"] = KJTAllToAll.__name__
    return res


@pytest.fixture(scope="module")
def results() -> List[Dict[str, Any]]:
    return run_gloo(2, _worker, timeout=240)


@pytest.mark.parametrize("stype", SHARDING_TYPES)
@pytest.mark.parametrize("group", ["shared", "dedicated"])
@pytest.mark.parametrize("name", ["sparse_dist", "base"])
def test_pipeline_losses_equal_plain_loop_bitwise(results, stype: str, group: str, name: str) -> None:
    for rank, res in enumerate(results):
        r = res[f"{stype}/{group}/{name}"]
        assert r["n"] == STEPS and r["steps"] == STEPS, (rank, r)
        assert r["rows"][-1] == BATCH // 2 and r["rows"][:-1] == [BATCH] * (STEPS - 1), (rank, r)  # partial last
        assert r["equal"], (rank, r)


@pytest.mark.parametrize("stype", SHARDING_TYPES)
@pytest.mark.parametrize("group", ["shared", "dedicated"])
def test_two_epochs_with_fresh_iterators_give_eight_steps(results, stype: str, group: str) -> None:
    for rank, res in enumerate(results):
        r = res[f"{stype}/{group}/epochs"]
        assert (r["n"], r["steps"]) == (8, 8), (rank, r)
        assert r["equal"], (rank, r)


@pytest.mark.parametrize("stype", SHARDING_TYPES)
@pytest.mark.parametrize("name", ["sparse_dist", "base"])
def test_dedicated_group_carries_exactly_the_input_dist(results, stype: str, name: str) -> None:
    for rank, res in enumerate(results):
        ded, shared = res[f"{stype}/dedicated/{name}"], res[f"{stype}/shared/{name}"]
        # one KJTAllToAll per sharding (all 26 tables share one sharding type here), all moved
        assert ded["a2a"] >= 1 and ded["a2a_on_dedicated"] == ded["a2a"], (rank, ded)
        assert ded["a2a_types"] == [res["isinstance_kjta2a"]]
        # input-dist collectives only on the dedicated group, all others (output dist, backward) on the default
        assert ded["sites"] == [(False, False), (True, True)], (rank, ded["qualnames"])
        assert shared["sites"] == [(False, False), (True, False)], (rank, shared)
        assert ded["n_calls"] == shared["n_calls"], (rank, ded["n_calls"], shared["n_calls"])
        # both the splits and the tensors all-to-all moved
        moved = {q.split(".")[0] for q, on_dedicated in ded["qualnames"] if on_dedicated}
        assert {"KJTAllToAllTensorsAwaitable"} < moved, moved
    assert not any(r["ddp_group_is_dedicated"] for r in results)


# ------------------------------------------------------------------------------------------- config and offload
@pytest.mark.parametrize("name", ["prefetch", "fused_sparse_dist", "semi_sync"])
def test_cuda_stream_pipelines_are_refused_on_cpu(name: str) -> None:
    from dlrm.pipeline import build_pipeline

    with pytest.raises(
        ConfigError,
        match=f"config key `pipeline.name`: pipeline={name} .* needs CUDA, but this run "
        "is on cpu; use pipeline=sparse_dist on CPU",
    ):
        build_pipeline(torch.nn.Linear(1, 1), None, torch.device("cpu"), PipelineConfig(name))


def test_trainer_refuses_cuda_stream_pipeline_before_loading_data(tmp_path) -> None:
    """`python train.py pipeline=fused_sparse_dist` on CPU exits 2 naming the key, before any data loads."""
    import subprocess

    r = subprocess.run(
        [sys.executable, "train.py", "pipeline=fused_sparse_dist", "device=cpu", f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: config key `pipeline.name`: pipeline=fused_sparse_dist" in r.stderr + r.stdout
    assert "data synthetic" not in r.stderr + r.stdout  # the data-loading log line never came


def _cuda_losses(tmp_path, pipeline: str, steps: int = 12, extra: Tuple[str, ...] = ()) -> List[torch.Tensor]:
    from dlrm.config import compose
    from dlrm.trainer import Trainer

    cfg = compose(
        [
            *CUDA_SMALL_RUN,
            "data.num_train_samples=16384",
            f"pipeline={pipeline}",
            *extra,
        ]
    )
    t = Trainer(cfg, str(tmp_path / pipeline))
    t.setup()
    try:
        it = t._train_iter()
        return [t.pipeline.progress(it)[0].detach().float().cpu() for _ in range(steps)]
    finally:
        t.close()


@pytest.mark.gpu
def test_fused_sparse_dist_trains_like_sparse_dist_on_cuda(tmp_path) -> None:
    """1 GPU: ``pipeline=fused_sparse_dist`` (batch i+1's lookup overlaps batch i's optimizer step) gives the
    losses of ``pipeline=sparse_dist`` over 12 steps, as close as a second sparse_dist run is to the first
    (bitwise where the GPU kernels are deterministic)."""
    a, b = _cuda_losses(tmp_path, "sparse_dist"), _cuda_losses(tmp_path / "again", "sparse_dist")
    fused = _cuda_losses(tmp_path, "fused_sparse_dist")
    rerun = max(float((x - y).abs()) for x, y in zip(a, b))
    diff = max(float((x - y).abs()) for x, y in zip(a, fused))
    assert len(fused) == 12 and float(a[-1]) < float(a[0]), a  # it trained
    assert diff <= 2 * rerun, (diff, rerun, a, fused)


@pytest.mark.gpu
def test_semi_sync_reads_tables_one_step_stale_on_cuda(tmp_path) -> None:
    """1 GPU: ``pipeline=semi_sync`` from batch 0 gives sparse_dist's first loss (nothing to be stale about yet)
    and then other losses (each lookup reads the tables before the previous batch's update), still training;
    with ``semi_sync_start_batch`` past the last step it trains synchronously: sparse_dist's losses, as close as
    a second sparse_dist run is to the first."""
    a, b = _cuda_losses(tmp_path, "sparse_dist"), _cuda_losses(tmp_path / "again", "sparse_dist")
    semi = _cuda_losses(tmp_path / "semi", "semi_sync")
    sync = _cuda_losses(tmp_path / "sync", "semi_sync", extra=("pipeline.semi_sync_start_batch=100",))
    rerun = max(float((x - y).abs()) for x, y in zip(a, b))
    assert abs(float(semi[0] - a[0])) <= 2 * rerun, (semi, a)
    assert max(float((x - y).abs()) for x, y in zip(a[1:], semi[1:])) > 10 * rerun + 1e-6, (semi, a)
    assert float(semi[-1]) < float(semi[0]), semi
    assert max(float((x - y).abs()) for x, y in zip(a, sync)) <= 2 * rerun, (sync, a)


def test_semi_sync_start_batch_validates() -> None:
    assert to_config(compose(["pipeline=semi_sync"])).pipeline.semi_sync_start_batch == 0
    with pytest.raises(
        ConfigError, match="config key `pipeline.semi_sync_start_batch`: got -1; use a batch index >= 0"
    ):
        to_config(compose(["pipeline=semi_sync", "pipeline.semi_sync_start_batch=-1"]))


def test_pipeline_and_offload_keys_validate() -> None:
    cfg = to_config(
        compose(
            [
                "pipeline=prefetch",
                "pipeline.input_dist_group=dedicated",
                "offload=uvm_caching",
                "offload.cache_load_factor=0.05",
                "offload.cache_algorithm=lfu",
            ]
        )
    )
    assert (cfg.pipeline.name, cfg.pipeline.input_dist_group) == ("prefetch", "dedicated")
    assert (cfg.offload.name, cfg.offload.cache_load_factor, cfg.offload.cache_algorithm) == (
        "uvm_caching",
        0.05,
        "lfu",
    )
    assert to_config(compose([])).offload.name == "none"
    with pytest.raises(ConfigError, match="config key `pipeline.name`: offload=uvm_caching .* add pipeline=prefetch"):
        to_config(compose(["offload=uvm_caching"]))
    for override, key in [
        ("pipeline.input_dist_group=own", "pipeline.input_dist_group"),
        ("offload.cache_load_factor=0", "offload.cache_load_factor"),
        ("offload.cache_algorithm=fifo", "offload.cache_algorithm"),
        ("offload.min_table_rows=-1", "offload.min_table_rows"),
    ]:
        with pytest.raises(ConfigError, match=f"config key `{key}`"):
            to_config(compose(["pipeline=prefetch", "offload=uvm_caching", override]))


def test_offload_constraints_pick_tables_by_size() -> None:
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm

    from dlrm.model import table_configs
    from dlrm.offload import offload_constraints, offloaded_tables

    mc = ModelConfig(name="dlrm_v2", embedding_dim=128, row_cap=None, dense_arch_layer_sizes=[512, 256, 128])
    tables = table_configs(mc)
    assert offloaded_tables(OffloadConfig("none"), tables) == []
    assert len(offloaded_tables(OffloadConfig("uvm"), tables)) == 26
    big = offloaded_tables(OffloadConfig("uvm", min_table_rows=1_000_000), tables)
    assert big == ["t_cat_0", "t_cat_9", "t_cat_10", "t_cat_19", "t_cat_20", "t_cat_21"]  # 40 M x5, 3.07 M
    # 3,067,956 rows x 128 x 4 B = 1,498 MiB: a 2,000 MiB threshold keeps only the 40 M-row tables
    assert len(offloaded_tables(OffloadConfig("uvm", min_table_mb=2000), tables)) == 5
    c = offload_constraints(
        OffloadConfig("uvm_caching", min_table_rows=1_000_000, cache_load_factor=0.05, cache_algorithm="lfu"), tables
    )
    assert sorted(c) == sorted(big)
    p = c["t_cat_0"]
    assert p.compute_kernels == ["fused_uvm_caching"]
    assert (p.cache_params.load_factor, p.cache_params.algorithm, p.cache_params.prefetch_pipeline) == (
        0.05,
        CacheAlgorithm.LFU,
        True,
    )
    u = offload_constraints(OffloadConfig("uvm"), tables)
    assert u["t_cat_5"].compute_kernels == ["fused_uvm"] and u["t_cat_5"].cache_params is None
    assert offload_constraints(OffloadConfig("none"), tables) is None


def test_offload_plans_on_a_cuda_topology_without_a_gpu() -> None:
    """The planner accepts the offload constraints (plans and dry runs work on CPU machines)."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.sharding_plan import get_default_sharders

    from dlrm.model import build_model, table_configs
    from dlrm.offload import offload_constraints

    mc = ModelConfig(
        name="dlrm_v2",
        embedding_dim=128,
        row_cap=None,
        dense_arch_layer_sizes=[512, 256, 128],
        over_arch_layer_sizes=[1024, 1024, 512, 256, 1],
        dcn_low_rank_dim=512,
    )
    for name, kernel in [("uvm", "fused_uvm"), ("uvm_caching", "fused_uvm_caching")]:
        oc = OffloadConfig(name, min_table_rows=1_000_000, cache_load_factor=0.2)
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=2, compute_device="cuda", hbm_cap=140 * 2**30),
            constraints=offload_constraints(oc, table_configs(mc)),
        )
        plan = planner.plan(build_model(mc), get_default_sharders())
        kernels = {t: ps.compute_kernel for t, ps in plan.plan["model.sparse_arch.embedding_bag_collection"].items()}
        assert {t for t, k in kernels.items() if k == kernel} == {
            "t_cat_0",
            "t_cat_9",
            "t_cat_10",
            "t_cat_19",
            "t_cat_20",
            "t_cat_21",
        }, kernels
        assert all(k == "fused" for t, k in kernels.items() if k != kernel), kernels


def test_offload_training_is_refused_on_cpu() -> None:
    from dlrm.offload import check_can_train

    check_can_train(OffloadConfig("none"), torch.device("cpu"))
    for name in ("uvm", "uvm_caching"):
        with pytest.raises(ValueError, match=f"config key `offload.name`: offload={name} needs CUDA"):
            check_can_train(OffloadConfig(name), torch.device("cpu"))
