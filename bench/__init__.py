"""Benchmarks of the trainer against stock TorchRec. Run each from the repository root as a module, e.g.
``torchrun --standalone --nproc_per_node 1 -m bench.throughput --variants stock fast``; figures and commands
are in docs/performance.md."""
