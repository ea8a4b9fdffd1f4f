"""The output dist's all-to-all alone and beside matrix products: NCCL's SM kernels against its copy-engine path
(issue 9).

    # 2x H200 (NCCL 2.28+: torch 2.11's build has 2.28.9)
    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 bench/nccl_all_to_all.py --out /tmp/a2a
    # CPU smoke test (gloo, the SM cases only, tiny sizes; numbers meaningless), with the venv of `make`
    .venv/bin/torchrun --standalone --nproc_per_node 2 bench/nccl_all_to_all.py --smoke --out /tmp/a2a

Why: on 2x H200 the collectives of a ``perf=fast`` step sit on its critical path, and every way of overlapping
them with compute measured so far (other streams, phases, fewer CTAs) lost what it gained to the SMs that NCCL's
kernels take (docs/benchmarks.md, fifth session). NCCL 2.28 can run an all-to-all on the copy engines, with no
thread blocks, when the communicator's CTA policy is ``NCCL_CTA_POLICY_ZERO`` and both buffers are registered in a
symmetric window (here: ``torch.distributed._symmetric_memory`` with its NCCL backend, then ``rendezvous``). This
measures what that path would buy before any trainer code depends on it.

What is timed (CUDA-synchronised wall time per iteration, ``--iters`` iterations after 3 warm-up ones, barrier
before), for a bf16 payload the size of one step's output dist (``--batch-size`` x ``--dim-per-rank`` per
destination rank: 32768 x 13 tables x 128 by default, about 109 MB from each rank to each other one):

* ``a2a``: one ``all_to_all_single``;
* ``mm``: ``--matmuls`` bf16 products ``[B, 3456] x [3456, 1024]`` (the DCN/over-arch shape class);
* ``both``: the all-to-all issued asynchronously, the products on the current stream, then the wait.
  ``both - mm`` is what the all-to-all adds when it overlaps compute.

Cases: ``sm`` (default group, equal splits: NCCL's all-to-all kernel), ``sm_splits`` (explicit split lists, as
TorchRec's ``alltoall_pooled`` passes them: grouped send/recv kernels), ``ce`` / ``ce_splits`` (a group with
``NCCL_CTA_POLICY_ZERO``, symmetric buffers), ``ce_group_plain_buffers`` (that group, ordinary buffers: NCCL
falls back to kernels). Each row checks that every rank received the other ranks' values.

Output: one line per case and rank; ``nccl_all_to_all.json`` (rank 0's rows; ``meta.bytes_per_destination``: the
bytes each rank sends to each rank) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist


def _timeit(fn: Callable[[], None], iters: int, sync: Callable[[], None]) -> float:
    for _ in range(3):
        fn()
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters * 1e3


def _symmetric_buffers(n: int, device: torch.device, group: dist.ProcessGroup) -> Optional[List[torch.Tensor]]:
    """Two bf16 buffers of ``n`` elements from the NCCL symmetric-memory pool, registered on ``group``; None (and a
    printed reason) where this torch/NCCL cannot."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.set_backend("NCCL")
        with torch.cuda.use_mem_pool(symm_mem.get_mem_pool(device)):
            bufs = [torch.empty(n, dtype=torch.bfloat16, device=device) for _ in range(2)]
        for b in bufs:
            symm_mem.rendezvous(b, group=group.group_name)
        return bufs
    except Exception as e:  # noqa: BLE001 - any failure means: no copy-engine cases on this stack
        print(f"symmetric memory unavailable: {type(e).__name__}: {str(e)[:300]}", flush=True)
        return None


def main(argv: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=32768, help="samples per rank")
    p.add_argument("--dim-per-rank", type=int, default=13 * 128, help="pooled dims each rank sends per sample")
    p.add_argument("--matmuls", type=int, default=10)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--smoke", action="store_true", help="gloo on CPU, tiny sizes, SM cases only")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_size, args.dim_per_rank, args.matmuls, args.iters = 8, 16, 1, 2
    cuda = torch.cuda.is_available() and not args.smoke
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    n = args.batch_size * args.dim_per_rank * world  # elements per rank: one slice per destination
    chunk = n // world
    inp = torch.full((n,), float(rank + 1), dtype=torch.bfloat16, device=device)
    out = torch.empty(n, dtype=torch.bfloat16, device=device)
    a = torch.randn(args.batch_size, 3456 if cuda else 32, device=device, dtype=torch.bfloat16)
    b = torch.randn(a.shape[1], 1024 if cuda else 32, device=device, dtype=torch.bfloat16)
    expected = torch.cat([torch.full((chunk,), float(r + 1), dtype=torch.bfloat16) for r in range(world)])
    cases = [("sm", dist.group.WORLD, inp, out, False), ("sm_splits", dist.group.WORLD, inp, out, True)]
    meta: Dict[str, Any] = {
        "world": world,
        "backend": dist.get_backend(),
        "bytes_per_destination": chunk * 2,
        "torch": torch.__version__,
    }
    if cuda:
        meta["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        opts = dist.ProcessGroupNCCL.Options()
        opts.config.cta_policy = dist.ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO
        ce_group = dist.new_group(list(range(world)), pg_options=opts)
        bufs = _symmetric_buffers(n, device, ce_group)
        if bufs is not None:
            bufs[0].copy_(inp)
            cases += [("ce", ce_group, bufs[0], bufs[1], False), ("ce_splits", ce_group, bufs[0], bufs[1], True)]
        cases.append(("ce_group_plain_buffers", ce_group, inp, out, False))

    def mm() -> None:
        for _ in range(args.matmuls):
            a @ b

    t_mm = _timeit(mm, args.iters, sync)
    rows = []
    for name, group, i, o, splits in cases:

        def a2a(group=group, i=i, o=o, splits=splits):  # noqa: ANN001, ANN202 - bound per case
            s = [chunk] * world if splits else None
            return dist.all_to_all_single(o, i, s, s, group=group, async_op=True)

        o.zero_()
        t_a2a = _timeit(lambda: a2a().wait(), args.iters, sync)
        correct = bool(torch.equal(o.cpu(), expected))

        def both() -> None:
            work = a2a()
            mm()
            work.wait()

        t_both = _timeit(both, args.iters, sync)
        row = {
            "case": name,
            "a2a_ms": t_a2a,
            "mm_ms": t_mm,
            "both_ms": t_both,
            "added_ms": t_both - t_mm,
            "correct": correct,
        }
        rows.append(row)
        sys.stdout.write(
            f"[rank {rank}] {name:24s} a2a {t_a2a:.3f} ms | {args.matmuls} matmuls {t_mm:.3f} | both "
            f"{t_both:.3f} (+{t_both - t_mm:.3f}) | correct {correct}\n"
        )  # one write: lines stay whole
        sys.stdout.flush()
    if args.out and rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "nccl_all_to_all.json"), "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return rows


if __name__ == "__main__":
    main()
