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

import logging

__version__ = "0.1.0"


class _NoFbgemmTableNotice(logging.Filter):
    """Drops fbgemm_gpu's import-time notice that its own compatibility table has no row for its version (printed
    once per library it loads, 14 times on the GPU stack): the pairs this trainer runs on are checked by
    :mod:`dlrm.torchrec_compat` instead. Its warning for a known-incompatible pair still prints."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "_fbgemm_torch_compat_table has no entry for" not in str(record.msg)


# on the root logger, before anything imports fbgemm_gpu (it logs through logging.warning at import)
if not any(isinstance(f, _NoFbgemmTableNotice) for f in logging.getLogger().filters):
    logging.getLogger().addFilter(_NoFbgemmTableNotice())
