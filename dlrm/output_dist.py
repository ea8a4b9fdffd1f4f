"""The output dist's pooled-embedding all-to-all without TorchRec's extra copies (``perf.lean_output_dist``).

What it replaces: every sharded table_wise / column_wise (and table_row_wise, grid cross-host) output dist sends the
pooled embeddings with ``torchrec.distributed.dist_data.PooledEmbeddingsAllToAll``, whose autograd functions
(``comm_ops.All2All_Pooled_Req`` / ``All2All_Pooled_Wait``, torchrec 1.6.1 and 1.8.0 alike) spend two full passes
over that tensor that the all-to-all itself does not need:

* forward: the ``[B_global, D_local]`` lookup output is copied into a second buffer before every all-to-all
  (``all_to_all_single_comm.allocate(...)`` then ``copy_``: a hook for communication libraries whose buffers must
  be registered; with the default allocator it only copies);
* backward: the ``[B_local, D_global]`` gradient is regrouped rank by rank in three passes (a ``.contiguous()``
  copy per rank's column block, then a ``cat`` of those copies), where one pass that writes each block straight
  into the send buffer does the same; and after the all-to-all the received ``[B_global, D_local]`` gradient is
  divided by the world size in a pass of its own (``comm_ops.GRADIENT_DIVISION``), which the one pass above can
  do on the way.

On 2x H200 (``perf=fast``, 32768 per GPU) these took 0.13 ms forward and 0.43 + 0.13 ms backward of the slower
rank's compute stream, on the step's critical path: the all-to-alls and the TBE backward wait for them (eighth
session's trace, docs/benchmarks.md). The functions here do the same collectives, same layout, same gradient
scaling, and give the same values bit for bit (the division happens before the all-to-all instead of after it;
the all-to-all moves values unchanged); they only skip the staging copy and fold the regrouping and the division
into one pass. Forward keeps TorchRec's single ``cat`` of the received
rank blocks into ``[B_local, D_global]`` (what the ``KeyedTensor`` of pooled embeddings needs).

Why our own code: TorchRec has no setting for either copy (the forward one is unconditional, the backward helper
is module-private), and the output dist is on the critical path the trainer exists to shorten.

Seam (private names, checked by ``tests/test_output_dist.py``): the sharded modules keep their output dists in a
plain list, ``_output_dists``; each builds its ``PooledEmbeddingsAllToAll`` on first use (:data:`BUILDERS`), and
right after that the instance's ``forward`` is replaced (instance attribute; other models in the process are
untouched), reading its ``_pg``, ``_dim_sum_per_rank``, ``_codecs`` and ``_callbacks``; the awaitables are
TorchRec's own ``comm_ops.Request`` and ``dist_data.PooledEmbeddingsAwaitable``. Quantized communication
(``codecs``), TorchRec's sync-collectives mode and one-rank groups keep TorchRec's forward.

Usage (what :func:`dlrm.trainer.build_training` does with ``perf.lean_output_dist=true``)::

    model = DistributedModelParallel(...)
    n = use_lean_output_dist(model)   # number of output dists switched
"""

from __future__ import annotations

import types
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torchrec.distributed import comm_ops
from torchrec.distributed.dist_data import PooledEmbeddingsAllToAll, PooledEmbeddingsAwaitable

PRIVATE_NAMES = ("_pg", "_dim_sum_per_rank", "_codecs", "_callbacks")  # of PooledEmbeddingsAllToAll
# the output dists' lazy builders of their PooledEmbeddingsAllToAll (table_wise / column_wise; table_row_wise, grid)
BUILDERS = ("_create_output_dist_module", "_create_output_dist_modules")

Splits = Tuple[List[int], List[int]]  # (batch size per rank, embedding dim sum per rank)


