"""``dlrm/torchrec_compat.py``: every private TorchRec / torch name it lists does what the trainer relies on.

Each entry of ``PRIVATE_NAMES`` has a behavioural check here (``CHECKS`` names them, and a test fails when an entry
has none): a real sharded EmbeddingBagCollection on 2 gloo ranks (table_wise, table_row_wise and grid_shard tables)
builds its input and output dists through the hooks and its collectives are recorded, a LowRankCrossNet reports
its layers, the fx-trace flag flips inside a trace, the state-dict helpers copy a sharded state dict, and so on. A
TorchRec or torch upgrade that changes one of them fails here, naming it.

    .venv/bin/python -m pytest -q tests/test_torchrec_compat.py
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any, Dict, List

import pytest
import torch

from conftest import run_gloo
from dlrm import torchrec_compat as compat

DIM = 8
ROWS = 16
FEATURES = [f"cat_{i}" for i in range(3)]
# one table per sharding type whose output dist the trainer hooks (table_wise: TwPooledEmbeddingDist;
# table_row_wise: TwRwPooledEmbeddingDist; grid_shard: GridPooledEmbeddingDist)
TYPES = {"t_cat_0": "table_wise", "t_cat_1": "table_row_wise", "t_cat_2": "grid_shard"}


def _sharded_worker(rank: int, world: int) -> Dict[str, Any]:
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.dist_data import KJTAllToAll, PooledEmbeddingsAllToAll
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardedModule
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from dlrm.sharding import sharders

    torch.set_num_threads(1)
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=f"t_{f}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f])
            for f in FEATURES
        ],
        device=torch.device("meta"),
    )
    constraints = {
        t: ParameterConstraints(sharding_types=[st], min_partition=4 if st == "grid_shard" else None)
        for t, st in TYPES.items()
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, local_world_size=world, compute_device="cpu"), constraints=constraints
    )
    plan = planner.collective_plan(ebc, sharders(), dist.group.WORLD)
    dmp = DistributedModelParallel(module=ebc, device=torch.device("cpu"), plan=plan, sharders=sharders())
    sharded = next(m for m in dmp.modules() if isinstance(m, ShardedModule))
    out: Dict[str, Any] = {}

    # input dist: empty before the first batch, built on it, and the callback sees them built
    out["input_dists_before"] = len(compat.input_dists(sharded))
    seen_at_build: List[int] = []
    compat.after_input_dists_built(sharded, lambda: seen_at_build.append(len(compat.input_dists(sharded))))
    # output dists: hook every pooled all-to-all's builder; none is built before the first batch
    ods = compat.output_dists(sharded)
    out["output_dist_kinds"] = sorted(str(compat.pooled_output_dist_kind(od)) for od in ods)
    built: List[str] = []
    for od in ods:
        if compat.pooled_output_dist_kind(od) is not None:
            out.setdefault("group_sizes", []).append(compat.pooled_output_dist_group(od).size())
            compat.after_pooled_all_to_all_built(
                od, lambda od=od: built.append(str(compat.pooled_output_dist_kind(od)))
            )
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=FEATURES,
        values=torch.arange(2 * len(FEATURES)) % ROWS,
        lengths=torch.ones(2 * len(FEATURES), dtype=torch.int32),
    )
    pooled = dmp(kjt).values()  # the first batch: input and output dists are built now
    out["pooled_shape"] = list(pooled.shape)
    out["seen_at_build"] = seen_at_build
    out["built"] = sorted(built)
    a2as = [m for d in compat.input_dists(sharded) for m in d.modules() if isinstance(m, KJTAllToAll)]
    out["kjt_groups_are_world"] = [compat.kjt_all_to_all_group(a) is dist.group.WORLD for a in a2as]
    other = dist.new_group(backend="gloo")
    for a in a2as:
        compat.set_kjt_all_to_all_group(a, other)
    out["kjt_groups_moved"] = [compat.kjt_all_to_all_group(a) is other for a in a2as]
    out["pooled_after_move"] = torch.equal(dmp(kjt).values(), pooled)  # the same lookup through the new group
    fields = [compat.PooledAllToAllFields(m) for od in ods for m in od.modules() if type(m) is PooledEmbeddingsAllToAll]
    out["a2a_fields"] = [
        (f.pg.size(), list(f.dim_sum_per_rank), f.codecs is None, isinstance(f.callbacks, list)) for f in fields
    ]
    # every collective of a forward and backward is recorded, the C++ ones DDP's reducer issues too
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 3))
    with compat.record_collectives() as calls:
        dmp(kjt).values().sum().backward()
        ddp(torch.ones(2, 4)).sum().backward()
    out["collectives"] = calls
    # DDP's record of its communication hook: none registered, then the fp16 one TorchRec registers
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

    out["comm_hook_none"] = compat.ddp_comm_hook_name(ddp)
    ddp_fp16 = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 3))
    ddp_fp16.register_comm_hook(None, fp16_compress_hook)
    out["comm_hook_fp16"] = compat.ddp_comm_hook_name(ddp_fp16)
    # the pinned-copy helpers of DCP on this sharded state dict (no pinning on a CPU-only machine)
    sd = dmp.state_dict()
    cpu = compat.create_cpu_state_dict(sd, pin_memory=False)
    copied = compat.copy_state_dict(sd, cpu, non_blocking=False)
    key = next(k for k in sd if "embedding_bags" in k and sd[k].local_shards())  # one this rank holds
    src, dst = sd[key].local_shards()[0].tensor, copied[key].local_shards()[0].tensor
    out["state_copy"] = (torch.equal(src, dst), src.data_ptr() != dst.data_ptr(), type(copied[key]).__name__)
    return out


@pytest.fixture(scope="module")
def sharded() -> List[Dict[str, Any]]:
    return run_gloo(2, _sharded_worker, timeout=300)


def _check_input_dist(results: List[Dict[str, Any]]) -> None:
    for r in results:
        assert r["input_dists_before"] == 0, r
        assert r["seen_at_build"] and r["seen_at_build"][0] >= 1, r  # called once they exist
        assert r["kjt_groups_are_world"] and all(r["kjt_groups_are_world"]), r
        assert all(r["kjt_groups_moved"]) and r["pooled_after_move"], r


def _check_output_dist(results: List[Dict[str, Any]]) -> None:
    for r in results:
        assert r["output_dist_kinds"] == ["grid_shard", "table_row_wise", "table_wise"], r
        assert r["built"] == ["grid_shard", "table_row_wise", "table_wise"], r  # each builder ran on the batch
        # table_wise's all-to-all spans both ranks; table_row_wise / grid_shard's runs across hosts (one here)
        assert sorted(r["group_sizes"]) == [1, 1, 2], r
        assert r["pooled_shape"] == [2, 3 * DIM], r  # this rank's batch of 2 samples, every feature


def _check_pooled_a2a(results: List[Dict[str, Any]]) -> None:
    for rank, r in enumerate(results):
        tw = [f for f in r["a2a_fields"] if f[0] == 2]
        assert len(tw) == 1, r["a2a_fields"]
        size, dims, no_codecs, callbacks_list = tw[0]
        # t_cat_0 lives whole on one rank: its dim on that rank, 0 on the other; no codecs; a callback list
        assert sorted(dims) == [0, DIM] and no_codecs and callbacks_list, (rank, tw)


def _check_record_collectives(results: List[Dict[str, Any]]) -> None:
    """One forward and backward of the 3 tables on 2 ranks (one host), 2 samples per rank: 3 input dists of 3
    all-to-alls each, table_wise's pooled all-to-all each way, table_row_wise's and grid_shard's reduce-scatter
    forward and all-gather backward within the host (their cross-host all-to-all has one rank: none), and DDP's
    all-reduce of the Linear(4, 3)'s 15 fp32 gradients."""
    for r in results:
        calls = r["collectives"]
        ops = Counter((c.op, c.group_size) for c in calls)
        assert ops == {("all_to_all", 2): 11, ("reduce_scatter", 2): 2, ("all_gather", 2): 2, ("all_reduce", 2): 1}, ops
        # [4 samples, 8] fp32 partial sums reduce-scattered into [2, 8]; the gradient all-gathered back
        assert {(c.send_bytes, c.recv_bytes) for c in calls if c.op == "reduce_scatter"} == {(128, 64)}
        assert {(c.send_bytes, c.recv_bytes) for c in calls if c.op == "all_gather"} == {(64, 128)}
        assert [(c.dtype, c.send_bytes) for c in calls if c.op == "all_reduce"] == [("float32", 60)]


