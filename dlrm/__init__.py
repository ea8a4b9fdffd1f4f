"""DLRM-v2 (DLRM with a DCNv2 cross interaction) trainer on PyTorch + TorchRec + FBGEMM_GPU.

Entry point: ``python train.py`` (``cli``; see README.md). The package is split by concern:
``config`` (typed Hydra schemas), ``model`` (DLRM_DCN / DLRM builders), ``data`` (synthetic, Criteo TSV and
binary sources, multi-hot expansion, KJT batches), ``dist`` (process group and device), ``sharding`` (planner,
plans, DMP), ``offload`` (host-memory tables), ``perf`` / ``output_dist`` / ``comms`` (the ``perf.*`` levers),
``pipeline`` / ``graphed`` (training pipelines), ``schedule`` (learning rate), ``metrics`` (global AUC / logloss),
``loggers`` (rank-aware sinks), ``checkpoint`` / ``export`` (DCP checkpoints), ``plan`` / ``traffic`` /
``estimate`` (planning tools), ``torchrun`` (a launcher whose exit status tells preempted from failed),
``mlperf_log``, ``profiling``, ``report``, ``torchrec_compat`` (the one module that uses TorchRec and torch
internals) and ``trainer`` (the training loop).
"""

__version__ = "0.1.0"
