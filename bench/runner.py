"""The benchmarks' shared machinery: a model per :class:`Spec` (the trainer's stack or stock TorchRec), its
synthetic batches, and a :class:`Runner` that times repeats of pipelined steps.

``bench/throughput.py``, ``bench/eval_throughput.py`` and ``bench/pipeline_ab.py`` build their models through
it, so every benchmark compares the same stock TorchRec baseline (``stock_model``: TorchRec's ``DLRMTrain``,
DMP with default sharders and free planner choice, ``TrainPipelineSparseDist``, tables capped at
``STOCK_ROW_CAP`` rows, fp32, row-wise Adagrad). Timing: ``Runner.repeat`` runs untimed warm-up steps, a
barrier and a device synchronize, the timed steps (synchronize-based wall time, the slowest rank's), then drains
the batches still in flight untimed; ``run_specs`` alternates the models of a group repeat by repeat (ABBA).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from bench import ids as bench_ids
from bench.traces import drain, gpu_time_by_category, sync
from dlrm.config import (
    MLPERF_MULTI_HOT_SIZES,
    MLPERF_NUM_EMBEDDINGS,
    ModelConfig,
    OffloadConfig,
    OptimizerConfig,
    PipelineConfig,
)
from dlrm.model import FEATURE_NAMES, build_model, table_configs, torchrec_dlrm
from dlrm.offload import offload_constraints
from dlrm.pipeline import build_pipeline
from dlrm.sharding import dense_params, fuse_embedding_optimizer

STOCK_ROW_CAP = 4_000_000  # the stock-TorchRec baseline's table cap (docs/performance.md)


@dataclass
class Spec:
    """One model to build and time."""

    name: str
    batch: int
    sharding: Optional[str] = None  # None: the planner chooses
    offload: str = "none"  # none (all fused in HBM) | uvm_caching
    load_factor: Optional[float] = None
    sparse_opt: str = "rowwise_adagrad"
    stock: bool = False
    input_dist_group: str = "shared"  # pipeline.input_dist_group


class CpuEBCSharder(EmbeddingBagCollectionSharder):
    """The stock sharder, allowing row_wise / table_row_wise on CPU too (smoke runs only)."""

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return ["table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise", "data_parallel"]


def model_config(args: argparse.Namespace, row_cap: Optional[int]) -> ModelConfig:
    if args.smoke:
        return ModelConfig(
            name="smoke",
            embedding_dim=16,
            row_cap=row_cap or 1000,
            multi_hot_sizes=[2] * 26,
            dense_arch_layer_sizes=[32, 16],
            over_arch_layer_sizes=[32, 1],
            dcn_num_layers=1,
            dcn_low_rank_dim=8,
        )
    return ModelConfig(
        name="dlrm_v2",
        embedding_dim=128,
        num_embeddings_per_feature=list(MLPERF_NUM_EMBEDDINGS),
        row_cap=row_cap,
        multi_hot_sizes=list(MLPERF_MULTI_HOT_SIZES),
        dense_arch_layer_sizes=[512, 256, 128],
        over_arch_layer_sizes=[1024, 1024, 512, 256, 1],
        dcn_num_layers=3,
        dcn_low_rank_dim=512,
    )


IDS_DTYPES = {"int64": torch.int64, "int32": torch.int32}


def make_batches(
    mc: ModelConfig,
    batch: int,
    n: int,
    device: torch.device,
    host: bool,
    seed: int,
    ids_dtype: torch.dtype = torch.int64,
    ids: str = "uniform",
) -> List[Batch]:
    """``n`` random batches, built once: ids below each table's rows, ``multi_hot_sizes`` ids per sample and
    feature (KJT values ``ids_dtype``, int64 by default, int32 as ``data=criteo_binary`` loads them; lengths
    int32; dense float32 [batch, 13]; labels float32 [batch]). The ids are the same values in either dtype.
    ``ids``: ``uniform`` (every id independent) or a skewed distribution of ``bench.ids`` (``criteo``: 1-hot ids
    of the power law fitted to Criteo 1TB, expanded by the MLPerf multi-hot)."""
    where = torch.device("cpu") if host else device
    g = torch.Generator(device=where).manual_seed(seed)
    g_ids = torch.Generator().manual_seed(seed)  # bench.ids draws on the host, where the expansion tables are
    rows, sizes = mc.table_rows, mc.multi_hot_sizes
    lengths = torch.tensor(sizes, dtype=torch.int32, device=where).repeat_interleave(batch)
    out = []
    for _ in range(n):
        if ids == "uniform":
            values = torch.cat(
                [torch.randint(0, r, (batch * m,), generator=g, device=where) for r, m in zip(rows, sizes)]
            ).to(ids_dtype)
        else:
            values = bench_ids.skewed_values(rows, sizes, ids, batch, g_ids).to(where, ids_dtype)
        b = Batch(
            dense_features=torch.randn(batch, 13, generator=g, device=where),
            sparse_features=KeyedJaggedTensor(keys=FEATURE_NAMES, values=values, lengths=lengths),
            labels=torch.randint(0, 2, (batch,), generator=g, device=where).float(),
        )
        out.append(b.pin_memory() if host and device.type == "cuda" else b)
    return out


def stock_model(mc: ModelConfig, device: torch.device) -> torch.nn.Module:
    """TorchRec's own ``DLRMTrain(DLRM_DCN)``, tables on the meta device for DMP, as the MLPerf reference builds it:
    none of the trainer's model code (its sparse arch, autocast wrapper or batch checks)."""
    from torchrec.models.dlrm import DLRMTrain as TorchRecDLRMTrain
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    ebc = EmbeddingBagCollection(tables=table_configs(mc), device=torch.device("meta"))
    return TorchRecDLRMTrain(torchrec_dlrm(mc, ebc, device))


