"""DLRM-v2 (DLRM with a DCNv2 cross interaction) trainer on PyTorch + TorchRec + FBGEMM_GPU.

Entry point: ``python train.py`` (see README.md). The package is split by concern:
``config`` (typed Hydra schemas), ``model`` (DLRM_DCN / DLRM builders), ``data`` (synthetic and Criteo TSV
sources, multi-hot expansion, KJT batches), ``dist`` (process group and device), ``sharding`` (planner + DMP),
``metrics`` (global AUC / logloss), ``logging`` (rank-aware sinks) and ``trainer`` (the training loop).
"""

__version__ = "0.1.0"
