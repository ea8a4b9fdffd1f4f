"""Every private TorchRec and torch name the trainer uses, in one place, behind a version check.

TorchRec has no public seam for three things the trainer does: putting the input dist's KJT all-to-alls on a
process group of their own (``pipeline.input_dist_group=dedicated``, :mod:`dlrm.comms`), sending the pooled
embeddings without TorchRec's staging copy (``perf.lean_output_dist``, :mod:`dlrm.output_dist`), and keeping the
DCN's residual stream in the autocast dtype (``perf.dcn_residual_dtype``, :mod:`dlrm.model`); and it needs two
facts TorchRec keeps to itself for ``pipeline=graphed`` on several ranks to send row_wise and table_row_wise
tables' bags whole: each table's rows per rank and a host's ranks (:mod:`dlrm.static_input_dist`). torch has no public
name for a few more: the pinned-copy helpers of ``torch.distributed.checkpoint`` (:mod:`dlrm.checkpoint`), the
sharding-spec classes a loaded ``plan.json`` is rebuilt from (:mod:`dlrm.sharding`), dynamo's settings for a
compiled step under DDP and TorchRec's fx trace (:mod:`dlrm.perf`), the autograd engine's end-of-backward callback
(:mod:`dlrm.comms`), the logger of torch.fx's tracer (:mod:`dlrm.loggers` quiets its notice), and, for the
tests, the dispatch mode that sees every collective a step issues (what ``tests/test_traffic.py`` checks
:mod:`dlrm.traffic` against), DDP's record of its communication hook and dynamo's compile counters (what
``tests/test_perf.py`` checks ``perf.allreduce_dtype`` and ``perf.compile_ddp_split`` by). Every one of them is
reached through a function or constant of this module and listed in :data:`PRIVATE_NAMES`; no other module of the
project touches them.
``tests/test_torchrec_compat.py`` checks each one by behaviour (it exists and does what the trainer relies on), so
a TorchRec or torch upgrade that changes one fails there, naming it.

Importing this module checks the installed TorchRec against :data:`SUPPORTED_TORCHREC` (the versions these names
were verified on: 1.6.x with torch 2.11 on H200, 1.8.x with torch 2.13 and 1.9.x with torch 2.14 on CPU) and
refuses any other with one message naming them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torchrec
from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata  # noqa: F401 (re-export)
from torch.nn.parallel import DistributedDataParallel
from torchrec.distributed.dist_data import KJTAllToAll, PooledEmbeddingsAllToAll
from torchrec.distributed.sharding.grid_sharding import GridPooledEmbeddingDist
from torchrec.distributed.sharding.tw_sharding import TwPooledEmbeddingDist
from torchrec.distributed.sharding.twrw_sharding import TwRwPooledEmbeddingDist, TwRwSparseFeaturesDist
from torchrec.distributed.types import ShardedModule

from dlrm.errors import UnsupportedVersionError

SUPPORTED_TORCHREC = ("1.6", "1.8", "1.9")  # major.minor series the private names below were verified on

# name -> what the trainer relies on it for (the tests check each one by behaviour)
PRIVATE_NAMES: Dict[str, str] = {
    "ShardedModule._create_input_dist": "method that builds a sharded module's input dists on its first batch",
    "ShardedModule._input_dists": "list of the input dist modules built by _create_input_dist",
    "KJTAllToAll._pg": "process group of every collective of one input dist",
    "ShardedModule._output_dists": "list of a sharded module's output dists",
    "TwPooledEmbeddingDist._create_output_dist_module": "builds the table_wise / column_wise pooled all-to-all",
    "TwPooledEmbeddingDist._pg": "process group of that all-to-all",
    "TwRwPooledEmbeddingDist._create_output_dist_modules": "builds table_row_wise's cross-host all-to-all",
    "TwRwPooledEmbeddingDist._cross_pg": "process group of that cross-host all-to-all",
    "GridPooledEmbeddingDist._create_output_dist_modules": "builds grid_shard's cross-host all-to-all",
    "GridPooledEmbeddingDist._cross_pg": "process group of that cross-host all-to-all",
    "PooledEmbeddingsAllToAll._pg": "process group of the pooled all-to-all",
    "PooledEmbeddingsAllToAll._dim_sum_per_rank": "embedding dim sum per rank (the all-to-all's splits)",
    "PooledEmbeddingsAllToAll._codecs": "quantized-communication codecs (None: plain all-to-all)",
    "PooledEmbeddingsAllToAll._callbacks": "callbacks applied to the received pooled embeddings",
    "torch.fx._symbolic_trace.is_fx_symbolic_tracing": "true inside torch.fx symbolic tracing (TorchRec's pipeline)",
    "torch.fx._symbolic_trace.log": "the fx tracer's logger (its is_fx_tracing notice repeats on every start)",
    "torch.distributed._state_dict_utils._create_cpu_state_dict": "pinned host copies of a (sharded) state dict",
    "torch.distributed._state_dict_utils._copy_state_dict": "copy a state dict into those host copies",
    "torch.distributed._shard.sharding_spec.EnumerableShardingSpec": "the sharding spec of a loaded plan",
    "torch.distributed._shard.sharding_spec.ShardMetadata": "one shard of that spec",
    "torch._dynamo.config.error_on_nested_fx_trace": "let TorchRec's fx trace run the uncompiled dense step",
    "torch._dynamo.config.optimize_ddp": "dynamo's split of a compiled step at DDP's gradient buckets",
    "torch._dynamo.reset": "drop compiled code, so each build compiles under its own settings",
    "torch._dynamo.utils.counters": "dynamo's compile counters: frames captured, graphs AOTAutograd compiled",
    "DistributedDataParallel._get_ddp_logging_data": "DDP's record of its setup; comm_hook: the hook registered",
    "torch.autograd.Variable._execution_engine.queue_callback": "run a function at the end of the backward pass",
    "torch.cuda._sleep": "a kernel that spins for a number of GPU cycles (the bench's GPU probe)",
    "torch.distributed.checkpoint.filesystem._StorageInfo.relative_path": "the file a DCP write result went to",
    "torch.utils._python_dispatch.TorchDispatchMode": "sees every c10d collective, C++ callers (DDP) included",
    "c10d::_reduce_scatter_base_": "the op behind dist.reduce_scatter_tensor (args: output, input, group)",
    "c10d::_allgather_base_": "the op behind dist.all_gather_into_tensor (args: output, input, group)",
    "RwSparseFeaturesDist._feature_block_sizes_tensor": "rows per rank of each row_wise feature's table",
    "TwRwSparseFeaturesDist._feature_block_sizes_tensor": "rows per rank of each table_row_wise feature's table",
    "TwRwSparseFeaturesDist._local_size": "ranks of one host that a table_row_wise table's rows are split over",
}


def check_torchrec_version(version: Optional[str] = None) -> None:
    """Refuse a TorchRec outside :data:`SUPPORTED_TORCHREC`.

    Args:
        version: the version string to check (default: the installed ``torchrec.__version__``).

    Raises:
        UnsupportedVersionError: naming the installed and the supported versions.
    """
    v = version if version is not None else str(getattr(torchrec, "__version__", "unknown"))
    if ".".join(v.split("+")[0].split(".")[:2]) not in SUPPORTED_TORCHREC:
        series = [s + ".x" for s in SUPPORTED_TORCHREC]
        raise UnsupportedVersionError(
            f"torchrec {v} is installed, but this trainer relies on TorchRec internals verified on torchrec "
            f"{', '.join(series[:-1])} and {series[-1]} only (dlrm/torchrec_compat.py); install a verified stack: "
            "torch 2.14.1, fbgemm-gpu-cpu 1.9.0 and torchrec 1.9.2 (CPU, make venv STACK=cpu-1.9), torch 2.13.0, "
            "fbgemm-gpu-cpu 1.8.0 and torchrec 1.8.0 (CPU, make venv) or torch 2.11.0, fbgemm-gpu 1.6.0 and "
            "torchrec 1.6.1 (CUDA, make venv STACK=gpu)"
        )


check_torchrec_version()


class MissingInternalError(RuntimeError):
    """A private TorchRec / torch name this module relies on is not there (an upgrade changed it)."""


def _missing(name: str, where: str) -> MissingInternalError:
    return MissingInternalError(
        f"{where}: `{name}` is missing in this TorchRec / torch version "
        f"({PRIVATE_NAMES[name]}); dlrm/torchrec_compat.py needs updating"
    )


def _call_after(fn: Callable[..., Any], callback: Callable[[], None]) -> Callable[..., Any]:
    """``fn`` that calls ``callback()`` after each call, returning what ``fn`` returned."""

    def fn_then_callback(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        callback()
        return out

    return fn_then_callback


# ------------------------------------------------------------------------------------------------ input dist
def input_dists(module: ShardedModule) -> List[torch.nn.Module]:
    """The input dists a sharded module has built so far (empty before its first batch).

    Raises:
        MissingInternalError: the module keeps them elsewhere.
    """
    got = module.__dict__.get("_input_dists", getattr(module, "_input_dists", None))
    if not isinstance(got, list):
        raise _missing("ShardedModule._input_dists", type(module).__name__)
    return got


def after_input_dists_built(module: ShardedModule, callback: Callable[[], None]) -> None:
    """Call ``callback()`` each time ``module`` builds its input dists (TorchRec builds them lazily, on the first
    batch, from that batch's feature order), right after they are built and before their first collective. The
    hook is set on this instance only.

    Raises:
        MissingInternalError: the module has no ``_create_input_dist`` method.
    """
    create = getattr(module, "_create_input_dist", None)
    if not callable(create):
        raise _missing("ShardedModule._create_input_dist", type(module).__name__)
    # shadows the class method on this instance only
    module.__dict__["_create_input_dist"] = _call_after(create, callback)


def kjt_all_to_all_group(a2a: KJTAllToAll) -> dist.ProcessGroup:
    """The process group of every collective one input dist issues (splits, lengths, values, weights)."""
    pg = getattr(a2a, "_pg", None)
    if not isinstance(pg, dist.ProcessGroup):
        raise _missing("KJTAllToAll._pg", "KJTAllToAll")
    return pg


def row_block_sizes(input_dist: torch.nn.Module) -> List[int]:
    """Rows per block of each input feature's table in a row_wise input dist (``RwSparseFeaturesDist``) or a
    table_row_wise one (``TwRwSparseFeaturesDist``), in the order of its input features: the rank holding block
    ``b`` (row_wise: rank ``b``; table_row_wise: the ``b``-th rank of the table's host, :func:`host_size`) holds
    rows ``[b * size, (b + 1) * size)`` and receives the ids in that range, less ``b * size`` (TorchRec's
    bucketize). A table_row_wise input dist's input features are every host's, host by host.

    Raises:
        MissingInternalError: the input dist keeps them elsewhere.
    """
    sizes = getattr(input_dist, "_feature_block_sizes_tensor", None)
    if not isinstance(sizes, torch.Tensor):
        kind = "TwRw" if isinstance(input_dist, TwRwSparseFeaturesDist) else "Rw"
        raise _missing(f"{kind}SparseFeaturesDist._feature_block_sizes_tensor", type(input_dist).__name__)
    return [int(v) for v in sizes.tolist()]


def host_size(input_dist: TwRwSparseFeaturesDist) -> int:
    """The ranks per host of a table_row_wise input dist: a table's rows are split over the ranks ``[h * size,
    (h + 1) * size)`` of its host ``h``, in that order.

    Raises:
        MissingInternalError: the input dist keeps it elsewhere.
    """
    size = getattr(input_dist, "_local_size", None)
    if not isinstance(size, int):
        raise _missing("TwRwSparseFeaturesDist._local_size", type(input_dist).__name__)
    return size


def set_kjt_all_to_all_group(a2a: KJTAllToAll, group: dist.ProcessGroup) -> None:
    """Issue that input dist's collectives on ``group`` from its next batch on."""
    kjt_all_to_all_group(a2a)  # raises if TorchRec moved it
    a2a._pg = group


# ----------------------------------------------------------------------------------------------- output dist
# TorchRec's output dists that build a PooledEmbeddingsAllToAll on first use -> (their builder, the attribute
# holding that all-to-all's process group, the sharding they serve). row_wise's (a reduce-scatter) is not one.
_POOLED_DISTS: Dict[type, Tuple[str, str, str]] = {
    TwPooledEmbeddingDist: ("_create_output_dist_module", "_pg", "table_wise"),  # also column_wise
    TwRwPooledEmbeddingDist: ("_create_output_dist_modules", "_cross_pg", "table_row_wise"),  # across hosts
    GridPooledEmbeddingDist: ("_create_output_dist_modules", "_cross_pg", "grid_shard"),  # across hosts
}


def output_dists(module: ShardedModule) -> List[torch.nn.Module]:
    """A sharded module's output dists (TorchRec keeps them in a plain list: they are not submodules).

    Raises:
        MissingInternalError: the module has no ``_output_dists`` list.
    """
    got = getattr(module, "_output_dists", None)
    if not isinstance(got, list):
        raise _missing("ShardedModule._output_dists", type(module).__name__)
    return got


def pooled_output_dist_kind(od: torch.nn.Module) -> Optional[str]:
    """``"table_wise"`` (also column_wise), ``"table_row_wise"`` or ``"grid_shard"`` for the output dists that
    send pooled embeddings with a ``PooledEmbeddingsAllToAll``; None for others (row_wise's reduce-scatter)."""
    entry = _POOLED_DISTS.get(type(od))
    return entry[2] if entry is not None else None


def pooled_output_dist_group(od: torch.nn.Module) -> dist.ProcessGroup:
    """The process group of an output dist's pooled all-to-all (across hosts for table_row_wise / grid_shard)."""
    _, pg_attr, _ = _POOLED_DISTS[type(od)]
    pg = getattr(od, pg_attr, None)
    if not isinstance(pg, dist.ProcessGroup):
        raise _missing(f"{type(od).__name__}.{pg_attr}", type(od).__name__)
    return pg


def after_pooled_all_to_all_built(od: torch.nn.Module, callback: Callable[[], None]) -> None:
    """Call ``callback()`` right after the output dist builds its ``PooledEmbeddingsAllToAll`` (on its first
    forward); the hook is set on this instance only.

    Raises:
        MissingInternalError: the output dist has no such builder.
    """
    builder, _, _ = _POOLED_DISTS[type(od)]
    build = getattr(od, builder, None)
    if not callable(build):
        raise _missing(f"{type(od).__name__}.{builder}", type(od).__name__)
    setattr(od, builder, _call_after(build, callback))


class PooledAllToAllFields:
    """What the lean output dist reads off a ``PooledEmbeddingsAllToAll``: its process group, the embedding dim
    sum per rank (the all-to-all's splits), its quantized-communication codecs (None: plain) and the callbacks
    TorchRec applies to the received tensor."""

    __slots__ = ("pg", "dim_sum_per_rank", "codecs", "callbacks")

    def __init__(self, a2a: PooledEmbeddingsAllToAll) -> None:
        for field, name in (
            ("pg", "_pg"),
            ("dim_sum_per_rank", "_dim_sum_per_rank"),
            ("codecs", "_codecs"),
            ("callbacks", "_callbacks"),
        ):
            if not hasattr(a2a, name):
                raise _missing(f"PooledEmbeddingsAllToAll.{name}", "PooledEmbeddingsAllToAll")
            setattr(self, field, getattr(a2a, name))


# -------------------------------------------------------------------------------------------------- modules
def is_fx_tracing() -> bool:
    """True inside ``torch.fx`` symbolic tracing (TorchRec's pipelines trace the model once to find the sparse
    arch's inputs)."""
    fx = torch.fx._symbolic_trace
    return getattr(fx, "is_fx_symbolic_tracing", fx.is_fx_tracing)()


# the logger ``torch.fx._symbolic_trace`` logs through (its module name): TorchRec's calls of ``is_fx_tracing`` make
# it warn that the flag also covers torch.export, on every start
FX_TRACE_LOGGER = "torch.fx._symbolic_trace"


# --------------------------------------------------------------------------------------------- checkpoints
def create_cpu_state_dict(state_dict: Dict[str, Any], pin_memory: bool = True) -> Dict[str, Any]:
    """Host buffers shaped like ``state_dict`` (``ShardedTensor`` included), pinned by default."""
    from torch.distributed._state_dict_utils import _create_cpu_state_dict

    return _create_cpu_state_dict(state_dict, pin_memory=pin_memory)


def copy_state_dict(state_dict: Dict[str, Any], into: Dict[str, Any], non_blocking: bool = True) -> Dict[str, Any]:
    """Copy ``state_dict``'s tensors into the buffers of :func:`create_cpu_state_dict`; returns ``into``."""
    from torch.distributed._state_dict_utils import _copy_state_dict

    return _copy_state_dict(state_dict, into, non_blocking=non_blocking)


def written_files(results: List[Any]) -> List[str]:
    """The files (relative to the checkpoint directory) that DCP's ``FileSystemWriter.write_data`` wrote, from its
    ``WriteResult`` list."""
    out = []
    for r in results:
        rel = getattr(getattr(r, "storage_data", None), "relative_path", None)
        if not isinstance(rel, str):
            raise _missing("torch.distributed.checkpoint.filesystem._StorageInfo.relative_path", "WriteResult")
        out.append(rel)
    return out


# ------------------------------------------------------------------------------------------------ compile
def set_dynamo_for_compiled_step(split_at_ddp_buckets: bool) -> None:
    """Process-wide dynamo settings for the compiled dense step: TorchRec's fx trace of the model runs the
    uncompiled code instead of failing (``error_on_nested_fx_trace``, the torch.compile documentation's setting
    for this case), and under DDP the graph is split at the gradient buckets or not (``optimize_ddp``). Then
    dynamo's caches are reset (compiled code is cached per code object, so a second build in one process would
    otherwise run the first build's graphs, compiled under the first build's settings)."""
    import torch._dynamo

    torch._dynamo.config.error_on_nested_fx_trace = False
    torch._dynamo.config.optimize_ddp = split_at_ddp_buckets
    torch._dynamo.reset()


def dynamo_optimize_ddp() -> Union[bool, str]:
    """dynamo's ``optimize_ddp`` setting, as :func:`set_dynamo_for_compiled_step` left it (True: a compiled step
    under DDP is split at the gradient buckets; False: one graph)."""
    import torch._dynamo

    return torch._dynamo.config.optimize_ddp


def dynamo_count(section: str, name: str) -> int:
    """One of dynamo's process-wide compile counters, 0 before it first counts: ``("stats", "unique_graphs")``
    counts the frames dynamo captured as graphs, ``("aot_autograd", "total")`` the graphs AOTAutograd compiled
    (a step split at DDP's gradient buckets: one per piece).

    Raises:
        MissingInternalError: dynamo keeps no such counters.
    """
    import torch._dynamo.utils

    counters = getattr(torch._dynamo.utils, "counters", None)
    if not isinstance(counters, dict):
        raise _missing("torch._dynamo.utils.counters", "torch._dynamo.utils")
    return int(counters[section][name])


# ------------------------------------------------------------------------------------------- data parallel
def ddp_comm_hook_name(ddp: DistributedDataParallel) -> Optional[str]:
    """The communication hook DDP records as registered on ``ddp``: the hook function's qualified name (e.g.
    ``"fp16_compress_hook"``, what TorchRec registers for ``allreduce_comm_precision="fp16"``); None without one.

    Raises:
        MissingInternalError: DDP has no ``_get_ddp_logging_data``.
    """
    get = getattr(ddp, "_get_ddp_logging_data", None)
    if not callable(get):
        raise _missing("DistributedDataParallel._get_ddp_logging_data", type(ddp).__name__)
    return get().get("comm_hook")


# -------------------------------------------------------------------------------------------------- autograd
def queue_end_of_backward_callback(fn: Callable[[], None]) -> None:
    """Run ``fn`` once the current backward pass has finished (called from inside that backward)."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def gpu_spin(cycles: int) -> None:
    """Queue a kernel on the current CUDA stream that spins for ``cycles`` GPU clock cycles."""
    torch.cuda._sleep(int(cycles))


# ------------------------------------------------------------------------------------------------ collectives
@dataclasses.dataclass(frozen=True)
class CollectiveCall:
    """One c10d collective as issued: ``op`` (``all_to_all``, ``reduce_scatter``, ``all_gather``, ``all_reduce``,
    else the c10d op's name), the size of its process group, the dtype name, and the bytes of the tensor(s) the
    rank passes in and gets back (an all-reduce: the same tensor; another op: every tensor argument, sent)."""

    op: str
    group_size: int
    dtype: str
    send_bytes: int
    recv_bytes: int


# c10d op -> (name, the argument index of the tensor received, of the tensor sent); all-reduce works in place
_C10D_OPS = {
    "c10d::alltoall_base_": ("all_to_all", 0, 1),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", 0, 1),
    "c10d::_allgather_base_": ("all_gather", 0, 1),
    "c10d::allreduce_": ("all_reduce", 0, 0),
}


def _nbytes(x: Any) -> int:
    ts = x if isinstance(x, (list, tuple)) else [x]
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


@contextlib.contextmanager
def record_collectives() -> Iterator[List[CollectiveCall]]:
    """Record every c10d collective this thread issues inside the block (the list fills as they are issued),
    through torch's dispatcher: ``torch.distributed`` calls, TorchRec's and the C++ ones DDP's reducer makes. For
    eager code; nothing changes in what runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: List[CollectiveCall] = []

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            if func.namespace == "c10d":
                calls.append(_collective_call(func.name(), args))
            return func(*args, **(kwargs or {}))

    with _Recorder():
        yield calls


def _collective_call(name: str, args: Tuple[Any, ...]) -> CollectiveCall:
    group = 0
    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                group = dist.ProcessGroup.unbox(a).size()
                break
            except (RuntimeError, TypeError):  # another script object (a ReduceOp)
                continue
    tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a]) if isinstance(t, torch.Tensor)]
    dtype = str(tensors[0].dtype).replace("torch.", "") if tensors else ""
    if name in _C10D_OPS:
        op, recv, send = _C10D_OPS[name]
        return CollectiveCall(op, group, dtype, _nbytes(args[send]), _nbytes(args[recv]))
    return CollectiveCall(name, group, dtype, _nbytes(tensors), 0)
