"""Benchmarks: step speed against stock TorchRec (``throughput``, ``pipeline_ab``), ``train.py`` against the step
benchmark (``e2e``), the loader (``loader``), preprocessing (``preprocess``) and checkpoint overhead
(``checkpoint_overhead``). Run each from the repository root as a module, e.g.
``torchrun --standalone --nproc_per_node 1 -m bench.throughput --variants stock fast``; figures and commands
are in docs/performance.md."""
