"""The output dist's pooled-embedding all-to-all without TorchRec's extra passes (``perf.lean_output_dist``).

What it replaces: every sharded table_wise / column_wise (and table_row_wise, grid_shard across hosts) output
dist sends the pooled embeddings with ``torchrec.distributed.dist_data.PooledEmbeddingsAllToAll``, whose autograd
functions (``comm_ops.All2All_Pooled_Req`` / ``All2All_Pooled_Wait``, torchrec 1.6 and 1.8 alike) spend full
passes over that tensor that the all-to-all itself does not need:

* forward: the ``[B_global, D_local]`` lookup output is copied into a second buffer before every all-to-all (a
  hook for communication libraries whose buffers must be registered; with the default allocator it only copies);
* backward: the ``[B_local, D_global]`` gradient is regrouped rank by rank in three passes (a ``.contiguous()``
  copy per rank's column block, then a ``cat``), where one pass that writes each block straight into the send
  buffer does the same; and after the all-to-all the received gradient is divided by the world size in a pass of
  its own (``comm_ops.GRADIENT_DIVISION``), which that one pass can do on the way.

The functions here do the same collectives, same layout, same gradient scaling, and give the same values bit for
bit (the division happens before the all-to-all instead of after it; the all-to-all moves values unchanged).
Forward keeps TorchRec's single ``cat`` of the received rank blocks into ``[B_local, D_global]`` (what the
``KeyedTensor`` of pooled embeddings needs), except in rank-block mode:

* Rank blocks (``use_lean_output_dist(..., rank_blocks=True)``, every table table_wise, one output dist per sharded
  module): the receive buffer itself is handed over, viewed as ``[B_local, D_global]`` and marked with its layout
  (:class:`RankBlocks`), with neither the ``cat`` forward nor the regrouping pass backward;
  :class:`dlrm.model.ZeroCopySparseArch` gathers the features from it inside the compiled dense step and returns
  the gradient already in the send layout and divided. Only inside :func:`accepting_rank_blocks` (which that sparse
  arch enters around its lookup); any other reader gets TorchRec's layout.
* ``a2a_listener``: told of each all-to-all whose backward is due and of each backward all-to-all issued;
  :class:`dlrm.comms.AllReduceAfterOutputDist` holds DDP's all-reduce until none is due
  (``perf.allreduce_after_output_dist``).

Why our own code: TorchRec has no setting for either pass (the forward copy is unconditional, the backward helper
is module-private), and the output dist is on the critical path of a multi-GPU step. The TorchRec internals it
reads (the output dists' list and lazy builders, the all-to-all's process group, splits, codecs and callbacks) go
through :mod:`dlrm.torchrec_compat`; the awaitables are TorchRec's own ``comm_ops.Request`` and
``dist_data.PooledEmbeddingsAwaitable``. Quantized communication (codecs), TorchRec's sync-collectives mode and
one-rank groups keep TorchRec's forward.

Usage (what :func:`dlrm.perf.apply_perf` does with ``perf.lean_output_dist=true``)::

    model = DistributedModelParallel(...)
    n = use_lean_output_dist(model, rank_blocks=True)   # number of output dists switched
"""

from __future__ import annotations

import contextlib
import threading
import types
from typing import Any, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torchrec.distributed import comm_ops
from torchrec.distributed.dist_data import PooledEmbeddingsAllToAll, PooledEmbeddingsAwaitable
from torchrec.distributed.types import ShardedModule

from dlrm import torchrec_compat as compat

Splits = Tuple[List[int], List[int]]  # (batch size per rank, embedding dim sum per rank)
RANK_BLOCKS_ATTR = "_dlrm_rank_blocks"  # on the pooled embeddings handed over in rank-block layout
A2A_LISTENER_ATTR = "_dlrm_a2a_listener"  # told of each all-to-all whose backward is due, and of its issue
FIELDS_ATTR = "_dlrm_a2a_fields"  # the PooledAllToAllFields a switched all-to-all sends with


