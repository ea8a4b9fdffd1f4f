"""Dedicated process groups: one for the KJT input dist (``pipeline.input_dist_group=dedicated``), one for the DDP
all-reduce of the dense gradients (``perf.allreduce_group=dedicated``).

Why: in a pipelined step the next batch's input dist (the all-to-alls that send each rank the ids of the tables
it owns: splits, lengths, values, weights) is issued on the data-dist stream while this step's output-dist
all-to-all, backward all-to-all and DDP all-reduce run. With NCCL, collectives of one communicator execute in
issue order on that communicator's stream, so the next batch's keys wait behind this step's embeddings. Putting
every input-dist all-to-all on a second process group (same ranks, same backend, hence its own NCCL
communicator and stream) lets them proceed independently. Output dist, backward and DDP stay on the default
group.

Design (which hook, and why):

* TorchRec has no public seam for this. A sharded module's ``EmbeddingSharding`` objects take their process
  group from the ``ShardingEnv``, and the same group serves ``create_input_dist()`` and
  ``create_output_dist()``; a sharder or a custom env can therefore only move *both*. The pipelines take no
  process-group argument either.
* What every input dist of every sharding type has in common (table_wise / column_wise:
  ``TwSparseFeaturesDist``, row_wise: ``RwSparseFeaturesDist``, table_row_wise: ``TwRwSparseFeaturesDist``) is a
  ``torchrec.distributed.dist_data.KJTAllToAll`` child module that issues all of that input dist's
  collectives on ``KJTAllToAll._pg`` (the splits all-to-all, also when the pipeline fuses the splits of several
  modules, which groups them by that ``pg``, and the tensor all-to-alls). Output dists use other classes.
* Input dists are built lazily, on a sharded module's first ``input_dist()`` call (the feature order comes from
  the first KJT), so they cannot simply be patched after DMP. :func:`use_group_for_input_dist` therefore wraps,
  on each sharded module *instance*, ``_create_input_dist`` so that right after TorchRec builds the input dists
  (and before their first collective) every ``KJTAllToAll`` in ``_input_dists`` gets the dedicated group.

The private names this relies on, all present in torchrec 1.3 through 1.8 (checked against the sources):
``ShardedModule._create_input_dist`` (method), ``ShardedModule._input_dists`` (list of modules), and
``KJTAllToAll._pg``. They live only in this module; ``tests/test_pipeline.py::test_torchrec_private_hooks_exist``
fails loudly, naming the attribute, when a TorchRec upgrade renames one, and the multi-process test counts the
collectives issued per group.

Usage (what :func:`dlrm.pipeline.build_pipeline` does)::

    model = DistributedModelParallel(...)
    use_group_for_input_dist(model, input_dist_group())

The DDP all-reduce (``perf.allreduce_group=dedicated``, :class:`DedicatedGroupDataParallelWrapper`): the compiled
dense step reaches autograd as a few pieces (dynamo's DDPOptimizer splits it at DDP's gradient buckets,
``perf.compile_ddp_split``; one piece without it), and each piece hands its dense gradients to DDP when its
backward ends, so DDP issues bucket all-reduces *before* the backward all-to-all of the pooled embeddings, which
needs the input gradient of the first piece. On one communicator that all-to-all, and the TBE backward behind it,
wait for those all-reduces. On a group of its own the all-reduce runs beside the all-to-all and the TBE backward.
TorchRec's ``DefaultDataParallelWrapper`` takes the group from the ``ShardingEnv`` (the same group the sharded
modules use), so the wrapper hands it a copy of the env that names the dedicated group; nothing else changes (the
private method it overrides, ``DefaultDataParallelWrapper._ddp_wrap``, is in ``PRIVATE_NAMES`` and checked by the
tests).
Measured with ``perf=fast`` on 2x H200 it is not faster: the all-reduce's NCCL kernels then take SMs from the work
beside them (docs/benchmarks.md). :class:`AllReduceAfterOutputDist` (``perf.allreduce_after_output_dist``, in
``perf=fast``) keeps the shared communicator and issues the all-reduce behind the all-to-all instead.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any, Dict, List, Optional, Set, Tuple

import torch
import torch.distributed as dist
from torchrec.distributed.dist_data import KJTAllToAll
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper
from torchrec.distributed.types import ShardedModule, ShardingEnv

# (purpose, NCCL max CTAs) -> (group, the default group it was made under)
_GROUPS: Dict[Tuple[str, Optional[int]], Tuple[dist.ProcessGroup, dist.ProcessGroup]] = {}
_HOOK_ATTR = "_dlrm_input_dist_group"
# the private TorchRec names this module relies on (see the module docstring)
PRIVATE_NAMES = (
    "ShardedModule._create_input_dist",
    "ShardedModule._input_dists",
    "KJTAllToAll._pg",
    "DefaultDataParallelWrapper._ddp_wrap",
)


def _dedicated_group(purpose: str, max_ctas: Optional[int] = None) -> dist.ProcessGroup:
    """One extra group per ``purpose`` (and NCCL thread-block cap): all ranks of the default group, its backend;
    created on the first call (collective: every rank must call it, at the same point) and reused afterwards.

    Raises:
        RuntimeError: no default process group; ``max_ctas`` with a backend other than NCCL.
    """
    if not dist.is_initialized():
        raise RuntimeError(f"a dedicated {purpose} process group needs an initialised default process group")
    world = dist.group.WORLD
    key = (purpose, max_ctas)
    have = _GROUPS.get(key)
    if have is None or have[1] is not world:  # a new default group (tests re-initialise) needs a new one
        backend = dist.get_backend()
        options = None
        if max_ctas is not None:
            if backend != "nccl":
                raise RuntimeError(f"a cap on NCCL thread blocks needs the nccl backend, not {backend}")
            options = dist.ProcessGroupNCCL.Options()
            options.config.max_ctas = max_ctas
        _GROUPS[key] = (dist.new_group(backend=backend, pg_options=options), world)
    return _GROUPS[key][0]


def input_dist_group(max_ctas: Optional[int] = None) -> dist.ProcessGroup:
    """The dedicated input-dist group (``pipeline.input_dist_group=dedicated``): all ranks of the default group,
    its backend; created on the first call (collective: every rank must call it, at the same point) and reused.
    ``max_ctas`` (``pipeline.input_dist_max_ctas``): the most thread blocks its NCCL kernels may use (NCCL
    ``maxCTAs``), None for NCCL's choice.

    Raises:
        RuntimeError: the default process group is not initialised; ``max_ctas`` off NCCL.
    """
    return _dedicated_group("input_dist", max_ctas)


def allreduce_group(max_ctas: Optional[int] = None) -> dist.ProcessGroup:
    """The dedicated group of the DDP all-reduce (``perf.allreduce_group=dedicated``); as :func:`input_dist_group`,
    a group of its own (so its own NCCL communicator and stream). ``max_ctas`` (``perf.allreduce_max_ctas``):
    the most thread blocks its NCCL kernels may use (NCCL ``maxCTAs``), None for NCCL's choice.

    Raises:
        RuntimeError: the default process group is not initialised; ``max_ctas`` off NCCL.
    """
    return _dedicated_group("allreduce", max_ctas)


class DedicatedGroupDataParallelWrapper(DefaultDataParallelWrapper):
    """TorchRec's ``DefaultDataParallelWrapper`` (DDP over every unsharded parameter, optional compress hook) with
    the all-reduce on ``group`` instead of the sharding env's group (``perf.allreduce_group=dedicated``; why: the
    module docstring).

    Args:
        group: a process group over the same ranks as the sharding env's (:func:`allreduce_group`).
        allreduce_comm_precision: as TorchRec's (``None``, ``"fp16"``, ``"bf16"``).
        bucket_cap_mb: DDP's gradient bucket size in MiB, as TorchRec's.
    """

    def __init__(self, group: dist.ProcessGroup, allreduce_comm_precision: Any = None, bucket_cap_mb: int = 25) -> None:
        super().__init__(bucket_cap_mb=bucket_cap_mb, allreduce_comm_precision=allreduce_comm_precision)
        self.group = group

    def _ddp_wrap(self, dmp: Any, env: ShardingEnv, device: torch.device, ddp_ignore_param_names: Set[str]) -> None:
        if dist.get_process_group_ranks(self.group) != dist.get_process_group_ranks(env.process_group):
            raise NotImplementedError(
                "perf.allreduce_group=dedicated supports DDP over all ranks of the sharding "
                "env only (no 2D parallel); use perf.allreduce_group=shared"
            )
        own = copy.copy(env)
        own.process_group = self.group
        super()._ddp_wrap(dmp, own, device, ddp_ignore_param_names)


def _check_private_api(name: str, module: torch.nn.Module) -> None:
    if not callable(getattr(module, "_create_input_dist", None)) or not isinstance(
        getattr(module, "_input_dists", None), list
    ):
        raise RuntimeError(
            f"pipeline.input_dist_group=dedicated: sharded module `{name}` ({type(module).__name__}) has no "
            "`_create_input_dist` method or `_input_dists` list; this TorchRec version builds input dists "
            "differently and dlrm/comms.py must be adapted (or use pipeline.input_dist_group=shared)"
        )


def _retarget(name: str, module: torch.nn.Module, group: dist.ProcessGroup) -> int:
    want = dist.get_process_group_ranks(group)
    n = 0
    for input_dist in module._input_dists:
        for sub in input_dist.modules():
            if not isinstance(sub, KJTAllToAll):
                continue
            pg = getattr(sub, "_pg", None)
            if not isinstance(pg, dist.ProcessGroup):
                raise RuntimeError(
                    f"KJTAllToAll in `{name}` has no `_pg` process group; this TorchRec version "
                    "changed KJTAllToAll and dlrm/comms.py must be adapted"
                )
            if pg is group:
                n += 1
                continue
            ranks = dist.get_process_group_ranks(pg)  # the default group's ranks, or a twin's
            if ranks != want:
                raise NotImplementedError(
                    f"the input dist of `{name}` runs on a sub-group of ranks {ranks} (2D parallel or a "
                    "hierarchical sharding); pipeline.input_dist_group=dedicated supports only input dists over "
                    "all ranks: use pipeline.input_dist_group=shared"
                )
            sub._pg = group
            n += 1
    return n


def use_group_for_input_dist(model: torch.nn.Module, group: dist.ProcessGroup, replace: bool = False) -> int:
    """Make every input-dist all-to-all of every sharded module in ``model`` run on ``group``.

    Input dists that already exist are retargeted now; the ones TorchRec builds on the first batch are
    retargeted as they are built. Idempotent for the same group.

    Args:
        model: the DMP-wrapped model (or any module tree holding TorchRec sharded modules).
        group: a process group over the same ranks, in the same order, as the sharding env's group
            (``dist.group.WORLD`` puts the input dist back on the default group).
        replace: allow switching a model that was already hooked to another group (A/B benchmarks do this
            between repeats, with no batch in flight).

    Returns:
        The number of sharded modules hooked.

    Raises:
        RuntimeError: a sharded module lacks the private TorchRec hooks this relies on (TorchRec changed), or
            was already hooked with another group and ``replace`` is false.
        NotImplementedError: an input dist runs on a sub-group (2D parallel).
    """
    hooked = 0
    for name, module in model.named_modules():
        if not isinstance(module, ShardedModule):
            continue
        _check_private_api(name, module)
        prev = module.__dict__.get(_HOOK_ATTR)
        if prev is not None and prev is not group and not replace:
            raise RuntimeError(f"sharded module `{name}` already sends its input dist on another group")
        if prev is None:
            create = module._create_input_dist

            def create_and_retarget(*args, _create=create, _name=name, _module=module, **kwargs):
                out = _create(*args, **kwargs)
                _retarget(_name, _module, _module.__dict__[_HOOK_ATTR])
                return out

            # an instance attribute shadows the class method for this module only
            module.__dict__["_create_input_dist"] = create_and_retarget
        module.__dict__[_HOOK_ATTR] = group
        _retarget(name, module, group)
        hooked += 1
    return hooked


def input_dist_all_to_alls(model: torch.nn.Module) -> List[KJTAllToAll]:
    """Every ``KJTAllToAll`` of the input dists built so far (empty before the first batch)."""
    out: List[KJTAllToAll] = []
    for module in model.modules():
        if isinstance(module, ShardedModule):
            for input_dist in getattr(module, "_input_dists", []):
                out.extend(m for m in input_dist.modules() if isinstance(m, KJTAllToAll))
    return out


class AllReduceAfterOutputDist:
    """DDP comm hook that issues each gradient bucket's all-reduce only once the backward all-to-alls of the
    pooled embeddings are issued (``perf.allreduce_after_output_dist``).

    Why: the compiled dense step hands DDP all its gradients when its backward ends, at the same moment as the
    gradient of the pooled embeddings. Autograd runs the parameters' gradient accumulation first, so DDP's
    all-reduce is issued first and, on the shared communicator, the backward all-to-all waits for it, and the TBE
    backward for both; on 2x H200 that was 0.26 ms of all-reduce per step ahead of the all-to-all (ninth
    session's trace, docs/benchmarks.md). Held until the all-to-alls are issued, the all-reduce runs behind them,
    beside the TBE backward, which needs only the all-to-all. (A group of its own, ``perf.allreduce_group``, runs
    it beside the all-to-all instead and was not faster.) Measured on 2x H200: 13.20-13.26 -> 13.05-13.08 ms per
    step with the rest of ``perf=fast``.

    How: the lean output dists (``dlrm/output_dist.py``) report each forward all-to-all whose backward is due
    (:meth:`output_dist_forward`, with its autograd node, held by weak reference: a graph dropped without a
    backward frees it) and each backward all-to-all they issue (:meth:`output_dist_issued`). The hook
    (:meth:`hook`) holds a bucket only while a reported backward all-to-all is still due, and issues it (PyTorch's
    default hook, ``default_hooks.allreduce_hook``: divide by the world size, then all-reduce) once none is;
    otherwise it issues at once. It never holds in DDP's first static-graph iteration, where DDP calls the hook
    only after the whole backward, from its own end-of-backward callback. As a last resort, an autograd engine
    callback queued by the first hook call of a backward (so before DDP's own finalizer, which waits for the
    futures) issues whatever is still held: same values, no overlap. The all-reduce is the same op on the same
    buckets: the gradients are the same bit for bit.

    Args:
        group: DDP's process group.
        static_graph: DDP's ``static_graph`` (TorchRec wraps with it). Its first backward runs the hooks only from
            DDP's own end-of-backward callback, after every backward all-to-all, and holding a bucket there would
            wait for DDP's finalizer, which waits for the bucket; so nothing is held in the first backward pass.
    """

    def __init__(self, group: dist.ProcessGroup, static_graph: bool = False) -> None:
        self.group, self.static_graph = group, static_graph
        self.pending: List[Tuple[Any, torch.futures.Future]] = []
        self.due: List[weakref.ref] = []  # autograd nodes of output dists whose backward all-to-all is due
        self.armed = False
        self.backward_passes = 0  # that reached this hook
        self.forwards = 0  # all-to-alls reported with a backward due
        self.held_passes = self.released_at_end = 0  # backward passes that held buckets, by what released them

    # no annotations: DDP compares them with the classes, and this module's are strings (PEP 563)
    def hook(self, state, bucket):  # type: ignore[no-untyped-def]  # (Any, dist.GradBucket) -> Future
        """The comm hook (``ddp.register_comm_hook(None, held.hook)``)."""
        if not self.armed:  # once per backward; runs before DDP's finalizer, queued after this hook returns
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self.armed = True
        if not self._due() or (self.static_graph and self.backward_passes == 0):
            return self._all_reduce(bucket)
        buf = bucket.buffer()
        fut: torch.futures.Future = torch.futures.Future(devices=[buf.device] if buf.is_cuda else None)
        self.pending.append((bucket, fut))
        return fut

    def output_dist_forward(self, node: Any) -> None:
        """A lean output dist sent pooled embeddings whose gradient comes back through ``node``'s backward."""
        self.forwards += 1
        self.due.append(weakref.ref(node))

    def output_dist_issued(self, node: Any) -> None:
        """``node``'s backward all-to-all was issued; when no other is due, the held buckets go."""
        self.due = [r for r in self.due if r() is not node]
        if self.pending and not self._due():  # _due drops the dead references
            self.held_passes += 1
            self._release()

    def _due(self) -> bool:
        self.due = [r for r in self.due if r() is not None]
        return bool(self.due)

    def _all_reduce(self, bucket: dist.GradBucket) -> torch.futures.Future:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        return default_hooks.allreduce_hook(self.group, bucket)

    def _release(self) -> None:
        pending, self.pending = self.pending, []
        for bucket, fut in pending:
            # the result is set from a callback of the all-reduce's (CUDA-aware) future, so DDP's wait on `fut`
            # waits for the all-reduce on the device too
            self._all_reduce(bucket).then(lambda done, fut=fut: fut.set_result(done.value()))

    def _end_of_backward(self) -> None:
        if self.pending:
            self.released_at_end += 1
            self._release()
        self.armed = False
        self.backward_passes += 1
