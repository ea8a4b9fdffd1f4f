"""``pipeline=graphed`` (dlrm/graphed.py): the same training as TorchRec's pipeline, bit for bit.

On CPU the pipeline runs its capture path eagerly (``capture=False``): warm-up steps, the held input dist and its
gather index, the dense Adagrad on the optimizer's state, the eager fallback for a partial batch, and the bag-size
check; on two gloo ranks, and on four as 2 hosts x 2, also the ids all-to-all with fixed splits (checked against
TorchRec's input dist for every sharding type it takes; row_wise and table_row_wise tables as whole bags with
weights 0 and 1, whose premise, that weight-0 ids change no row or Adagrad state, is checked on FBGEMM's TBE) and
the dense gradients' all-reduce (in DDP's bucket order, which four ranks need to sum bit for bit). On a GPU host
(``pytest -m gpu``) the same comparison runs with the CUDA graph captured and replayed, the several-rank path forced
on a one-rank NCCL world too.

    .venv/bin/python -m pytest -q tests/test_graphed.py
"""

from __future__ import annotations

import tempfile
from typing import Any, Dict, List, Tuple

import pytest
import torch

from conftest import run_gloo
from dlrm.config import compose, to_config
from dlrm.errors import ConfigError

BATCH = 32
STEPS = 9  # 2 warm-up, the rehearsal, 5 captured or held-input-dist steps, then a partial batch
STEPS_RANKS = 12  # one-rank NCCL world: 2 warm-up, the rehearsal, 8 graph steps, then a partial batch
# a warm-up over steps 0-2, the base rate over 3-8, a decay over 8-11 to its floor, the floor from 11 on (lr 0.01)
SCHEDULE = (
    "optimizer.warmup_steps=3",
    "optimizer.decay_start_step=8",
    "optimizer.decay_steps=4",
    "optimizer.decay_power=2",
    "optimizer.end_lr=0.00125",
)
STEPS_SCHEDULE = 16
# 1-based steps: eager 1-2 (warm-up), 3 (rate rising), 10-12 (decaying), 16 (partial batch); rehearsal 4 (the base
# rate held), 13 (the floor held); graph 5-9 (step 9 the decay's first, at the base rate) and 14-15
SCHEDULE_PATHS = {"eager": 7, "rehearsal": 2, "graph": 7}
# the ids all-to-all on a group of its own: each step sends the next batch's ids (ids ahead)
DEDICATED = "sharding=table_wise pipeline.input_dist_group=dedicated"
AHEAD_PATHS = {"graph": 8, "ids_received_ahead": 8}  # STEPS_RANKS steps on one rank


def _cfg(sharding: str, sparse_type: str, pipeline: str, device: str, extra: Tuple[str, ...] = ()) -> Any:
    return to_config(
        compose(
            [
                "model=dlrm_v2_small",
                "model.row_cap=300",
                *(extra or [f"sharding={sharding}"]),
                f"optimizer.sparse_type={sparse_type}",
                f"pipeline={pipeline}",
                f"device={device}",
                f"data.batch_size={BATCH}",
            ]
        )
    )