_ACCEPTING = threading.local()  # .on: the current forward reads RankBlocks (accepting_rank_blocks)


@contextlib.contextmanager
def accepting_rank_blocks() -> Iterator[None]:
    """Within this context, output dists set up with rank blocks hand over their pooled embeddings in rank-block
    layout (:class:`RankBlocks`); outside it (any other reader of the ``KeyedTensor``: TorchRec's ``SparseArch``, a
    pipeline that waits for the output dist elsewhere) they concatenate the rank blocks as TorchRec does, so that
    no reader that does not know the layout ever gets it. :class:`dlrm.model.ZeroCopySparseArch` enters it around
    its lookup."""
    prev = getattr(_ACCEPTING, "on", False)
    _ACCEPTING.on = True
    try:
        yield
    finally:
        _ACCEPTING.on = prev


class RankBlocks(NamedTuple):
    """How pooled embeddings handed over in rank-block layout are laid out (the tensor's ``_dlrm_rank_blocks``).

    The tensor is ``[B_local, D_global]`` in shape only: its memory is the all-to-all's receive buffer, rank 0's
    ``[B_local, dims[0]]`` block, then rank 1's, and so on; its consumer (:class:`dlrm.model.ZeroCopySparseArch`)
    gathers the features from there inside the compiled dense step, and hands back the gradient in the same
    layout, divided by ``grad_divisor`` (what TorchRec's ``GRADIENT_DIVISION`` asks: the world size, or 1).
    """

    dims: Tuple[int, ...]  # embedding dim sum per rank, in rank order (the KeyedTensor's keys follow it)
    grad_divisor: int


