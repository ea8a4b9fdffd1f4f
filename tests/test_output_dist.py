"""``perf.lean_output_dist`` (dlrm/output_dist.py) against TorchRec's pooled-embedding all-to-all, in 2 gloo processes.

* The all-to-all alone: TorchRec's ``PooledEmbeddingsAllToAll`` and the same module switched to the lean functions
  get the same inputs and upstream gradients (unequal dims per rank, a rank with no tables, uneven batches per
  rank, a non-contiguous upstream gradient, a callback, TorchRec's gradient division on and off); outputs and
  input gradients are compared bit for bit.
* The trainer: ``build_training`` on 2 ranks (table_wise and column_wise tables, the pipeline, the fused
  optimizer) trains 4 steps with and without the switch: same losses, evaluation logits and tables, bit for bit;
  the same with table_wise tables only (rank blocks gathered by the sparse arch), and with DDP's all-reduce held
  behind the backward all-to-all (``perf.allreduce_after_output_dist``), released by it or at the end of the
  backward.

    .venv/bin/python -m pytest -q tests/test_output_dist.py
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Dict, List

import torch

from conftest import run_gloo

# (batch size per rank, dim sum per rank, contiguous upstream gradient)
CASES = [([4, 4], [12, 20], True), ([3, 5], [0, 16], False), ([6, 6], [8, 8], False)]


def _a2a_worker(rank: int, world: int) -> List[Dict[str, Any]]:
    import torch.distributed as dist
    from torchrec.distributed import comm_ops
    from torchrec.distributed.dist_data import PooledEmbeddingsAllToAll

    from dlrm.output_dist import use_lean_output_dist

    out = []
    for i, (batch, dims, contiguous) in enumerate(CASES):
        comm_ops.set_gradient_division(i != 1)  # TorchRec's default (divide by the world size), and off
        g = torch.Generator().manual_seed(100 * i + rank)
        local = torch.randn(sum(batch), dims[rank], generator=g, dtype=torch.float64)
        up = torch.randn(sum(dims), batch[rank], generator=g, dtype=torch.float64)
        up = up.t().contiguous() if contiguous else up.t()  # [B_local, D_global]; the second a strided view
        res = {}
        for name in ("torchrec", "lean"):
            a2a = PooledEmbeddingsAllToAll(dist.group.WORLD, dims, callbacks=[lambda t: t * 3.0] if i == 2 else None)
            switched = use_lean_output_dist(a2a) if name == "lean" else 0
            x = local.clone().requires_grad_(True)
            y = a2a(x, batch if i == 1 else None).wait()
            y.backward(up)
            res[name] = {
                "y": y.detach().clone(),
                "grad": x.grad.clone(),
                "switched": switched,
                "lean_fn": _grad_fn_names(y),
            }
        out.append(res)
    comm_ops.set_gradient_division(True)
    return out


def _grad_fn_names(t: torch.Tensor) -> List[str]:
    names, todo, seen = [], [t.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        names.append(type(fn).__name__)
        todo.extend(f for f, _ in fn.next_functions)
    return names


def test_lean_pooled_all_to_all_equals_torchrec_bit_for_bit() -> None:
    ranks = run_gloo(2, _a2a_worker)
    for rank, cases in enumerate(ranks):
        for (batch, dims, _), res in zip(CASES, cases):
            ref, lean = res["torchrec"], res["lean"]
            assert ref["y"].shape == (batch[rank], sum(dims)), ref["y"].shape
            assert torch.equal(ref["y"], lean["y"]), (rank, batch, dims)
            assert torch.equal(ref["grad"], lean["grad"]), (rank, batch, dims)
            assert ref["grad"].abs().sum() > 0 or dims[rank] == 0
            assert lean["switched"] == 1
            assert any("_LeanPooledWait" in n for n in lean["lean_fn"]), lean["lean_fn"]
            assert not any("_LeanPooled" in n for n in ref["lean_fn"]), ref["lean_fn"]


TINY = [
    "model.row_cap=40",
    "model.embedding_dim=8",
    "model.dense_arch_layer_sizes=[16,8]",
    "model.over_arch_layer_sizes=[16,1]",
    "model.dcn_num_layers=1",
    "model.dcn_low_rank_dim=4",
    f"model.multi_hot_sizes=[{','.join(['2'] * 26)}]",
    "optimizer.lr=0.05",
    "data.batch_size=8",
    "sharding=table_wise",
    "+sharding.constraints.t_cat_3.sharding_types=[column_wise]",
    "sharding.min_partition=4",
]


def pooled_all_to_alls(model: torch.nn.Module) -> List[Any]:
    """Every ``PooledEmbeddingsAllToAll`` of ``model``'s sharded modules (their output dists are kept in a plain
    list, not as submodules)."""
    from torchrec.distributed.dist_data import PooledEmbeddingsAllToAll
    from torchrec.distributed.types import ShardedModule

    from dlrm.torchrec_compat import output_dists

    found = {
        id(m): m
        for module in model.modules()
        if isinstance(module, ShardedModule)
        for od in output_dists(module)
        for m in od.modules()
        if type(m) is PooledEmbeddingsAllToAll
    }
    return list(found.values())


def _train_worker(rank: int, world: int) -> Dict[str, Any]:
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from dlrm.config import compose, to_config
    from dlrm.model import FEATURE_NAMES
    from dlrm.process_group import init_distributed
    from dlrm.trainer import build_training

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    res: Dict[str, Any] = {}
    for plan, lean in [(p, lean) for p in ("mixed", "table_wise") for lean in (False, True)] + [
        ("held", True),
        ("held_to_the_end", True),
        ("compiled", True),
        ("compiled_held", True),
    ]:
        over = TINY if plan == "mixed" else [o for o in TINY if "t_cat_3" not in o]
        over = over + (["perf.allreduce_after_output_dist=true"] if "held" in plan else [])
        over = over + (["perf.compile=true", "perf.compile_ddp_split=false"] if "compiled" in plan else [])
        cfg = to_config(compose(over + [f"perf.lean_output_dist={str(lean).lower()}"]))
        rows = cfg.model.table_rows
        g = torch.Generator().manual_seed(7 + rank)
        batches = [
            Batch(
                dense_features=torch.randn(8, 13, generator=g),
                sparse_features=KeyedJaggedTensor.from_lengths_sync(
                    FEATURE_NAMES,
                    torch.cat([torch.randint(0, r, (16,), generator=g) for r in rows]),
                    torch.full((26 * 8,), 2, dtype=torch.int32),
                ),
                labels=torch.randint(0, 2, (8,), generator=g).float(),
            )
            for _ in range(4)
        ]
        info = init_distributed("cpu")
        torch.manual_seed(0)
        built = build_training(cfg, info, 8)
        it = iter(batches)
        losses = []
        never = torch.nn.Module()  # an all-to-all reported due whose backward never comes
        while True:
            if plan == "held_to_the_end":
                built.perf.held_allreduce.output_dist_forward(never)
            try:
                losses.append(built.pipeline.progress(it)[0].detach().clone())
            except StopIteration:
                break
        a2as = pooled_all_to_alls(built.model)  # built by TorchRec on the first forward
        with torch.no_grad():  # an evaluation forward through the same path, as Trainer.evaluate does
            model = built.pipeline.detach() if hasattr(built.pipeline, "detach") else built.model
            model.eval()
            _, (_, logits, _) = model(batches[0])
            model.train()
        res[f"{plan}/" + ("lean" if lean else "torchrec")] = {
            "losses": losses,
            "eval_logits": logits.clone(),
            "held": None
            if built.perf.held_allreduce is None
            else (
                built.perf.held_allreduce.forwards,
                built.perf.held_allreduce.held_passes,
                built.perf.held_allreduce.released_at_end,
            ),
            "rank_blocks": sum(bool(getattr(m, "_dlrm_rank_blocks", False)) for m in a2as),
            "tables": {
                k: [s.tensor.clone() for s in v.local_shards()] if hasattr(v, "local_shards") else [v.clone()]
                for k, v in built.model.state_dict().items()
                if "embedding_bags" in k
            },
            "a2as": len(a2as),
            "switched": sum("forward" in vars(m) for m in a2as),
            "set_up": built.perf.lean_output_dists,
            "plan": sorted({s["sharding_type"] for s in built.model.plan_info.shards}),
        }
    # row_wise sends pooled embeddings by reduce-scatter: of its output dists only t_cat_3's (column_wise, by TINY's
    # constraint) is set up
    built = build_training(to_config(compose(TINY + ["sharding=row_wise", "perf.lean_output_dist=true"])), info, 8)
    res["row_wise_set_up"] = built.perf.lean_output_dists
    return res


def test_trainer_trains_the_same_with_the_lean_output_dist() -> None:
    """Mixed plan (table_wise and column_wise: two output dists, the lean regrouping pass) and table_wise only
    (one output dist: rank blocks gathered by the sparse arch): same losses, evaluation logits and tables as
    TorchRec's output dist, bit for bit."""
    for rank, res in enumerate(run_gloo(2, _train_worker)):
        for plan, want_plan, n_a2a, blocks in (
            ("mixed", ["column_wise", "table_wise"], 2, 0),
            ("table_wise", ["table_wise"], 1, 1),
        ):
            ref, lean = res[f"{plan}/torchrec"], res[f"{plan}/lean"]
            assert ref["plan"] == lean["plan"] == want_plan, ref["plan"]
            assert ref["switched"] == 0 and lean["switched"] == lean["a2as"] == ref["a2as"] == n_a2a, (ref, lean)
            assert (ref["set_up"], lean["set_up"]) == (0, n_a2a)
            assert (ref["rank_blocks"], lean["rank_blocks"]) == (0, blocks), plan
            assert len(ref["losses"]) == 4
            for a, b in zip(ref["losses"], lean["losses"]):
                assert torch.equal(a, b), (rank, plan, ref["losses"], lean["losses"])
            assert ref["losses"][0].item() != ref["losses"][-1].item()  # it trained
            assert torch.equal(ref["eval_logits"], lean["eval_logits"]), plan
            assert ref["tables"].keys() == lean["tables"].keys()
            assert sum(len(v) for v in ref["tables"].values()) > 0
            for k in ref["tables"]:
                assert len(ref["tables"][k]) == len(lean["tables"][k]), k
                assert all(torch.equal(a, b) for a, b in zip(ref["tables"][k], lean["tables"][k])), (plan, k)
        assert res["row_wise_set_up"] == 1
        # perf.allreduce_after_output_dist: DDP's all-reduce held until the backward all-to-all is issued (or, when
        # one reported due never comes, until the end of the backward); never in DDP's first static-graph
        # iteration: held in steps 2-4, eager and compiled, and released by the all-to-all. The same training,
        # bit for bit
        eager, compiled = res["table_wise/torchrec"], res["compiled/lean"]
        assert (eager["held"], res["table_wise/lean"]["held"], compiled["held"]) == (None, None, None)
        # (forwards reported, backward passes that held and were released by the all-to-all, released at the end;
        # held_to_the_end also reports its stand-in once per loop turn)
        for name, released, ref in (
            ("held", (4, 3, 0), eager),
            ("held_to_the_end", (4 + 5, 0, 3), eager),
            ("compiled_held", (4, 3, 0), compiled),
        ):
            held = res[f"{name}/lean"]
            assert held["held"] == released, (name, held["held"])
            assert all(torch.equal(a, b) for a, b in zip(ref["losses"], held["losses"])), (name, held["losses"])
            assert torch.equal(ref["eval_logits"], held["eval_logits"]), name
            for k in ref["tables"]:
                assert all(torch.equal(a, b) for a, b in zip(ref["tables"][k], held["tables"][k])), (name, k)