def _batches(cfg: Any, device: torch.device, steps: int = STEPS, rank: int = 0) -> List[Any]:
    """``steps - 1`` full batches and a half one; each rank its own ids."""
    from bench.runner import make_batches

    full = make_batches(cfg.model, BATCH, steps - 1, device, False, seed=7 + 100 * rank)
    return full + make_batches(cfg.model, BATCH // 2, 1, device, False, seed=8 + 100 * rank)


def _train(
    cfg: Any, graphed: bool, capture: bool, steps: int = STEPS, ids_all_to_all: Any = None
) -> Tuple[List[float], Dict[str, torch.Tensor], Dict[str, Any]]:
    import torch.distributed as dist

    from dlrm.graphed import GraphedTrainPipeline
    from dlrm.process_group import init_distributed
    from dlrm.trainer import build_training

    info = init_distributed(cfg.device)
    torch.manual_seed(0)
    built = build_training(cfg, info, BATCH)
    pipe = built.pipeline
    if graphed and (not capture or ids_all_to_all is not None):  # CPU: the capture path, run eagerly
        pipe = GraphedTrainPipeline(
            built.model, built.optimizer, built.dense, info.device, capture=capture, ids_all_to_all=ids_all_to_all
        )
    it = iter(_batches(cfg, info.device, steps, dist.get_rank()))
    losses = []
    for _ in range(steps):  # as the trainer: the scheduler gives the next step's rate after each step
        losses.append(float(pipe.progress(it)[0]))
        built.scheduler.step()
    with pytest.raises(StopIteration):
        pipe.progress(it)
    state = {k: _plain(v) for k, v in built.model.state_dict().items()}
    opt = {k: {n: _plain(t) for n, t in st.items()} for k, st in built.optimizer.state_dict()["state"].items()}
    paths = getattr(pipe, "path_steps", None)
    return losses, state, opt, paths and {**paths, "ids_received_ahead": pipe.ids_received_ahead}


def _plain(v: Any) -> Any:
    if hasattr(v, "local_shards"):  # a ShardedTensor's repr shows its metadata, never its values
        return [s.tensor.detach().cpu().clone() for s in v.local_shards()]
    return v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v


def _compare(
    rank: int,
    world: int,
    device: str,
    capture: bool,
    cases: List[Tuple[str, str]],
    steps: int = STEPS,
    ids_all_to_all: Any = None,
    paths: Any = None,
) -> List[str]:
    """Train each ``(sharding, sparse_type)`` case (``sharding`` with spaces: the overrides of the plan and more)
    through ``pipeline=sparse_dist`` and the graphed pipeline; assert bit-for-bit equal losses, state and optimizer
    state, and with ``paths`` the graphed pipeline's ``path_steps`` (and ``ids_received_ahead`` where given)."""
    out = []
    for sharding, sparse_type in cases:
        extra = tuple(sharding.split()) if " " in sharding else ()
        ref = _train(_cfg(sharding, sparse_type, "sparse_dist", device, extra), False, False, steps)
        got = _train(
            _cfg(sharding, sparse_type, "graphed" if capture else "base", device, extra),
            True,
            capture,
            steps,
            ids_all_to_all,
        )
        assert got[0] == ref[0], (sharding, sparse_type, got[0], ref[0])
        assert paths is None or {k: got[3][k] for k in paths} == paths, (sharding, sparse_type, got[3])
        assert sorted(got[1]) == sorted(ref[1])
        diff = [k for k in ref[1] if not _same_state(got[1][k], ref[1][k])]
        assert not diff, (sharding, sparse_type, diff[:4])
        assert {k: sorted(st) for k, st in got[2].items()} == {k: sorted(st) for k, st in ref[2].items()}
        bad = [(k, n) for k in ref[2] for n in ref[2][k] if not _same_state(got[2][k][n], ref[2][k][n])]
        assert not bad, (sharding, sparse_type, bad[:4])
        n_opt = sum(len(st) for st in ref[2].values())
        out.append(f"{sharding}/{sparse_type}: {len(ref[0])} losses, {len(ref[1])} tensors, {n_opt} optimizer states")
    return out


def _same_state(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same_state, a, b))
    return a == b


def _cpu_checks(rank: int, world: int) -> List[str]:
    schedule = " ".join(("sharding=table_wise",) + SCHEDULE)
    return (
        _compare(rank, world, "cpu", False, [("table_wise", "adagrad"), ("row_wise", "rowwise_adagrad")])
        + _compare(rank, world, "cpu", False, [(schedule, "adagrad")], STEPS_SCHEDULE, paths=SCHEDULE_PATHS)
        + _compare(rank, world, "cpu", False, [(DEDICATED, "adagrad")], STEPS_RANKS, True, AHEAD_PATHS)
        + [_bag_sizes(rank, world)]
    )


def test_capture_path_trains_as_torchrec_pipeline_bit_for_bit_and_checks_bag_sizes_on_cpu() -> None:
    """One process for all: the comparison of two plans and optimizers; with a learning-rate warm-up and decay
    over 16 steps (the rising and decaying steps eager, the base rate and the decay's floor each held and run
    along the capture path); and a batch of other bag sizes (as many ids, two bags of the first table swapping
    sizes) that the pipeline reports instead of replaying it. And the ids all-to-all forced on one rank with the
    next batch's ids sent ahead on a group of their own, where TorchRec's input dist hands back the KJT's own ids
    (the ids loaded ahead must not overwrite those the step looks up)."""
    (msgs,) = run_gloo(1, _cpu_checks)
    assert len(msgs) == 5 and msgs[-1] == "ok" and f"{STEPS_SCHEDULE} losses" in msgs[2], msgs
    assert f"{STEPS_RANKS} losses" in msgs[3], msgs


@pytest.mark.gpu
def test_cuda_graph_replays_train_as_torchrec_pipeline_bit_for_bit() -> None:
    (msgs,) = run_gloo(1, _compare, "cuda", True, [("table_wise", "adagrad"), ("table_wise", "rowwise_adagrad")])
    assert len(msgs) == 2, msgs