class _LeanPooledReq(torch.autograd.Function):
    """Issue the forward all-to-all of ``[B_global, D_local]`` pooled embeddings straight from the lookup output;
    backward: wait for the gradient all-to-all and hand back ``[B_global, D_local]`` (already divided by the world
    size where TorchRec divides it, before sending: by :class:`_LeanPooledWait`, or in rank-block mode by the
    consumer's gather)."""

    @staticmethod
    def forward(
        ctx: Any,
        pg: dist.ProcessGroup,
        myreq: comm_ops.Request,
        splits: Splits,  # type: ignore[override]
        local_embs: torch.Tensor,
    ) -> torch.Tensor:
        batch, dims = splits
        me = dist.get_rank(pg)
        flat = local_embs.contiguous().view(-1)  # the lookup output is contiguous: a view, no copy
        out = torch.empty(batch[me] * sum(dims), dtype=flat.dtype, device=flat.device)
        with record_function("## lean_pooled_a2a_fwd ##"):
            work = dist.all_to_all_single(
                out,
                flat,
                output_split_sizes=[batch[me] * d for d in dims],
                input_split_sizes=[dims[me] * b for b in batch],
                group=pg,
                async_op=True,
            )
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
    all-to-all. In rank-block mode (:class:`RankBlocks`, inside :func:`accepting_rank_blocks`) neither pass: the
    receive buffer is returned as is, and its gradient arrives in the send layout, already divided."""

    @staticmethod
    def forward(
        ctx: Any,
        pg: dist.ProcessGroup,
        myreq: comm_ops.Request,  # type: ignore[override]
        *dummy: torch.Tensor,
    ) -> torch.Tensor:
        # set up for it (_lean_forward) and read by a caller that knows the layout (accepting_rank_blocks)
        rank_blocks = getattr(myreq, RANK_BLOCKS_ATTR, False) and getattr(_ACCEPTING, "on", False)
        myreq.req.wait()
        out, splits = myreq.tensor, myreq.a2ai
        myreq.req, myreq.tensor = None, None
        batch, dims = splits
        b = batch[dist.get_rank(pg)]
        ctx.pg, ctx.myreq, ctx.splits, ctx.rank_blocks = pg, myreq, splits, rank_blocks
        listener = getattr(myreq, A2A_LISTENER_ATTR, None)
        if listener is not None and any(ctx.needs_input_grad):  # a backward is due; ctx is its node
            listener.output_dist_forward(ctx)
        if rank_blocks:  # no cat: the consumer gathers from the receive buffer (RankBlocks)
            ret = out.view(b, sum(dims))
            setattr(ret, RANK_BLOCKS_ATTR, RankBlocks(tuple(dims), _grad_divisor(pg)))
            return ret
        blocks = out.split([b * d for d in dims])
        return torch.cat([blk.view(b, d) for blk, d in zip(blocks, dims)], dim=1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        myreq, pg = ctx.myreq, ctx.pg
        batch, dims = ctx.splits
        me = dist.get_rank(pg)
        b = batch[me]
        if ctx.rank_blocks:  # already in the send layout and divided, by the consumer's gather (RankBlocks)
            send = grad.contiguous().view(-1)
        else:
            send = torch.empty(b * sum(dims), dtype=grad.dtype, device=grad.device)
            # TorchRec divides the received gradient by the world size (comm_ops.GRADIENT_DIVISION) in a pass of
            # its own; the same division of the same values is done here, in the pass that fills the send buffer
            # (the all-to-all moves values unchanged, so the result is the same bit for bit)
            world = _grad_divisor(pg)
            off = col = 0
            for d in dims:
                block = send[off : off + b * d].view(b, d)
                if world > 1:
                    torch.div(grad[:, col : col + d], world, out=block)
                else:
                    block.copy_(grad[:, col : col + d])
                off, col = off + b * d, col + d
        recv = torch.empty(sum(batch) * dims[me], dtype=grad.dtype, device=grad.device)
        with record_function("## lean_pooled_a2a_bwd ##"):
            work = dist.all_to_all_single(
                recv,
                send,
                output_split_sizes=[dims[me] * n for n in batch],
                input_split_sizes=[b * d for d in dims],
                group=pg,
                async_op=True,
            )
        myreq.req, myreq.tensor = work, recv
        listener = getattr(myreq, A2A_LISTENER_ATTR, None)
        if listener is not None:  # e.g. DDP's held all-reduce (dlrm.comms.AllReduceAfterOutputDist)
            listener.output_dist_issued(ctx)
        return (None, None, myreq.dummy_tensor)


def _grad_divisor(pg: dist.ProcessGroup) -> int:
    """What TorchRec divides the received pooled-embedding gradient by: the world size under
    ``comm_ops.GRADIENT_DIVISION`` (its default), else 1."""
    return dist.get_world_size(pg) if comm_ops.GRADIENT_DIVISION else 1


def _lean_forward(
    self: PooledEmbeddingsAllToAll, local_embs: torch.Tensor, batch_size_per_rank: Optional[Sequence[int]] = None
) -> PooledEmbeddingsAwaitable:
    """``PooledEmbeddingsAllToAll.forward`` through :class:`_LeanPooledReq` / :class:`_LeanPooledWait`; the cases
    those do not cover (quantized communication, sync collectives, one rank) take TorchRec's forward."""
    fields: compat.PooledAllToAllFields = getattr(self, FIELDS_ATTR)
    pg = fields.pg
    if fields.codecs is not None or pg.size() <= 1 or comm_ops.get_use_sync_collectives():
        return type(self).forward(self, local_embs, batch_size_per_rank)
    world = pg.size()
    if not batch_size_per_rank:
        b_global = local_embs.size(0)
        if b_global % world:
            raise ValueError(
                f"pooled embeddings of {b_global} samples cannot be split evenly over {world} ranks; "
                f"use a global batch size divisible by the world size"
            )
        batch_size_per_rank = [b_global // world] * world
    myreq = comm_ops.Request(pg, device=local_embs.device)
    # rank-block layout (RankBlocks) only without callbacks: a callback would read the tensor as [B, D]
    setattr(myreq, RANK_BLOCKS_ATTR, bool(getattr(self, RANK_BLOCKS_ATTR, False)) and not fields.callbacks)
    setattr(myreq, A2A_LISTENER_ATTR, getattr(self, A2A_LISTENER_ATTR, None))
    _LeanPooledReq.apply(pg, myreq, (list(batch_size_per_rank), list(fields.dim_sum_per_rank)), local_embs)
    awaitable = PooledEmbeddingsAwaitable(tensor_awaitable=myreq)
    awaitable.callbacks.extend(fields.callbacks or [])
    return awaitable


def _switch(module: torch.nn.Module, rank_blocks: bool = False, a2a_listener: Any = None) -> int:
    """Switch every ``PooledEmbeddingsAllToAll`` (exactly that class) in ``module``'s tree; returns how many."""
    n = 0
    for m in module.modules():
        if type(m) is PooledEmbeddingsAllToAll and "forward" not in vars(m):
            fields = compat.PooledAllToAllFields(m)  # read once: TorchRec sets them when it builds the module
            if fields.pg.size() > 1:
                setattr(m, FIELDS_ATTR, fields)
                m.forward = types.MethodType(_lean_forward, m)
                setattr(m, RANK_BLOCKS_ATTR, rank_blocks)
                setattr(m, A2A_LISTENER_ATTR, a2a_listener)
                n += 1
    return n


def use_lean_output_dist(model: torch.nn.Module, rank_blocks: bool = False, a2a_listener: Any = None) -> int:
    """Switch the pooled-embedding all-to-alls of ``model``'s output dists to the lean functions.

    With ``rank_blocks``, a sharded module whose only output dist is table_wise's hands over its pooled embeddings
    in rank-block layout (:class:`RankBlocks`): no ``cat`` forward, no regrouping or division pass backward; its
    consumer must gather them (:class:`dlrm.model.ZeroCopySparseArch` does, inside the compiled dense step). Only
    for a model whose sparse arch is that class and whose plan is table_wise for every table (a column_wise table
    is split across the rank blocks): :func:`dlrm.perf.apply_perf` checks both.

    ``a2a_listener`` (:class:`dlrm.comms.AllReduceAfterOutputDist`, which holds DDP's all-reduce until then) is
    told of every forward all-to-all whose backward is due (``output_dist_forward(node)``) and of every backward
    all-to-all issued (``output_dist_issued(node)``).

    TorchRec builds an output dist's ``PooledEmbeddingsAllToAll`` on its first forward, so each such output dist
    is hooked to switch what it builds; one built already is switched now. Output dists whose all-to-all spans one
    rank (one process; table_row_wise and grid_shard on one host, whose all-to-all runs across hosts) are left
    alone, as are other kinds (row_wise's reduce-scatter). A bare ``PooledEmbeddingsAllToAll`` is switched directly.

    Returns:
        How many output dists (or bare all-to-alls) send through the lean functions (0: none of those kinds, or
        none spanning more than one rank).

    Raises:
        dlrm.torchrec_compat.MissingInternalError: TorchRec lacks an internal this relies on.
    """
    if type(model) is PooledEmbeddingsAllToAll:
        return _switch(model, a2a_listener=a2a_listener)
    n = 0
    for module in model.modules():
        if not isinstance(module, ShardedModule):
            continue
        ods = compat.output_dists(module)
        for od in ods:
            kind = compat.pooled_output_dist_kind(od)
            if kind is None or compat.pooled_output_dist_group(od).size() <= 1:
                continue
            # one output dist: its tensor is the KeyedTensor's values as is (TorchRec cats several)
            blocks = rank_blocks and len(ods) == 1 and kind == "table_wise"
            _switch(od, blocks, a2a_listener)
            compat.after_pooled_all_to_all_built(od, lambda od=od, blocks=blocks: _switch(od, blocks, a2a_listener))
            n += 1
    return n