def _held_run(rank: int, hold: bool) -> Dict[str, Any]:
    """DDP over a Linear, 3 steps, with or without :class:`dlrm.comms.AllReduceAfterOutputDist`; a stand-in for
    the output dist (``Late``) is created before the Linear in forward, so autograd runs it after the Linear's
    gradient accumulation and DDP's hook: the order seen on GPU, where the hook must hold the bucket."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dlrm.comms import AllReduceAfterOutputDist

    torch.manual_seed(0)
    ddp = DDP(torch.nn.Linear(4, 3), static_graph=True)
    held = AllReduceAfterOutputDist(dist.group.WORLD, static_graph=True) if hold else None
    if held is not None:
        ddp.register_comm_hook(None, held.hook)
    order: List[str] = []

    class Late(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, z: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            if held is not None:
                held.output_dist_forward(ctx)
            return z * 1.0

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            order.append(f"late, {len(held.pending) if held is not None else 0} held")
            if held is not None:
                held.output_dist_issued(ctx)
            return g

    g = torch.Generator().manual_seed(rank)
    grads = []
    for _ in range(3):
        z = torch.randn(5, 3, generator=g, requires_grad=True)
        zz = Late.apply(z)  # before the Linear: a lower sequence number, so it runs last in backward
        loss = (ddp(torch.randn(5, 4, generator=g)) * zz).sum()
        loss.backward()
        grads.append((ddp.module.weight.grad.clone(), z.grad.clone()))
        ddp.zero_grad()
    return {"grads": grads, "order": order, "held": None if held is None else (held.held_passes, held.released_at_end)}


def _held_worker(rank: int, world: int) -> Dict[str, Any]:
    torch.set_num_threads(1)
    return {"plain": _held_run(rank, hold=False), "held": _held_run(rank, hold=True)}


def test_held_all_reduce_waits_for_the_all_to_all() -> None:
    """``perf.allreduce_after_output_dist``'s hook: when DDP's hook runs before the output dist's backward (as on
    GPU), the bucket is held until that backward reports its all-to-all, then all-reduced: held in steps 2 and 3
    (DDP's first static-graph step runs the hooks after the whole backward; nothing is held there), never left
    to the end-of-backward fallback, and the gradients are those of DDP's own all-reduce, bit for bit."""
    for rank, res in enumerate(run_gloo(2, _held_worker)):
        assert res["held"]["held"] == (2, 0), res["held"]
        assert res["held"]["order"] == ["late, 0 held", "late, 1 held", "late, 1 held"], res["held"]["order"]
        for (wa, za), (wb, zb) in zip(res["plain"]["grads"], res["held"]["grads"]):
            assert torch.equal(wa, wb) and torch.equal(za, zb), rank
        assert not torch.equal(res["plain"]["grads"][0][0], res["plain"]["grads"][1][0])