class _LeanPooledReq(torch.autograd.Function):
    """Issue the forward all-to-all of ``[B_global, D_local]`` pooled embeddings straight from the lookup output;
    backward: wait for the gradient all-to-all and hand back ``[B_global, D_local]`` (already divided by the world
    size where TorchRec divides it: :class:`_LeanPooledWait` did that before sending)."""

    @staticmethod
    def forward(ctx: Any, pg: dist.ProcessGroup, myreq: comm_ops.Request, splits: Splits,  # type: ignore[override]
                local_embs: torch.Tensor) -> torch.Tensor:
        batch, dims = splits
        me = dist.get_rank(pg)
        flat = local_embs.contiguous().view(-1)  # the lookup output is contiguous: a view, no copy
        out = torch.empty(batch[me] * sum(dims), dtype=flat.dtype, device=flat.device)
        with record_function("## lean_pooled_a2a_fwd ##"):
            work = dist.all_to_all_single(out, flat, output_split_sizes=[batch[me] * d for d in dims],
                                          input_split_sizes=[dims[me] * b for b in batch], group=pg, async_op=True)
        myreq.req, myreq.tensor, myreq.a2ai, myreq.wait_function = work, out, splits, _LeanPooledWait
        ctx.myreq, ctx.pg = myreq, pg
        return myreq.dummy_tensor

    @staticmethod
    def backward(ctx: Any, *unused: torch.Tensor) -> Tuple[None, None, None, torch.Tensor]:
        myreq, pg = ctx.myreq, ctx.pg
        myreq.req.wait()
        myreq.req = None
        batch, dims = myreq.a2ai
        grad = myreq.tensor.view(sum(batch), dims[dist.get_rank(pg)])  # divided before sending, if at all
        myreq.tensor = None
        myreq.dummy_tensor = None
        return None, None, None, grad