@pytest.mark.gpu
def test_cuda_graph_with_a_learning_rate_schedule_trains_as_torchrec_pipeline_bit_for_bit() -> None:
    """A warm-up and decay over 16 steps: the graph captured at the base rate, dropped, and captured again at the
    decay's floor, the other steps eager; on one GPU, and with the ids all-to-all forced on a one-rank NCCL
    world."""
    cases = [(" ".join(("sharding=table_wise",) + SCHEDULE), t) for t in ("adagrad", "rowwise_adagrad")]
    (msgs,) = run_gloo(1, _compare, "cuda", True, cases, STEPS_SCHEDULE, None, SCHEDULE_PATHS)
    assert len(msgs) == 2, msgs
    (msgs,) = run_gloo(1, _nccl_compare, cases[:1], STEPS_SCHEDULE, SCHEDULE_PATHS)
    assert len(msgs) == 1, msgs


# a plan of every sharding type the ids all-to-all takes: table_wise, column_wise, data_parallel tables
MIXED = (
    "sharding=table_wise",
    "+sharding.constraints.t_cat_1.sharding_types=[column_wise]",
    "+sharding.constraints.t_cat_2.sharding_types=[data_parallel]",
    "+sharding.constraints.t_cat_3.sharding_types=[column_wise]",
    "sharding.min_partition=8",
)


def test_capture_path_on_two_ranks_trains_as_torchrec_pipeline_bit_for_bit() -> None:
    """2 gloo ranks, each its own ids: the capture path run eagerly (ids all-to-all with fixed splits, dense
    all-reduce inside the step) against ``pipeline=sparse_dist`` over 15 full batches and a half one, under a
    learning-rate warm-up and decay (both ranks take the same path at every step); losses, every table shard,
    dense parameters and optimizer state equal bit for bit. The input dist runs on its own group, so each step
    sends the next batch's ids: 7 steps train on ids sent by the step before (the others follow an eager step, or
    are the first after one). Then one rank's batch of other bag sizes makes both ranks raise."""
    results = run_gloo(2, _two_rank_checks)
    for msgs in results:
        assert len(msgs) == 2 and f"{STEPS_SCHEDULE} losses" in msgs[0] and msgs[1] == "ok", msgs


def _two_rank_checks(rank: int, world: int) -> List[str]:
    """The comparison, then a batch of other bag sizes on one rank only, which both ranks report."""
    # with the lean output dist and DDP's all-reduce held behind it, as perf=fast has them on several GPUs
    held = ("perf.lean_output_dist=true", "perf.allreduce_after_output_dist=true")
    case = " ".join(MIXED + held + ("pipeline.input_dist_group=dedicated",) + SCHEDULE)
    paths = {**SCHEDULE_PATHS, "ids_received_ahead": 7}
    return _compare(rank, world, "cpu", False, [(case, "adagrad")], STEPS_SCHEDULE, paths=paths) + [
        _bag_sizes(rank, world)
    ]


@pytest.mark.gpu
def test_cuda_graph_with_ids_all_to_all_on_one_rank_trains_as_torchrec_pipeline_bit_for_bit() -> None:
    """The several-rank path forced on a one-rank NCCL world: the ids all-to-all, output dist and dense
    all-reduce are NCCL collectives captured in the graph; with the input dist on its own group, the next
    batch's ids all-to-all on a stream of its own inside the graph (8 steps on ids the step before sent)."""
    (msgs,) = run_gloo(1, _nccl_compare, [("table_wise", "adagrad"), ("table_wise", "rowwise_adagrad")])
    assert len(msgs) == 2, msgs
    (msgs,) = run_gloo(1, _nccl_compare, [(DEDICATED, "adagrad")], STEPS_RANKS, AHEAD_PATHS)
    assert len(msgs) == 1, msgs


@pytest.mark.gpu
def test_cuda_graph_with_a_row_wise_table_on_one_rank_trains_as_torchrec_pipeline_bit_for_bit() -> None:
    """The several-rank path forced on a one-rank NCCL world with a row_wise table: its whole bags and 0/1
    weights (all 1 on one rank) built and fed to the TBE inside the captured graph."""
    (msgs,) = run_gloo(1, _nccl_compare, [(" ".join(ROW_WISE), "adagrad"), (" ".join(ROW_WISE), "rowwise_adagrad")])
    assert len(msgs) == 2, msgs


