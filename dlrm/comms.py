"""Communication levers: the KJT input dist on a process group of its own (``pipeline.input_dist_group=
dedicated``), and DDP's all-reduce held behind the output dist's backward all-to-all
(``perf.allreduce_after_output_dist``, :class:`AllReduceAfterOutputDist`).

Dedicated input-dist group. In a pipelined step the next batch's input dist (the all-to-alls that send each rank
the ids of the tables it owns: splits, lengths, values, weights) is issued on the data-dist stream while this
step's output-dist all-to-all, backward all-to-all and DDP all-reduce run. With NCCL, collectives of one
communicator execute in issue order on that communicator's stream, so the next batch's ids wait behind this step's
embeddings. On a second process group (same ranks, same backend, hence its own NCCL communicator and stream) they
proceed independently; output dist, backward and DDP stay on the default group.

TorchRec has no public seam for this: a sharded module's ``EmbeddingSharding`` objects take their process group
from the ``ShardingEnv``, and the same group serves its input and its output dist; the pipelines take no process
group either. What every input dist of every sharding type has in common is a ``KJTAllToAll`` child that issues
all of its collectives on one process group, and TorchRec builds the input dists lazily, on a sharded module's
first batch. :func:`use_group_for_input_dist` therefore retargets those ``KJTAllToAll`` right after TorchRec builds
them, before their first collective, through :mod:`dlrm.torchrec_compat` (the private names live there).

Usage (what :func:`dlrm.pipeline.build_pipeline` does)::

    model = DistributedModelParallel(...)
    use_group_for_input_dist(model, input_dist_group())
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist
from torchrec.distributed.dist_data import KJTAllToAll
from torchrec.distributed.types import ShardedModule

from dlrm import torchrec_compat as compat

# the dedicated input-dist group, and the default group it was made under (tests re-initialise the default group)
_GROUP: Dict[str, Tuple[dist.ProcessGroup, Any]] = {}
_HOOK_ATTR = "_dlrm_input_dist_group"


def input_dist_group() -> dist.ProcessGroup:
    """The dedicated input-dist group (``pipeline.input_dist_group=dedicated``): all ranks of the default group,
    its backend; created on the first call (collective: every rank must call it, at the same point) and reused.

    Raises:
        RuntimeError: the default process group is not initialised.
    """
    if not dist.is_initialized():
        raise RuntimeError("a dedicated input-dist process group needs an initialised default process group")
    world = dist.group.WORLD
    have = _GROUP.get("input_dist")
    if have is None or have[1] is not world:
        _GROUP["input_dist"] = (dist.new_group(backend=dist.get_backend()), world)
    return _GROUP["input_dist"][0]


def _retarget(name: str, module: ShardedModule, group: dist.ProcessGroup) -> int:
    want = dist.get_process_group_ranks(group)
    n = 0
    for input_dist in compat.input_dists(module):
        for sub in input_dist.modules():
            if not isinstance(sub, KJTAllToAll):
                continue
            pg = compat.kjt_all_to_all_group(sub)
            if pg is not group:
                ranks = dist.get_process_group_ranks(pg)  # the default group's ranks
                if ranks != want:
                    raise NotImplementedError(
                        f"the input dist of `{name}` runs on a sub-group of ranks {ranks} (2D parallel or a "
                        "hierarchical sharding); pipeline.input_dist_group=dedicated supports only input dists "
                        "over all ranks: use pipeline.input_dist_group=shared"
                    )
                compat.set_kjt_all_to_all_group(sub, group)
            n += 1
    return n


def use_group_for_input_dist(model: torch.nn.Module, group: dist.ProcessGroup) -> int:
    """Make every input-dist all-to-all of every sharded module in ``model`` run on ``group``.

    Input dists that already exist are retargeted now; the ones TorchRec builds on the first batch are
    retargeted as they are built. Idempotent for the same group.

    Args:
        model: the DMP-wrapped model (or any module tree holding TorchRec sharded modules).
        group: a process group over the same ranks, in the same order, as the sharding env's group.

    Returns:
        The number of sharded modules hooked.

    Raises:
        RuntimeError: ``model`` holds no sharded module (nothing would change), or one was already hooked to
            another group.
        dlrm.torchrec_compat.MissingInternalError: TorchRec changed the internals this relies on.
        NotImplementedError: an input dist runs on a sub-group (2D parallel).
    """
    hooked = 0
    for name, module in model.named_modules():
        if not isinstance(module, ShardedModule):
            continue
        prev = module.__dict__.get(_HOOK_ATTR)
        if prev is not None and prev is not group:
            raise RuntimeError(f"sharded module `{name}` already sends its input dist on another group")
        if prev is None:
            compat.after_input_dists_built(module, lambda n=name, m=module: _retarget(n, m, m.__dict__[_HOOK_ATTR]))
        module.__dict__[_HOOK_ATTR] = group
        _retarget(name, module, group)
        hooked += 1
    if not hooked:
        raise RuntimeError(
            "pipeline.input_dist_group=dedicated: the model holds no TorchRec sharded module whose "
            "input dist could move; use pipeline.input_dist_group=shared"
        )
    return hooked


def has_dedicated_input_dist(module: ShardedModule) -> bool:
    """Whether :func:`use_group_for_input_dist` hooked ``module``'s input dist to a process group of its own."""
    return module.__dict__.get(_HOOK_ATTR) is not None


def input_dist_all_to_alls(model: torch.nn.Module) -> List[KJTAllToAll]:
    """Every ``KJTAllToAll`` of the input dists built so far (empty before the first batch)."""
    out: List[KJTAllToAll] = []
    for module in model.modules():
        if isinstance(module, ShardedModule):
            for input_dist in compat.input_dists(module):
                out.extend(m for m in input_dist.modules() if isinstance(m, KJTAllToAll))
    return out


class AllReduceAfterOutputDist:
    """DDP comm hook that issues each gradient bucket's all-reduce only once the backward all-to-alls of the
    pooled embeddings are issued (``perf.allreduce_after_output_dist``).

    Why: the compiled dense step hands DDP all its gradients when its backward ends, at the same moment as the
    gradient of the pooled embeddings. Autograd runs the parameters' gradient accumulation first, so DDP's
    all-reduce is issued first and, on the shared communicator, the backward all-to-all waits for it, and the TBE
    backward for both (on 2x H200 at 32768 per GPU, 0.26 ms of all-reduce per step ahead of the all-to-all).
    Held until the all-to-alls are issued, the all-reduce runs behind them, beside the TBE backward, which needs
    only the all-to-all (docs/performance.md).

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
            compat.queue_end_of_backward_callback(self._end_of_backward)
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
