"""What ``pipeline=graphed``'s captured step does to the dense parameters after the backward (:class:`DenseStep`):
on several ranks the all-reduce of their gradients as DDP's reducer makes it, then Adagrad in one pass
(:func:`adagrad_one_pass`), the arithmetic of ``torch.optim.Adagrad``'s step bit for bit, on the optimizer's own
state (so checkpoints and the learning rate stay the optimizer's). Captured, the step runs compiled by
torch.compile, one read and write of each parameter and its state where torch's foreach step makes four passes
(0.17 ms against 0.06 at 8192 on an H200); without a capture it runs eagerly.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlrm import torchrec_compat as compat
from dlrm.errors import ConfigError

# Inductor lowers an fp32 `/` to Triton's approximate division (div.full.f32, within 2 ulp); PyTorch's CUDA kernels
# divide with IEEE rounding. This option makes the compiled Adagrad divide as eager does (torch >= 2.10;
# https://github.com/pytorch/pytorch/pull/165566).
EAGER_DIVISION = {"eager_numerics.division_rounding": True}
# DDP comm hooks that divide each bucket by the world size before a sum all-reduce (torch's default hook, and the
# held all-reduce of perf.allreduce_after_output_dist, which issues it); without a hook DDP's reducer multiplies by
# the reciprocal instead (the same for a world size that is a power of two)
_DIVIDING_HOOKS = ("allreduce_hook", "AllReduceAfterOutputDist.hook")


def adagrad_one_pass(
    params: List[torch.Tensor],
    grads: List[torch.Tensor],
    sums: List[torch.Tensor],
    *,
    lr: float,
    eps: float,
    weight_decay: float,
) -> None:
    """One Adagrad step in place, in the order of operations and roundings of ``torch.optim.Adagrad``'s foreach
    step for ``lr_decay=0`` and ``maximize=False`` (``torch.optim.adagrad._multi_tensor_adagrad``):
    ``g += weight_decay * p``; ``sum += g * g``; ``p += (g * -lr) / (sqrt(sum) + eps)``. Written per tensor
    with public ops so that torch.compile fuses each parameter's update into one kernel. The step counters are
    the caller's.

    Args:
        params, grads, sums: fp32 tensors, pairwise of one shape (parameters, their gradients, the optimizer's
            ``sum`` state); ``params`` and ``sums`` are updated.
        lr: learning rate; eps: added to the root (MLPerf Training rules: 1e-8); weight_decay: L2 factor.
    """
    for p, g, s in zip(params, grads, sums):
        if weight_decay != 0:
            g = g.add(p, alpha=weight_decay)
        s.addcmul_(g, g, value=1)
        std = s.sqrt().add_(eps)
        p.addcdiv_(g.mul(-lr), std)


class DenseStep:
    """The dense parameters' all-reduce (``reduce``) and Adagrad step, as the captured step runs them.

    Args:
        dense: the optimizer of the parameters not fused into the TBE backward; its parameter groups must be
            ``torch.optim.Adagrad``'s (``sum`` and ``step`` state, no ``lr_decay``, not ``maximize``).
        model: the DMP-wrapped model (its DDP gives the all-reduce's group and comm hook).
        compile: compile the Adagrad step (for a CUDA graph); else run it eagerly.
        reduce: all-reduce the gradients first (the several-rank path).

    Raises:
        ConfigError: a dense optimizer that is not Adagrad; with ``reduce``, DDP with a comm hook other than the
            fp32 all-reduce's.
    """

    def __init__(self, dense: torch.optim.Optimizer, model: torch.nn.Module, compile: bool, reduce: bool) -> None:
        for g in dense.param_groups:
            if (
                g.get("lr_decay", None) != 0
                or g.get("maximize", False)
                or any("sum" not in dense.state[p] for p in g["params"])
            ):
                raise ConfigError(
                    "config key `pipeline.name`: pipeline=graphed steps the dense parameters with Adagrad (no "
                    "lr_decay, not maximize) only; use pipeline=sparse_dist"
                )
        self._dense = dense
        self._compile = compile
        self._compiled: Dict[Tuple[float, float, float], Callable[..., None]] = {}
        self._reduce: Optional[Tuple[dist.ProcessGroup, int, bool]] = None  # (group, world, divide)
        self._ready: Optional[Dict[int, int]] = None  # id of a dense parameter -> when its gradient was ready
        if reduce:
            ddp = next((m for m in model.modules() if isinstance(m, DistributedDataParallel)), None)
            group = ddp.process_group if ddp is not None else dist.group.WORLD
            hook = compat.ddp_comm_hook_name(ddp) if ddp is not None else None
            if hook and not hook.endswith(_DIVIDING_HOOKS):
                raise ConfigError(
                    f"config key `perf.allreduce_dtype`: pipeline=graphed all-reduces the dense gradients in fp32, "
                    f"but DDP has the comm hook {hook}; use perf.allreduce_dtype=fp32 or pipeline=sparse_dist"
                )
            self._reduce = (group, dist.get_world_size(group), bool(hook))

    @contextlib.contextmanager
    def record_ready_order(self) -> Iterator[None]:
        """With ``reduce``, on the first call: record the order in which the dense gradients become ready in the
        backward inside the block. After its first backward DDP rebuilds its buckets in that order, and the flat
        all-reduce buffer takes it too (:meth:`reduce`). Otherwise nothing."""
        if self._reduce is None or self._ready is not None:
            yield
            return
        ready: Dict[int, int] = {}

        def note(p: torch.Tensor) -> None:
            ready.setdefault(id(p), len(ready))

        ps = [p for g in self._dense.param_groups for p in g["params"] if p.requires_grad]
        handles = [p.register_post_accumulate_grad_hook(note) for p in ps]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
        self._ready = ready

    @torch.no_grad()
    def reduce(self) -> None:
        """With ``reduce`` (else nothing), what DDP does to the dense gradients, on one flat buffer per dtype:
        scale by the world size (divide with a dividing comm hook, else multiply by the reciprocal, as DDP's
        reducer does), sum all-reduce; the gradients become views of the reduced buffer. The buffer holds the
        gradients in the order they became ready in the first eager backward, the order of DDP's rebuilt bucket:
        an all-reduce over more than 2 ranks sums each element in an order set by its offset in the buffer (gloo's
        ring reduces chunk by chunk), so only that layout sums as DDP's one bucket does, bit for bit."""
        if self._reduce is None:
            return
        group, world, divide = self._reduce
        ps = [p for g in self._dense.param_groups for p in g["params"] if p.grad is not None]
        ready = self._ready or {}
        ps = sorted(ps, key=lambda p: ready.get(id(p), len(ready)))  # stable: any not recorded last, in order
        for dtype in dict.fromkeys(p.grad.dtype for p in ps):
            same = [p for p in ps if p.grad.dtype == dtype]
            flat = torch.empty(sum(p.numel() for p in same), dtype=dtype, device=same[0].grad.device)
            views = [v.view_as(p) for p, v in zip(same, flat.split([p.numel() for p in same]))]
            for p, v in zip(same, views):  # scaled on the way into the buffer: one pass, as DDP's reducer
                if world == 1:
                    v.copy_(p.grad)
                elif divide:
                    torch.div(p.grad, world, out=v)
                else:
                    torch.mul(p.grad, 1.0 / world, out=v)
            dist.all_reduce(flat, group=group)
            for p, v in zip(same, views):
                p.grad = v

    @torch.no_grad()
    def step(self) -> None:
        """Adagrad on every parameter with a gradient, its ``step`` counter advanced first."""
        opt = self._dense
        for g in opt.param_groups:
            ps = [p for p in g["params"] if p.grad is not None]
            self.advance_steps(ps)
            self._compiled_step(g["lr"], g["eps"], g["weight_decay"])(
                ps, [p.grad for p in ps], [opt.state[p]["sum"] for p in ps]
            )

    def advance_steps(self, params: List[torch.Tensor]) -> None:
        """Add 1 to the dense optimizer's ``step`` of each of ``params``, as torch's step does before it computes
        the rate (with lr_decay 0 the rate is lr, so only checkpoints read the counters). A graph replay does not
        run this host increment: the pipeline calls it before each replay."""
        state = self._dense.state
        for p in params:
            state[p]["step"] += 1

    def _compiled_step(self, lr: float, eps: float, weight_decay: float) -> Callable[..., None]:
        """:func:`adagrad_one_pass` with these scalars, compiled when a graph is captured with the scalars as
        constants (a float argument would be traced as a symbol, an input the arithmetic reads at another
        precision)."""
        key = (lr, eps, weight_decay)
        if key not in self._compiled:

            def step(params: List[torch.Tensor], grads: List[torch.Tensor], sums: List[torch.Tensor]) -> None:
                adagrad_one_pass(params, grads, sums, lr=lr, eps=eps, weight_decay=weight_decay)

            self._compiled[key] = (
                torch.compile(step, fullgraph=True, dynamic=False, options=EAGER_DIVISION) if self._compile else step
            )
        return self._compiled[key]