def _nccl_compare(
    rank: int, world: int, cases: List[Tuple[str, str]], steps: int = STEPS_RANKS, paths: Any = None
) -> List[str]:
    import torch.distributed as dist

    dist.destroy_process_group()  # the runner's gloo group: this check issues NCCL collectives
    store = tempfile.mkdtemp(prefix="nccl_")
    dist.init_process_group("nccl", init_method=f"file://{store}/store", rank=0, world_size=1)
    return _compare(rank, world, "cuda", True, cases, steps, ids_all_to_all=True, paths=paths)


def _static_input_dist(rank: int, world: int, cases: List[Tuple[str, Tuple[str, ...]]]) -> Dict[str, Any]:
    from torchrec.distributed.types import ShardedModule

    from dlrm.errors import ConfigError
    from dlrm.process_group import init_distributed
    from dlrm.static_input_dist import StaticInputDist
    from dlrm.trainer import build_training

    torch.set_num_threads(1)
    info = init_distributed("cpu")
    out: Dict[str, Any] = {}
    for label, overrides in cases:
        built = build_training(_cfg("", "adagrad", "base", "cpu", overrides), info, BATCH)
        (module,) = [m for m in built.model.modules() if isinstance(m, ShardedModule)]
        batches = _batches(_cfg("", "adagrad", "base", "cpu", overrides), info.device, 5, rank)[:4]
        kjt = batches[0].sparse_features
        try:
            held = module.input_dist(module.create_context(), kjt).wait().wait()
            static = StaticInputDist(module, kjt, held)
        except ConfigError as e:
            out[label] = f"refused: {e}"
            continue
        checks = []
        for b in batches:  # the held batch, then three more: the same layout, other ids
            static.run(b.sparse_features.values())
            checks.append(static.check(module, b.sparse_features))
        out[label] = {
            "checks": checks,
            "ids": sum(p.values().numel() for p in held),
            "sent": sum(static.send_splits),
            "received": sum(static.recv_splits),
        }
    return out


STATIC_CASES = [
    ("mixed", MIXED),  # table_wise, column_wise, data_parallel
    ("table_column_wise", ("sharding.sharding_types=[table_column_wise]", "sharding.min_partition=8")),
    ("row_wise", ("sharding=row_wise",)),
    ("table_row_wise", ("sharding=table_row_wise",)),
    ("grid_shard", ("sharding=grid_shard", "sharding.min_partition=8")),
]
# table_row_wise beside table_wise and row_wise tables: on 2 hosts the plan puts table_row_wise tables on both
TWRW_MIXED = (
    "sharding=table_row_wise",
    "+sharding.constraints.t_cat_0.sharding_types=[table_wise]",
    "+sharding.constraints.t_cat_1.sharding_types=[row_wise]",
)


def test_static_input_dist_equals_torchrec_input_dist_for_every_sharding_type_2_ranks() -> None:
    """2 gloo ranks, each its own ids: the ids all-to-all with fixed splits gives TorchRec's input-dist output bit
    for bit (ids and bag sizes; for row_wise and table_row_wise the weight-1 ids of the whole bags and their count
    per bag) on the batch it was made from and on three others, for every sharding type that routes ids by feature
    and for the row-split ones; grid_shard is refused, naming the reason."""
    results = run_gloo(2, _static_input_dist, STATIC_CASES)
    for rank, res in enumerate(results):
        for label, _ in STATIC_CASES:
            got = res[label]
            if label == "grid_shard":
                assert isinstance(got, str) and "grid_shard input dist sends each id to the rank holding" in got, got
                continue
            assert got["checks"] == [(True, "")] * 4, (rank, label, got)
    # what each rank sends is what the others receive, and each rank's lookups get ids from both ranks
    for label in ("mixed", "table_column_wise", "row_wise", "table_row_wise"):
        assert sum(r[label]["sent"] for r in results) == sum(r[label]["received"] for r in results) > 0


def _static_input_dist_two_hosts(rank: int, world: int, cases: List[Tuple[str, Tuple[str, ...]]]) -> Dict[str, Any]:
    import os

    os.environ.update(LOCAL_WORLD_SIZE="2", LOCAL_RANK=str(rank % 2))  # 2 hosts x 2 ranks
    return _static_input_dist(rank, world, cases)