class Runner:
    """A sharded model, its optimizer and pipeline, and a pool of batches; times repeats."""

    def __init__(self, spec: Spec, args: argparse.Namespace, device: torch.device, world: int) -> None:
        self.spec, self.args, self.device = spec, args, device
        cap = STOCK_ROW_CAP if spec.stock else (None if args.full_cardinality else args.row_cap)
        if args.smoke:
            cap = 1000
        mc = model_config(args, cap)
        self.mc = mc
        torch.manual_seed(0)
        model = stock_model(mc, device) if spec.stock else build_model(mc, dense_device=device)
        fuse_embedding_optimizer(model, OptimizerConfig(lr=args.lr, sparse_type=spec.sparse_opt))
        tables = table_configs(mc)
        constraints: Optional[Dict[str, ParameterConstraints]] = None
        if not spec.stock:
            kernels = ["fused"] if spec.offload == "none" else None
            constraints = {
                t.name: ParameterConstraints(
                    sharding_types=[spec.sharding] if spec.sharding else None, compute_kernels=kernels
                )
                for t in tables
            }
            if spec.offload != "none":
                constraints = offload_constraints(
                    OffloadConfig(
                        spec.offload, min_table_rows=args.offload_min_rows, cache_load_factor=spec.load_factor or 0.2
                    ),
                    tables,
                    base=constraints,
                )
        sharders = [CpuEBCSharder()] if device.type == "cpu" and not spec.stock else get_default_sharders()
        topo = dict(
            world_size=world,
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
            compute_device=device.type,
        )
        if device.type == "cuda":
            topo["hbm_cap"] = torch.cuda.get_device_properties(device).total_memory
        planner = EmbeddingShardingPlanner(
            topology=Topology(**topo),
            batch_size=spec.batch,
            constraints=constraints,
            storage_reservation=HeuristicalStorageReservation(percentage=0.05),
        )
        plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
        self.plan_kernels = sorted(
            {(ps.sharding_type, ps.compute_kernel) for mp in plan.plan.values() for ps in mp.values()}
        )  # type: ignore
        self.model = DistributedModelParallel(module=model, device=device, plan=plan, sharders=sharders)
        dense = KeyedOptimizerWrapper(dense_params(self.model), lambda p: torch.optim.Adagrad(p, lr=args.lr, eps=1e-8))
        self.opt = CombinedOptimizer([self.model.fused_optimizer, dense])
        if spec.stock:
            self.pipe = TrainPipelineSparseDist(self.model, self.opt, device)
        else:
            name = "prefetch" if spec.offload == "uvm_caching" else "sparse_dist"
            self.pipe = build_pipeline(self.model, self.opt, device, PipelineConfig(name, spec.input_dist_group))
        self.pool = make_batches(
            mc,
            spec.batch,
            args.pool,
            device,
            args.host_batches,
            seed=1000 + dist.get_rank(),
            ids_dtype=IDS_DTYPES[getattr(args, "ids_dtype", "int64")],
            ids=getattr(args, "ids", "uniform"),
        )

    def after_step(self, out: Any) -> None:
        """Per-step work timed with each pipeline step: none here (``bench/throughput.py``'s trainer runner adds
        the trainer's LR schedule and metric window)."""

    def repeat(self, steps: int, warmup: int) -> float:
        """ms/step of ``steps`` steady-state steps, the slowest rank's; the pipeline is drained afterwards."""
        # 3 extra batches keep the pipeline's look-ahead full through the last timed step
        it = itertools.islice(itertools.cycle(self.pool), warmup + steps + 3)
        for _ in range(warmup):
            self.after_step(self.pipe.progress(it))
        sync(self.device)
        dist.barrier()  # a rank still copying must not look like a slow collective
        sync(self.device)
        t0 = time.perf_counter()
        host = []
        for _ in range(steps):
            t = time.perf_counter()
            out = self.pipe.progress(it)
            self.after_step(out)
            host.append(time.perf_counter() - t)
        sync(self.device)
        ms = torch.tensor([(time.perf_counter() - t0) * 1000.0 / steps], dtype=torch.float64)
        # median host time to issue one step: while the GPU is behind, progress() returns as soon as the step is
        # queued, so this is the host's cost per step; near ms/step it means the loop is host-bound
        self.host_ms = 1000.0 * statistics.median(host)
        self.last_loss = float(out[0].detach().float().mean())
        drain(self.pipe, it)
        ms = ms.to(self.device) if self.device.type == "cuda" else ms
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)
        return float(ms.item())

    def close(self) -> None:
        del self.pipe, self.opt, self.model, self.pool
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def summarize(
    name: str, spec: Optional[Spec], variant: str, ms: List[float], world: int, batch: int, extra: Dict[str, Any]
) -> Dict[str, Any]:
    med = statistics.median(ms)
    return {
        "config": name,
        "variant": variant,
        "world": world,
        "batch_per_rank": batch,
        "ms_median": med,
        "ms_min": min(ms),
        "ms_max": max(ms),
        "spread_pct": 100.0 * (max(ms) - min(ms)) / med if med else float("nan"),
        "samples_per_s": batch * world * 1000.0 / med if (med and batch) else None,
        "ms_repeats": ms,
        "spec": asdict(spec) if spec else None,
        **extra,
    }


