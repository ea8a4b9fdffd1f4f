"""``pipeline=graphed`` (dlrm/graphed.py): the same training as TorchRec's pipeline, bit for bit.

On CPU the pipeline runs its capture path eagerly (``capture=False``): warm-up steps, the held input dist and its
gather index, the dense Adagrad on the optimizer's state, the eager fallback for a partial batch, and the bag-size
check. On a GPU host (``pytest -m gpu``) the same comparison runs with the CUDA graph captured and replayed.

    .venv/bin/python -m pytest -q tests/test_graphed.py
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest
import torch

from conftest import run_gloo
from dlrm.config import ConfigError, compose, to_config

BATCH = 32
STEPS = 9  # 2 warm-up, the rehearsal, 5 captured or held-input-dist steps, then a partial batch


def _cfg(sharding: str, sparse_type: str, pipeline: str, device: str) -> Any:
    return to_config(
        compose(
            [
                "model=dlrm_v2_small",
                "model.row_cap=300",
                f"sharding={sharding}",
                f"optimizer.sparse_type={sparse_type}",
                f"pipeline={pipeline}",
                f"device={device}",
                f"data.batch_size={BATCH}",
            ]
        )
    )


def _batches(cfg: Any, device: torch.device) -> List[Any]:
    from bench.pipeline_ab import make_batches

    full = make_batches(cfg.model, BATCH, STEPS - 1, device, False, seed=7)
    return full + make_batches(cfg.model, BATCH // 2, 1, device, False, seed=8)


def _train(cfg: Any, graphed: bool, capture: bool) -> Tuple[List[float], Dict[str, torch.Tensor], Dict[str, Any]]:
    from dlrm.dist import init_distributed
    from dlrm.graphed import GraphedTrainPipeline
    from dlrm.trainer import build_training

    info = init_distributed(cfg.device)
    torch.manual_seed(0)
    built = build_training(cfg, info, BATCH)
    pipe = built.pipeline
    if graphed and not capture:  # CPU: the capture path, run eagerly
        pipe = GraphedTrainPipeline(built.model, built.optimizer, built.dense, info.device, capture=False)
    it = iter(_batches(cfg, info.device))
    losses = [float(pipe.progress(it)[0]) for _ in range(STEPS)]
    with pytest.raises(StopIteration):
        pipe.progress(it)
    state = {
        k: (v.local_tensor() if hasattr(v, "local_tensor") else v).detach().cpu().clone()
        for k, v in built.model.state_dict().items()
    }
    opt = {k: {n: _plain(t) for n, t in st.items()} for k, st in built.optimizer.state_dict()["state"].items()}
    return losses, state, opt


def _plain(v: Any) -> Any:
    if hasattr(v, "local_shards"):  # a ShardedTensor's repr shows its metadata, never its values
        return [s.tensor.detach().cpu().clone() for s in v.local_shards()]
    return v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v


def _compare(rank: int, world: int, device: str, capture: bool, cases: List[Tuple[str, str]]) -> List[str]:
    out = []
    for sharding, sparse_type in cases:
        ref = _train(_cfg(sharding, sparse_type, "sparse_dist", device), graphed=False, capture=False)
        got = _train(_cfg(sharding, sparse_type, "graphed" if capture else "base", device), True, capture)
        assert got[0] == ref[0], (sharding, sparse_type, got[0], ref[0])
        assert sorted(got[1]) == sorted(ref[1])
        diff = [k for k in ref[1] if not torch.equal(got[1][k], ref[1][k])]
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
    return _compare(rank, world, "cpu", False, [("table_wise", "adagrad"), ("row_wise", "rowwise_adagrad")]) + [
        _bag_sizes(rank, world)
    ]


def test_capture_path_trains_as_torchrec_pipeline_bit_for_bit_and_checks_bag_sizes_on_cpu() -> None:
    """One process for both: the comparison of two plans and optimizers, and a batch of other bag sizes (as many
    ids, two bags of the first table swapping sizes) that the pipeline reports instead of replaying it."""
    (msgs,) = run_gloo(1, _cpu_checks)
    assert len(msgs) == 3 and msgs[-1] == "ok", msgs


@pytest.mark.gpu
def test_cuda_graph_replays_train_as_torchrec_pipeline_bit_for_bit() -> None:
    (msgs,) = run_gloo(1, _compare, "cuda", True, [("table_wise", "adagrad"), ("table_wise", "rowwise_adagrad")])
    assert len(msgs) == 2, msgs


def _bag_sizes(rank: int, world: int) -> str:
    from dlrm.dist import init_distributed
    from dlrm.graphed import GraphedTrainPipeline
    from dlrm.model import BatchError
    from dlrm.trainer import build_training

    cfg = _cfg("table_wise", "adagrad", "base", "cpu")
    info = init_distributed("cpu")
    built = build_training(cfg, info, BATCH)
    pipe = GraphedTrainPipeline(built.model, built.optimizer, built.dense, info.device, capture=False)
    batches = _batches(cfg, info.device)[:5]
    # the last batch has as many ids, but its first two samples' bags of the first table swap sizes
    kjt = batches[-1].sparse_features
    lengths = kjt.lengths().clone()
    lengths[0], lengths[1] = lengths[0] + 1, lengths[1] - 1
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

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
        ([], 2, "cuda", "runs on one rank .* but this job has 2"),
        (["optimizer.warmup_steps=100"], 1, "cuda", "optimizer.warmup_steps=100 .* set both to 0"),
        (["offload=uvm"], 1, "cuda", "not built for offload=uvm"),
    ],
)
def test_what_a_replay_cannot_follow_is_refused(overrides: List[str], world: int, device: str, match: str) -> None:
    from dlrm.graphed import check_graphed

    cfg = to_config(compose(["pipeline=graphed"] + overrides))
    with pytest.raises(ConfigError, match=match):
        check_graphed(cfg, world, torch.device(device))
    check_graphed(to_config(compose(["pipeline=graphed"])), 1, torch.device("cuda"))  # the default config passes


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
    from dlrm.graphed import EAGER_DIVISION, adagrad_one_pass

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