def test_static_input_dist_equals_torchrec_input_dist_on_two_hosts_of_2_ranks() -> None:
    """4 gloo ranks as 2 hosts x 2: the same for a plan of table_wise, column_wise and data_parallel tables, for
    row_wise tables (whole bags to every rank), and for table_row_wise tables beside table_wise and row_wise ones
    (whole bags to the ranks of the table's host, from every rank in TorchRec's staggered order)."""
    cases = [STATIC_CASES[0], STATIC_CASES[2], ("table_row_wise", TWRW_MIXED)]
    results = run_gloo(4, _static_input_dist_two_hosts, cases)
    for rank, res in enumerate(results):
        for label, _ in cases:
            assert res[label]["checks"] == [(True, "")] * 4, (rank, label, res[label])
    # every rank receives table_row_wise ids: both hosts hold such tables
    assert all(r["table_row_wise"]["received"] > 0 for r in results)
    assert sum(r["table_row_wise"]["sent"] for r in results) == sum(r["table_row_wise"]["received"] for r in results)


def _bag_sizes(rank: int, world: int) -> str:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from dlrm.graphed import GraphedTrainPipeline
    from dlrm.model import BatchError
    from dlrm.process_group import init_distributed
    from dlrm.trainer import build_training

    cfg = _cfg("table_wise", "adagrad", "base", "cpu")
    info = init_distributed("cpu")
    built = build_training(cfg, info, BATCH)
    pipe = GraphedTrainPipeline(built.model, built.optimizer, built.dense, info.device, capture=False)
    batches = _batches(cfg, info.device, STEPS, rank)[:5]
    if rank == world - 1:  # on several ranks only the last one's batch: every rank must raise, none wait
        # the last batch has as many ids, but its first two samples' bags of the first table swap sizes
        kjt = batches[-1].sparse_features
        lengths = kjt.lengths().clone()
        lengths[0], lengths[1] = lengths[0] + 1, lengths[1] - 1
        batches[-1].sparse_features = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=lengths)
    it = iter(batches)
    for _ in range(5):
        pipe.progress(it)
    with pytest.raises(BatchError, match="bag sizes .* differ from those of the batch the step was captured with"):
        pipe.check_bag_sizes()
    return "ok"


@pytest.mark.parametrize(
    "overrides,world,device,match",
    [
        ([], 1, "cpu", "replays a CUDA graph, but this run is on cpu"),
        (["sharding=grid_shard"], 2, "cuda", "grid_shard tables send each id to the rank that holds its row"),
        (["perf.allreduce_dtype=bf16"], 2, "cuda", "dense gradients in fp32 .*perf.allreduce_dtype=bf16"),
        (["offload=uvm"], 1, "cuda", "not built for offload=uvm"),
    ],
)
def test_what_a_replay_cannot_follow_is_refused(overrides: List[str], world: int, device: str, match: str) -> None:
    from dlrm.graphed import check_graphed

    cfg = to_config(compose(["pipeline=graphed"] + overrides))
    with pytest.raises(ConfigError, match=match):
        check_graphed(cfg, world, torch.device(device))
    check_graphed(to_config(compose(["pipeline=graphed"])), 1, torch.device("cuda"))  # the default config passes
    check_graphed(to_config(compose(["pipeline=graphed"])), 8, torch.device("cuda"))  # several ranks too
    # a schedule's changing rates train eagerly (GraphedTrainPipeline), so it is taken
    check_graphed(to_config(compose(["pipeline=graphed", *SCHEDULE])), 8, torch.device("cuda"))


def test_a_plan_with_grid_shard_tables_is_refused_on_several_ranks() -> None:
    """The planner's choice, not the preset: a grid_shard table in the plan of an auto run; row_wise and
    table_row_wise tables are taken (whole bags, fixed splits)."""
    from dlrm.graphed import check_graphed

    cfg = to_config(compose(["pipeline=graphed"]))
    with pytest.raises(ConfigError, match="grid_shard tables send each id to the rank that holds its row"):
        check_graphed(cfg, 16, torch.device("cuda"), ["table_wise", "grid_shard", "table_row_wise"])
    check_graphed(cfg, 16, torch.device("cuda"), ["table_wise", "column_wise"])
    check_graphed(cfg, 16, torch.device("cuda"), ["table_wise", "row_wise", "table_row_wise"])
    check_graphed(cfg, 1, torch.device("cuda"), ["grid_shard"])  # one rank: nothing is sent
    table_row_wise = to_config(compose(["pipeline=graphed", "sharding=table_row_wise"]))
    check_graphed(table_row_wise, 16, torch.device("cuda"))
    for world in (1, 16):  # the compiled dense step does not take data_parallel tables' weights
        with pytest.raises(ConfigError, match="that compile fails on data_parallel tables' weights"):
            check_graphed(cfg, world, torch.device("cuda"), ["table_wise", "data_parallel"])
    dp = to_config(compose(["pipeline=graphed", "sharding.sharding_types=[table_wise,data_parallel]"]))
    with pytest.raises(ConfigError, match="keep data_parallel out of the plan"):
        check_graphed(dp, 1, torch.device("cuda"))


