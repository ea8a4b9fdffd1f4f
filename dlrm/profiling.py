"""``profile=true``: a ``torch.profiler`` trace of a few training steps, in TensorBoard and Chrome formats.

    python train.py profile=true profile_wait_steps=10 profile_steps=5 trainer.max_steps=30
    tensorboard --logdir <run_dir>/profile      # or load <run_dir>/profile/trace_rank0.pt.trace.json in
                                                # chrome://tracing or Perfetto

Every rank writes its own trace, ``trace_rank<r>.pt.trace.json``: a Chrome trace, named so that TensorBoard's
profiler plugin (``torch-tb-profiler``) lists it. Labelled ranges: ``## train_step N ##`` around each step;
TorchRec's pipeline labels (``## start_sparse_data_dist ##`` / ``## wait_sparse_data_dist ##``: input dist,
``## forward ##``, ``## optimizer ##``, ``## zero_grad ##``); and, from forward hooks on the DLRM submodules,
``## sparse_arch: lookup + output dist ##``, ``## dense_arch ##``, ``## inter_arch ##``, ``## over_arch ##``
(with ``perf.compile``, one ``## dense step (compiled): dense_arch + inter_arch + over_arch + loss ##`` instead of
the last three, since they run as one compiled graph).
Backward kernels (dense backward and the TBE backward with its fused optimizer) appear under autograd's own
``autograd::engine`` ranges of the step.

Why our own code: torch.profiler is the library; what is ours is where the ranges go in a DLRM step.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

ARCHS = {
    "sparse_arch": "sparse_arch: lookup + output dist",
    "dense_arch": "dense_arch",
    "inter_arch": "inter_arch",
    "over_arch": "over_arch",
}
COMPILED_DENSE = "dense step (compiled): dense_arch + inter_arch + over_arch + loss"


class StepProfiler:
    """Profiles steps ``wait + 2 .. wait + 1 + active`` (1-based) of training; a no-op when ``enabled`` is false.

    Args:
        enabled: ``profile`` from the config.
        out_dir: ``<run_dir>/profile``; created on every rank.
        rank: this rank, for the Chrome trace's file name.
        model: the (DMP-wrapped) model; forward hooks label its DLRM submodules while profiling.
        device: CUDA activity is recorded on CUDA devices.
        wait / active: ``profile_wait_steps`` and ``profile_steps``.
    """

    def __init__(
        self,
        enabled: bool,
        out_dir: str,
        rank: int,
        model: torch.nn.Module,
        device: torch.device,
        wait: int,
        active: int,
    ) -> None:
        self.enabled = enabled
        self.prof: Optional[profile] = None
        self._hooks: List[Any] = []
        self._ranges: List[Any] = []
        self._compiled: List[Any] = []  # train models whose compiled dense step is wrapped in a labelled range
        self.step_range: Optional[Any] = None
        if not enabled:
            return
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"trace_rank{rank}.pt.trace.json")

        def on_ready(p: profile) -> None:
            # one file for both viewers: a Chrome trace, named the way TensorBoard's profiler plugin finds it
            p.export_chrome_trace(path)

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=1, active=active, repeat=1),
            on_trace_ready=on_ready,
            record_shapes=False,
        )
        # perf.compile runs the dense arch, interaction, over arch and loss as one compiled graph: hooks inside it
        # would recompile the graph and their ranges would not show, so that graph gets one range around its call
        self._compiled = [m for m in model.modules() if getattr(m, "compiled_step", None) is not None]
        for m in self._compiled:
            m.compiled_step = self._labelled(m.compiled_step, f"## {COMPILED_DENSE} ##")
        for name, module in model.named_modules():
            label = ARCHS.get(name.rsplit(".", 1)[-1])
            if label is not None and not (self._compiled and label != ARCHS["sparse_arch"]):
                self._hooks.append(module.register_forward_pre_hook(self._enter(label)))
                self._hooks.append(module.register_forward_hook(self._exit))
        self.prof.__enter__()

    @staticmethod
    def _labelled(fn: Any, label: str) -> Any:
        def call(*args: Any) -> Any:
            with record_function(label):
                return fn(*args)

        call.unlabelled = fn  # type: ignore[attr-defined]
        return call

    def _enter(self, label: str) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            rf = record_function(f"## {label} ##")
            rf.__enter__()
            self._ranges.append(rf)

        return hook

    def _exit(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self._ranges:
            self._ranges.pop().__exit__(None, None, None)

    def begin_step(self, step: int) -> None:
        """Open the ``## train_step N ##`` range (``step`` 1-based)."""
        if self.prof is not None:
            self.step_range = record_function(f"## train_step {step} ##")
            self.step_range.__enter__()

    def end_step(self) -> None:
        """Close the step's range and advance the profiler's schedule."""
        if self.prof is not None:
            if self.step_range is not None:
                self.step_range.__exit__(None, None, None)
                self.step_range = None
            self.prof.step()

    def close(self) -> None:
        """Stop profiling (writes the trace if the active window completed) and remove the hooks."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for m in self._compiled:
            m.compiled_step = m.compiled_step.unlabelled
        self._compiled = []
        if self.prof is not None:
            self.prof.__exit__(None, None, None)
            self.prof = None