def abba(units: List[Any], r: int) -> List[Any]:
    """The order of repeat ``r`` when repeats alternate A B B A ...: forward on even repeats, reversed on odd
    ones, so that drift over the run hits every unit alike."""
    return list(units) if r % 2 == 0 else list(reversed(units))


def run_specs(
    groups: List[List[Spec]], args: argparse.Namespace, device: torch.device, world: int
) -> List[Dict[str, Any]]:
    """Time each group of specs with its models alive together, their repeats alternating (ABBA); a group of one
    is timed in a block. Groups run one after another, each freed before the next (big models do not all fit)."""
    rows: List[Dict[str, Any]] = []
    for group in groups:
        runners = [Runner(s, args, device, world) for s in group]
        times: List[List[float]] = [[] for _ in group]
        for r in range(args.repeats):
            for i in abba(list(range(len(group))), r):
                times[i].append(runners[i].repeat(args.steps, args.warmup))
        for s, run, ms in zip(group, runners, times):
            meta = {
                "plan": run.plan_kernels,
                "last_loss": run.last_loss,
                "order": "alternating" if len(group) > 1 else "blocked",
            }
            if args.profile_kernels and device.type == "cuda" and len(group) == 1:
                meta["gpu_ms_per_step"] = gpu_time_by_category(run)
            rows.append(summarize(s.name, s, s.input_dist_group, ms, world, s.batch, meta))
        for run in runners:
            run.close()
    return rows