@pytest.mark.parametrize(
    "device, weight_decay",
    [
        ("cpu", 0.0),
        ("cpu", 1e-4),
        pytest.param("cuda", 0.0, marks=pytest.mark.gpu),
        pytest.param("cuda", 1e-4, marks=pytest.mark.gpu),
    ],
)
def test_one_pass_adagrad_equals_torch_adagrad_bit_for_bit(device: str, weight_decay: float) -> None:
    """The dense step a graph records: on CPU the function itself, on CUDA compiled as the pipeline compiles it,
    against ``torch.optim.Adagrad`` (foreach) over 3 steps, on the MLPerf DCN's and over arch's shapes."""
    from dlrm.dense_step import EAGER_DIVISION, adagrad_one_pass

    gen = torch.Generator().manual_seed(0)
    shapes = [(512, 3456), (3456, 512), (3456,), (1024, 3456), (1024,), (1, 256)]
    ref = [torch.randn(s, generator=gen).to(device).requires_grad_() for s in shapes]
    got = [p.detach().clone() for p in ref]
    sums = [torch.zeros_like(p) for p in got]
    opt = torch.optim.Adagrad(ref, lr=0.004, eps=1e-8, weight_decay=weight_decay, foreach=True)

    def step(ps: List[torch.Tensor], gs: List[torch.Tensor], ss: List[torch.Tensor]) -> None:
        adagrad_one_pass(ps, gs, ss, lr=0.004, eps=1e-8, weight_decay=weight_decay)

    fn = step if device == "cpu" else torch.compile(step, fullgraph=True, dynamic=False, options=EAGER_DIVISION)
    for _ in range(3):
        grads = [torch.randn(s, generator=gen).to(device) * 0.1 for s in shapes]
        for p, g in zip(ref, grads):
            p.grad = g.clone()
        opt.step()
        fn(got, grads, sums)
    for p, q in zip(ref, got):
        assert torch.equal(p.detach(), q), (p.shape, (p.detach() - q).abs().max().item())
    for p, s in zip(ref, sums):
        assert torch.equal(opt.state[p]["sum"], s)


EVAL_BATCH = 2 * BATCH


def _eval_compare(
    rank: int, world: int, device: str, capture: bool, plan: Tuple[str, ...] = MIXED, ids_all_to_all: Any = None
) -> List[str]:
    """Train 4 steps through the graphed pipeline, then evaluate 5 full batches and a half one twice: eagerly as
    the trainer does without the pipeline (``model(batch)``), and through :meth:`GraphedTrainPipeline.evaluate`;
    the outputs (loss, logits, labels) and the AUC (sklearn) equal bit for bit. Then a batch of other bag sizes on
    the last rank makes every rank raise at the end of the pass."""
    import torch.distributed as dist
    from sklearn.metrics import roc_auc_score
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from bench.runner import make_batches
    from dlrm.graphed import GraphedTrainPipeline
    from dlrm.model import BatchError
    from dlrm.process_group import init_distributed
    from dlrm.trainer import build_training

    torch.set_num_threads(1)
    cfg = _cfg("", "adagrad", "graphed" if capture else "base", device, plan)
    info = init_distributed(cfg.device)
    torch.manual_seed(0)
    built = build_training(cfg, info, BATCH)
    pipe = GraphedTrainPipeline(
        built.model, built.optimizer, built.dense, info.device, capture=capture, ids_all_to_all=ids_all_to_all
    )
    it = iter(_batches(cfg, info.device, 4, dist.get_rank()))
    for _ in range(4):
        pipe.progress(it)
    rank_seed = 50 + 100 * dist.get_rank()
    evals = make_batches(cfg.model, EVAL_BATCH, 5, info.device, False, seed=rank_seed)
    evals += make_batches(cfg.model, EVAL_BATCH // 2, 1, info.device, False, seed=rank_seed + 1)
    weights = [torch.ones(b.labels.numel()) for b in evals]
    model = pipe.detach()
    model.eval()
    with torch.no_grad():
        ref = [model(b)[1] for b in evals]
        got = [out for out, _ in pipe.evaluate(zip(evals, weights))]
        again = [out for out, _ in pipe.evaluate(zip(evals, weights))]  # the second pass: all replays
    assert len(got) == len(ref) == 6
    for outs in (got, again):
        for r, g in zip(ref, outs):
            assert len(r) == len(g) == 3 and all(torch.equal(a, b) for a, b in zip(r, g)), [
                (a - b).abs().max().item() for a, b in zip(r, g)
            ]

    def auc(outs: List[Any]) -> float:
        logits = torch.cat([o[1] for o in outs]).float().cpu().numpy()
        return float(roc_auc_score(torch.cat([o[2] for o in outs]).cpu().numpy(), logits))

    assert auc(got) == auc(ref) == auc(again)
    if rank == world - 1:  # as many ids, two bags of the first table swapping sizes, on the last rank only
        kjt = evals[3].sparse_features
        lengths = kjt.lengths().clone()
        lengths[0], lengths[1] = lengths[0] + 1, lengths[1] - 1
        evals[3].sparse_features = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=lengths)
    with torch.no_grad(), pytest.raises(BatchError, match="evaluation batch's bag sizes .* differ"):
        list(pipe.evaluate(zip(evals, weights)))
    model.train()
    held = pipe._eval_held  # the capture path ran: input buffers held, ids sent with fixed splits on several ranks
    assert held is not None and (held.static_dist is not None) == (world > 1 or bool(ids_all_to_all))
    return [f"{len(ref)} batches, AUC {auc(ref):.6f}"]