def _check_ddp_comm_hook(results: List[Dict[str, Any]]) -> None:
    for r in results:
        assert (r["comm_hook_none"], r["comm_hook_fp16"]) == (None, "fp16_compress_hook"), r


def _check_state_dict_utils(results: List[Dict[str, Any]]) -> None:
    for r in results:
        assert r["state_copy"] == (True, True, "ShardedTensor"), r


def _check_fx_tracing() -> None:
    seen: List[bool] = []

    class Probe(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(compat.is_fx_tracing())
            return x + 1

    torch.fx.symbolic_trace(Probe())
    Probe()(torch.zeros(1))
    assert seen == [True, False]


def _check_sharding_spec() -> None:
    spec = compat.EnumerableShardingSpec(
        [
            compat.ShardMetadata(shard_offsets=[0, 0], shard_sizes=[2, 4], placement="rank:0/cpu"),
            compat.ShardMetadata(shard_offsets=[2, 0], shard_sizes=[2, 4], placement="rank:1/cpu"),
        ]
    )
    assert [s.shard_offsets for s in spec.shards] == [[0, 0], [2, 0]]
    with pytest.raises(ValueError):  # overlapping shards are refused: the loaded plan's tiling is checked
        compat.EnumerableShardingSpec(
            [
                compat.ShardMetadata(shard_offsets=[0, 0], shard_sizes=[3, 4], placement="rank:0/cpu"),
                compat.ShardMetadata(shard_offsets=[2, 0], shard_sizes=[2, 4], placement="rank:1/cpu"),
            ]
        )


def _check_dynamo() -> None:
    import torch._dynamo

    cfg = torch._dynamo.config
    saved = cfg.optimize_ddp, cfg.error_on_nested_fx_trace  # this runs in pytest's process: later compiles share it
    try:
        compiled = torch.compile(lambda x: x * 2, backend="eager")
        compat.set_dynamo_for_compiled_step(split_at_ddp_buckets=False)
        assert cfg.optimize_ddp is False

        class UsesCompiled(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return compiled(x)

        gm = torch.fx.symbolic_trace(UsesCompiled())  # TorchRec's trace of a model with a compiled step: no error
        assert torch.equal(gm(torch.ones(2)), torch.full((2,), 2.0))
        assert compat.dynamo_optimize_ddp() is False
        compat.set_dynamo_for_compiled_step(split_at_ddp_buckets=True)
        assert cfg.optimize_ddp is True and compat.dynamo_optimize_ddp() is True
        assert cfg.error_on_nested_fx_trace is False
    finally:
        cfg.optimize_ddp, cfg.error_on_nested_fx_trace = saved


def _check_dynamo_counters() -> None:
    """One function without graph breaks, compiled with a backward: dynamo captures one frame and AOTAutograd
    compiles one graph; dynamo's eager backend captures without AOTAutograd."""

    def counts() -> tuple:
        return compat.dynamo_count("stats", "unique_graphs"), compat.dynamo_count("aot_autograd", "total")

    graphs, aot = counts()
    x = torch.ones(2, requires_grad=True)
    torch.compile(lambda t: (t * 3).sum(), backend="aot_eager")(x).backward()
    assert counts() == (graphs + 1, aot + 1)
    assert torch.equal(x.grad, torch.full((2,), 3.0))
    torch.compile(lambda t: t - 1, backend="eager")(x)
    assert counts() == (graphs + 2, aot + 1)


def _check_fx_trace_logger() -> None:
    """``is_fx_tracing``'s notice (TorchRec calls it) goes to the logger named ``FX_TRACE_LOGGER``, and that
    logger's level silences it (what ``dlrm.loggers.setup_logging`` sets)."""
    import logging

    fx = torch.fx._symbolic_trace
    logger = logging.getLogger(compat.FX_TRACE_LOGGER)
    seen: List[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep()
    level = logger.level
    # torch 2.13 logs the notice once per process, through an lru_cache'd function: forget that it did
    forget = getattr(getattr(fx, "is_fx_tracing_warning", None), "cache_clear", lambda: None)
    logger.addHandler(handler)
    try:
        for set_level in (logging.WARNING, logging.ERROR):
            logger.setLevel(set_level)
            forget()
            fx.is_fx_tracing()
        assert len(seen) == 1 and "is_fx_tracing will return true" in seen[0], seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _check_end_of_backward_callback() -> None:
    order: List[str] = []

    class Queue(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            compat.queue_end_of_backward_callback(lambda: order.append("end"))
            order.append("queued")
            return g

    x = torch.ones(2, requires_grad=True)
    y = Queue.apply(x) * 3
    x.register_hook(lambda g: order.append("leaf grad") or g)  # runs after Queue.backward, before the end
    y.sum().backward()
    assert order == ["queued", "leaf grad", "end"]


def _check_written_files() -> None:
    import os
    import tempfile

    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    with tempfile.TemporaryDirectory() as d:
        writer = FileSystemWriter(d)
        planner = DefaultSavePlanner()
        planner.set_up_planner({"a": torch.arange(4.0)}, is_coordinator=True)
        writer.set_up_storage_writer(True)
        plan = writer.prepare_local_plan(planner.create_local_plan())
        plan = writer.prepare_global_plan(planner.create_global_plan([plan])[0])[0]
        files = compat.written_files(writer.write_data(planner.finish_plan(plan), planner).wait())
        assert files and all(os.path.isfile(os.path.join(d, f)) for f in files), files


def _check_gpu_spin() -> None:
    """Only the name: its behaviour needs a GPU (``test_gpu_spin_keeps_the_stream_busy``)."""
    assert callable(getattr(torch.cuda, "_sleep", None))


@pytest.mark.gpu
def test_gpu_spin_keeps_the_stream_busy() -> None:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    compat.gpu_spin(10_000_000)
    b.record()
    b.synchronize()
    assert a.elapsed_time(b) > 0.1  # ms


def _row_block_worker(rank: int, world: int) -> Any:
    import torch.distributed as dist
    from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist
    from torchrec.distributed.sharding.twrw_sharding import TwRwSparseFeaturesDist
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=torch.tensor([2, 6, 3, 4]), lengths=torch.tensor([2, 0, 1, 1], dtype=torch.int32)
    )
    rw = RwSparseFeaturesDist(dist.group.WORLD, 2, [10, 7], device=torch.device("cpu"))
    got = rw(kjt).wait().wait()
    # one host of 2 ranks holding both tables' rows
    twrw = TwRwSparseFeaturesDist(dist.group.WORLD, 2, [2, 2], [10, 7], device=torch.device("cpu"))
    got_twrw = twrw(kjt).wait().wait()
    return (
        compat.row_block_sizes(rw),
        got.values().tolist(),
        compat.row_block_sizes(twrw),
        compat.host_size(twrw),
        got_twrw.values().tolist(),
    )


@functools.lru_cache(maxsize=1)
def _row_blocks() -> Any:
    return list(zip(*run_gloo(2, _row_block_worker)))


def _check_row_blocks() -> None:
    """Rows per rank ceil(rows / 2): ids 2, 6 of ``a`` (10 rows) and 3, 4 of ``b`` (7 rows) from both ranks go to
    rank 0 as 2, 3, 3 and to rank 1 as 6 - 5 = 1 and 4 - 4 = 0."""
    sizes, values = _row_blocks()[:2]
    assert sizes == ([5, 4], [5, 4])
    assert values == ([2, 2, 3, 3], [1, 1, 0, 0])


def _check_table_row_blocks() -> None:
    """The same for table_row_wise on one host of 2 ranks: rows per rank of the host ceil(rows / 2), the host's 2
    ranks, and the same ids to each rank as row_wise sends."""
    _, _, sizes, hosts, values = _row_blocks()
    assert sizes == ([5, 4], [5, 4]) and hosts == (2, 2)
    assert values == ([2, 2, 3, 3], [1, 1, 0, 0])


CHECKS = {
    "ShardedModule._create_input_dist": _check_input_dist,
    "ShardedModule._input_dists": _check_input_dist,
    "KJTAllToAll._pg": _check_input_dist,
    "ShardedModule._output_dists": _check_output_dist,
    "TwPooledEmbeddingDist._create_output_dist_module": _check_output_dist,
    "TwPooledEmbeddingDist._pg": _check_output_dist,
    "TwRwPooledEmbeddingDist._create_output_dist_modules": _check_output_dist,
    "TwRwPooledEmbeddingDist._cross_pg": _check_output_dist,
    "GridPooledEmbeddingDist._create_output_dist_modules": _check_output_dist,
    "GridPooledEmbeddingDist._cross_pg": _check_output_dist,
    "PooledEmbeddingsAllToAll._pg": _check_pooled_a2a,
    "PooledEmbeddingsAllToAll._dim_sum_per_rank": _check_pooled_a2a,
    "PooledEmbeddingsAllToAll._codecs": _check_pooled_a2a,
    "PooledEmbeddingsAllToAll._callbacks": _check_pooled_a2a,
    "torch.fx._symbolic_trace.is_fx_symbolic_tracing": _check_fx_tracing,
    "torch.fx._symbolic_trace.log": _check_fx_trace_logger,
    "torch.distributed._state_dict_utils._create_cpu_state_dict": _check_state_dict_utils,
    "torch.distributed._state_dict_utils._copy_state_dict": _check_state_dict_utils,
    "torch.distributed._shard.sharding_spec.EnumerableShardingSpec": _check_sharding_spec,
    "torch.distributed._shard.sharding_spec.ShardMetadata": _check_sharding_spec,
    "torch._dynamo.config.error_on_nested_fx_trace": _check_dynamo,
    "torch._dynamo.config.optimize_ddp": _check_dynamo,
    "torch._dynamo.reset": _check_dynamo,
    "torch._dynamo.utils.counters": _check_dynamo_counters,
    "DistributedDataParallel._get_ddp_logging_data": _check_ddp_comm_hook,
    "torch.autograd.Variable._execution_engine.queue_callback": _check_end_of_backward_callback,
    "torch.cuda._sleep": _check_gpu_spin,
    "torch.distributed.checkpoint.filesystem._StorageInfo.relative_path": _check_written_files,
    "torch.utils._python_dispatch.TorchDispatchMode": _check_record_collectives,
    "c10d::_reduce_scatter_base_": _check_record_collectives,
    "c10d::_allgather_base_": _check_record_collectives,
    "RwSparseFeaturesDist._feature_block_sizes_tensor": _check_row_blocks,
    "TwRwSparseFeaturesDist._feature_block_sizes_tensor": _check_table_row_blocks,
    "TwRwSparseFeaturesDist._local_size": _check_table_row_blocks,
}
NEEDS_SHARDED = {
    _check_input_dist,
    _check_output_dist,
    _check_pooled_a2a,
    _check_state_dict_utils,
    _check_record_collectives,
    _check_ddp_comm_hook,
}


def test_every_private_name_has_a_behavioural_check() -> None:
    assert set(CHECKS) == set(compat.PRIVATE_NAMES)


@pytest.mark.parametrize("name", sorted(compat.PRIVATE_NAMES))
def test_private_name_does_what_the_trainer_relies_on(name: str, request: pytest.FixtureRequest) -> None:
    check = CHECKS[name]
    if check in NEEDS_SHARDED:
        check(request.getfixturevalue("sharded"))
    else:
        check()


@pytest.mark.parametrize(
    "version, ok",
    [
        ("1.8.0", True),
        ("1.6.1", True),
        ("1.8.0+cpu", True),
        ("1.6.0", True),
        ("1.9.2", True),
        ("1.9.0+cpu", True),
        ("1.7.0", False),
        ("1.10.0", False),
        ("1.5.2", False),
        ("2.0.0", False),
    ],
)
def test_version_check(version: str, ok: bool) -> None:
    if ok:
        compat.check_torchrec_version(version)
        return
    with pytest.raises(compat.UnsupportedVersionError) as e:
        compat.check_torchrec_version(version)
    assert str(e.value).startswith(
        f"torchrec {version} is installed, but this trainer relies on TorchRec internals "
        "verified on torchrec 1.6.x, 1.8.x and 1.9.x only (dlrm/torchrec_compat.py); install a verified stack: "
        "torch 2.14.1, fbgemm-gpu-cpu 1.9.0 and torchrec 1.9.2 (CPU, make venv STACK=cpu-1.9)"
    )


def test_missing_internal_is_named() -> None:
    """A sharded module without the list the trainer reads fails naming the internal and what it is for."""
    from torchrec.distributed.types import ShardedModule

    class Bare(torch.nn.Module):
        pass

    with pytest.raises(
        compat.MissingInternalError,
        match=r"`ShardedModule._output_dists` is missing in this "
        r"TorchRec / torch version \(list of a sharded module's "
        r"output dists\); dlrm/torchrec_compat.py needs updating",
    ):
        compat.output_dists(Bare())  # type: ignore[arg-type]
    del ShardedModule