class _LeanPooledWait(torch.autograd.Function):
    """Wait for the forward all-to-all and lay the rank blocks side by side as ``[B_local, D_global]`` (one
    ``cat``, as TorchRec); backward: write each rank's column block of the gradient, divided by the world size as
    TorchRec's ``GRADIENT_DIVISION`` asks, straight into the send buffer (one pass) and issue the gradient
    all-to-all."""

    @staticmethod
    def forward(ctx: Any, pg: dist.ProcessGroup, myreq: comm_ops.Request,  # type: ignore[override]
                *dummy: torch.Tensor) -> torch.Tensor:
        myreq.req.wait()
        out, splits = myreq.tensor, myreq.a2ai
        myreq.req, myreq.tensor = None, None
        batch, dims = splits
        b = batch[dist.get_rank(pg)]
        ctx.pg, ctx.myreq, ctx.splits = pg, myreq, splits
        blocks = out.split([b * d for d in dims])
        return torch.cat([blk.view(b, d) for blk, d in zip(blocks, dims)], dim=1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        myreq, pg = ctx.myreq, ctx.pg
        batch, dims = ctx.splits
        me = dist.get_rank(pg)
        b = batch[me]
        send = torch.empty(b * sum(dims), dtype=grad.dtype, device=grad.device)
        # TorchRec divides the received gradient by the world size (comm_ops.GRADIENT_DIVISION) in a pass of its
        # own; the same division of the same values is done here, in the pass that fills the send buffer (the
        # all-to-all moves values unchanged, so the result is the same bit for bit)
        world = dist.get_world_size(pg) if comm_ops.GRADIENT_DIVISION else 1
        off = col = 0
        for d in dims:
            block = send[off:off + b * d].view(b, d)
            if world > 1:
                torch.div(grad[:, col:col + d], world, out=block)
            else:
                block.copy_(grad[:, col:col + d])
            off, col = off + b * d, col + d
        recv = torch.empty(sum(batch) * dims[me], dtype=grad.dtype, device=grad.device)
        with record_function("## lean_pooled_a2a_bwd ##"):
            work = dist.all_to_all_single(recv, send, output_split_sizes=[dims[me] * n for n in batch],
                                          input_split_sizes=[b * d for d in dims], group=pg, async_op=True)
        myreq.req, myreq.tensor = work, recv
        return (None, None, myreq.dummy_tensor)


def _lean_forward(self: PooledEmbeddingsAllToAll, local_embs: torch.Tensor,
                  batch_size_per_rank: Optional[Sequence[int]] = None) -> PooledEmbeddingsAwaitable:
    """``PooledEmbeddingsAllToAll.forward`` through :class:`_LeanPooledReq` / :class:`_LeanPooledWait`; the cases
    those do not cover (quantized communication, sync collectives, one rank) take TorchRec's forward."""
    pg = self._pg
    if self._codecs is not None or pg.size() <= 1 or comm_ops.get_use_sync_collectives():
        return type(self).forward(self, local_embs, batch_size_per_rank)
    world = pg.size()
    if not batch_size_per_rank:
        b_global = local_embs.size(0)
        if b_global % world:
            raise ValueError(f"pooled embeddings of {b_global} samples cannot be split evenly over {world} ranks; "
                             f"use a global batch size divisible by the world size")
        batch_size_per_rank = [b_global // world] * world
    myreq = comm_ops.Request(pg, device=local_embs.device)
    _LeanPooledReq.apply(pg, myreq, (list(batch_size_per_rank), list(self._dim_sum_per_rank)), local_embs)
    awaitable = PooledEmbeddingsAwaitable(tensor_awaitable=myreq)
    awaitable.callbacks.extend(self._callbacks)
    return awaitable


def check_private_names(module: torch.nn.Module, names: Sequence[str] = PRIVATE_NAMES) -> None:
    """Raise ``RuntimeError`` naming the attribute when a TorchRec upgrade renamed one this module reads."""
    for name in names:
        if not hasattr(module, name):
            raise RuntimeError(f"perf.lean_output_dist: torchrec's {type(module).__name__} has no `{name}` in this "
                               f"version; set perf.lean_output_dist=false (dlrm/output_dist.py needs updating)")


def _switch(module: torch.nn.Module) -> int:
    """Switch every ``PooledEmbeddingsAllToAll`` (exactly that class) in ``module``'s tree; returns how many."""
    n = 0
    for m in module.modules():
        if type(m) is PooledEmbeddingsAllToAll and "forward" not in vars(m):
            check_private_names(m)
            if m._pg.size() > 1:
                m.forward = types.MethodType(_lean_forward, m)
                n += 1
    return n


def _dist_classes() -> Dict[type, Tuple[str, str]]:
    """TorchRec's output dists that build a ``PooledEmbeddingsAllToAll`` on first use -> (their builder, the
    attribute holding the process group of that all-to-all). The row_wise dist (a reduce-scatter) is not one."""
    from torchrec.distributed.sharding.grid_sharding import GridPooledEmbeddingDist
    from torchrec.distributed.sharding.tw_sharding import TwPooledEmbeddingDist
    from torchrec.distributed.sharding.twrw_sharding import TwRwPooledEmbeddingDist

    return {TwPooledEmbeddingDist: (BUILDERS[0], "_pg"),  # table_wise, column_wise
            TwRwPooledEmbeddingDist: (BUILDERS[1], "_cross_pg"),  # table_row_wise: the all-to-all across hosts
            GridPooledEmbeddingDist: (BUILDERS[1], "_cross_pg")}  # grid_shard: the same


def use_lean_output_dist(model: torch.nn.Module) -> int:
    """Switch the pooled-embedding all-to-alls of ``model``'s output dists to the lean functions.

    TorchRec builds an output dist's ``PooledEmbeddingsAllToAll`` on its first forward (see :func:`_dist_classes`),
    so each such output dist's builder is wrapped, on that instance, to switch what it builds; one built already is
    switched now. Output dists whose all-to-all spans one rank (one process; table_row_wise and grid_shard on one
    host, whose all-to-all runs across hosts) are left alone, as are other kinds (row_wise's reduce-scatter). A
    bare ``PooledEmbeddingsAllToAll`` is switched directly.

    Returns:
        How many output dists (or bare all-to-alls) send through the lean functions (0: none of those kinds, or
        none spanning more than one rank).

    Raises:
        RuntimeError: TorchRec lacks a private name this relies on (see :data:`PRIVATE_NAMES`).
    """
    if type(model) is PooledEmbeddingsAllToAll:
        return _switch(model)
    kinds = _dist_classes()
    n = 0
    for module in model.modules():
        for od in getattr(module, "_output_dists", None) or []:
            kind = kinds.get(type(od))
            if kind is None:
                continue
            builder, pg_attr = kind
            check_private_names(od, kind)
            if getattr(od, pg_attr).size() <= 1:
                continue
            _switch(od)

            def build_and_switch(*args: Any, _build: Any = getattr(od, builder), _od: torch.nn.Module = od,
                                 **kwargs: Any) -> Any:
                out = _build(*args, **kwargs)
                _switch(_od)
                return out

            setattr(od, builder, build_and_switch)
            n += 1
    return n