@pytest.mark.parametrize("world", [1, 2])
def test_evaluation_capture_path_equals_eager_evaluation_bit_for_bit(world: int) -> None:
    """1 and 2 gloo ranks (2: the ids all-to-all with fixed splits on a mixed plan): the evaluation's capture path
    run eagerly gives the eager evaluation's outputs and AUC bit for bit, the half last batch through the eager
    fallback; other bag sizes are reported on every rank."""
    results = run_gloo(world, _eval_compare, "cpu", False)
    assert [r[0].split(",")[0] for r in results] == ["6 batches"] * world, results


@pytest.mark.gpu
def test_cuda_graph_evaluation_equals_eager_evaluation_bit_for_bit() -> None:
    """The evaluation forward captured and replayed on one GPU, and with the ids all-to-all forced on a one-rank
    NCCL world (collectives captured in the graph)."""
    (msgs,) = run_gloo(1, _eval_compare, "cuda", True, ("sharding=table_wise",))
    assert msgs[0].startswith("6 batches"), msgs
    (msgs,) = run_gloo(1, _nccl_eval_compare)
    assert msgs[0].startswith("6 batches"), msgs


def _nccl_eval_compare(rank: int, world: int) -> List[str]:
    import torch.distributed as dist

    dist.destroy_process_group()  # the runner's gloo group: this check issues NCCL collectives
    store = tempfile.mkdtemp(prefix="nccl_")
    dist.init_process_group("nccl", init_method=f"file://{store}/store", rank=0, world_size=1)
    return _eval_compare(rank, world, "cuda", True, ("sharding=table_wise",), ids_all_to_all=True)


# a row_wise table (whole bags to both ranks, out-of-range ids weighted 0) beside table_wise and column_wise ones
ROW_WISE = (
    "sharding=table_wise",
    "+sharding.constraints.t_cat_0.sharding_types=[row_wise]",
    "+sharding.constraints.t_cat_1.sharding_types=[column_wise]",
    "sharding.min_partition=8",
)
STEPS_ROW_WISE = 11  # 2 warm-up, the rehearsal, 7 along the capture path, then a partial batch


def test_capture_path_with_a_row_wise_table_on_two_ranks_trains_as_torchrec_pipeline_bit_for_bit() -> None:
    """2 gloo ranks, each its own ids, a row_wise table: the capture path run eagerly against
    ``pipeline=sparse_dist`` over 10 full batches and a half one; losses, every table shard, dense parameters and
    optimizer state equal bit for bit (the weight-0 ids change no row)."""
    paths = {"eager": 3, "rehearsal": 1, "graph": 7}
    results = run_gloo(2, _compare, "cpu", False, [(" ".join(ROW_WISE), "adagrad")], STEPS_ROW_WISE, None, paths)
    # each rank's optimizer states: those of its table shards and the dense parameters
    assert [m for msgs in results for m in msgs] == [
        f"{' '.join(ROW_WISE)}/adagrad: {STEPS_ROW_WISE} losses, 47 tensors, {n} optimizer states" for n in (52, 59)
    ]


def _compare_two_hosts(rank: int, world: int, *args: Any) -> List[str]:
    import os

    os.environ.update(LOCAL_WORLD_SIZE="2", LOCAL_RANK=str(rank % 2))  # 2 hosts x 2 ranks
    return _compare(rank, world, *args)


def test_capture_path_with_table_row_wise_tables_on_two_hosts_trains_as_torchrec_pipeline_bit_for_bit() -> None:
    """4 gloo ranks as 2 hosts x 2, each its own ids, table_row_wise tables on both hosts beside a table_wise and a
    row_wise table: the capture path run eagerly against ``pipeline=sparse_dist`` over 10 full batches and a half
    one; losses, every table shard, dense parameters and optimizer state equal bit for bit."""
    paths = {"eager": 3, "rehearsal": 1, "graph": 7}
    case = [(" ".join(TWRW_MIXED), "adagrad")]
    results = run_gloo(4, _compare_two_hosts, "cpu", False, case, STEPS_ROW_WISE, None, paths)
    assert [m.split(": ")[1].split(",")[0] for msgs in results for m in msgs] == [f"{STEPS_ROW_WISE} losses"] * 4


def _weight_zero_ids_change_nothing(device: str) -> None:
    """A TBE fed a row_wise shard's whole bags (ids outside the shard as row 0 with weight 0, the others with
    weight 1) pools, and updates every row and its Adagrad state, as on the in-range ids alone, bit for bit over
    5 steps; row 0, looked up only with weight 0, stays as it was."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    dev = torch.device(device)
    where = (
        (EmbeddingLocation.DEVICE, ComputeDevice.CUDA)
        if device == "cuda"
        else (EmbeddingLocation.HOST, ComputeDevice.CPU)
    )
    for opt in (EmbOptimType.EXACT_ADAGRAD, EmbOptimType.EXACT_ROWWISE_ADAGRAD):
        tbes = []
        for _ in range(2):
            torch.manual_seed(0)
            tbes.append(
                SplitTableBatchedEmbeddingBagsCodegen(
                    [(50, 16, *where)], optimizer=opt, learning_rate=0.1, eps=1e-8, device=dev
                )
            )
        weighted, plain = tbes
        row0 = weighted.split_embedding_weights()[0][0].clone()
        state0 = [s[0].clone() for s in weighted.split_optimizer_states()[0]]
        for step in range(5):
            g = torch.Generator().manual_seed(step)
            ids = torch.randint(1, 100, (64, 4), generator=g)  # a 100-row table; this shard holds rows [0, 50)
            grad = torch.randn(64, 16, generator=g).to(dev)
            mine = ids < 50
            out_w = weighted(
                torch.where(mine, ids, 0).flatten().to(dev),
                torch.arange(0, 257, 4, device=dev),
                per_sample_weights=mine.flatten().float().to(dev),
            )
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), mine.sum(1).cumsum(0)])
            out_p = plain(ids[mine].to(dev), offsets.to(dev))
            assert torch.equal(out_w, out_p), (opt, step)
            out_w.backward(grad)
            out_p.backward(grad)
        assert torch.equal(weighted.split_embedding_weights()[0], plain.split_embedding_weights()[0]), opt
        for a, b in zip(weighted.split_optimizer_states()[0], plain.split_optimizer_states()[0]):
            assert torch.equal(a, b), opt
        assert torch.equal(weighted.split_embedding_weights()[0][0], row0), opt
        assert all(torch.equal(s[0], s0) for s, s0 in zip(weighted.split_optimizer_states()[0], state0)), opt


def test_weight_zero_ids_leave_rows_and_adagrad_state_bit_for_bit_on_cpu() -> None:
    _weight_zero_ids_change_nothing("cpu")


@pytest.mark.gpu
def test_weight_zero_ids_leave_rows_and_adagrad_state_bit_for_bit_on_cuda() -> None:
    _weight_zero_ids_change_nothing("cuda")


def test_too_few_table_row_wise_ids_for_the_probe_are_refused_naming_the_batch_size() -> None:
    """The probe that learns TorchRec's staggered source order sends one id of each table_row_wise feature to each
    rank of its host: a batch with fewer ids of that feature than ranks per host is refused before any collective
    (every rank has the same count, so all refuse together)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from dlrm.static_input_dist import _probe

    kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(5), lengths=torch.tensor([1, 1, 1, 1, 1, 0]))
    probe = _probe(kjt, {"a"}, {"b": (2, 10)}, rank=1, world=4)  # b: 2 ids for 2 ranks per host, rows 10 a block
    assert probe.values().tolist() == [0, 0, 0, 0, 10] and probe.weights().tolist() == [1.0] * 5
    with pytest.raises(ConfigError, match=r"^config key `data.batch_size`: .* feature b .* 2 of its ids on this rank "):
        _probe(kjt, {"a"}, {"b": (3, 10)}, rank=1, world=4)
