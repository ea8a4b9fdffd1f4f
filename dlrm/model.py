"""Model builders: TorchRec's ``DLRM_DCN`` (DLRM-v2) or ``DLRM`` (dot interaction) over a multi-hot
``EmbeddingBagCollection``, wrapped in ``DLRMTrain`` (BCE-with-logits loss).

Tables are created on the meta device so that DMP materialises each shard only on its owning rank (a 104.5 GB
MLPerf model never exists whole on one host); ``dense_device`` holds the MLPs.
"""

from __future__ import annotations

import logging
from typing import List, Optional, Tuple

import torch
from torchrec import EmbeddingBagCollection
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain, SparseArch
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig

from dlrm.config import NUM_DENSE_FEATURES, ModelConfig, PerfConfig

log = logging.getLogger(__name__)

# Criteo's categorical columns C1..C26; one KJT key and one table ("t_cat_i") per feature, as torchrec's
# Criteo dataset names them.
FEATURE_NAMES: List[str] = [f"cat_{i}" for i in range(26)]


DATA_TYPES = {"fp32": DataType.FP32, "fp16": DataType.FP16, "bf16": DataType.BF16}
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def table_configs(cfg: ModelConfig, embedding_dtype: str = "fp32") -> List[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per sparse feature: rows from ``cfg.table_rows``, sum pooling, weights of
    ``embedding_dtype`` (``perf.embedding_dtype``: fp32, fp16 or bf16)."""
    return [
        EmbeddingBagConfig(
            name=f"t_{name}",
            embedding_dim=cfg.embedding_dim,
            num_embeddings=rows,
            feature_names=[name],
            data_type=DATA_TYPES[embedding_dtype],
        )
        for name, rows in zip(FEATURE_NAMES, cfg.table_rows)
    ]


def _fx_tracing() -> bool:
    """True inside ``torch.fx`` symbolic tracing (TorchRec's pipeline traces the model once)."""
    fx = torch.fx._symbolic_trace
    return getattr(fx, "is_fx_symbolic_tracing", fx.is_fx_tracing)()


class ZeroCopySparseArch(SparseArch):
    """TorchRec's ``SparseArch`` without its copy of the pooled embeddings.

    ``SparseArch.forward`` splits the ``KeyedTensor`` of pooled embeddings into one tensor per feature and
    concatenates them again in feature order: a full copy of ``[B, F * D]`` forward and another in backward
    (0.5 ms per step at batch 32768 on an H200: docs/benchmarks.md). When the ``KeyedTensor``'s keys are already
    the features in order, all of dim ``D`` (the EmbeddingBagCollection's and its sharded version's output), its
    values are that tensor, so this returns a view. Any other key order or dim takes TorchRec's path. While
    TorchRec's pipeline fx-traces the model (inputs are proxies, so the keys cannot be compared), TorchRec's path
    is traced too.

    Returns:
        ``[B, F, D]`` pooled embeddings (the TBE output dtype: ``perf.embedding_output_dtype``).
    """

    def forward(self, features):  # noqa: ANN001, ANN201 - KeyedJaggedTensor -> Tensor, as SparseArch
        if _fx_tracing():
            return super().forward(features)
        kt = self.embedding_bag_collection(features)
        view = kt.keys() == self.sparse_feature_names and all(d == self.D for d in kt.length_per_key())
        if not getattr(self, "_path_logged", False):
            self._path_logged = True
            log.info("sparse arch: pooled embeddings used %s", "in place (no copy)" if view else
                     f"after a copy into feature order (output keys {kt.keys()[:4]}...)")
        if view:
            return kt.values().reshape(-1, self.F, self.D)
        sparse = kt.to_dict()
        return torch.cat([sparse[n] for n in self.sparse_feature_names], dim=1).reshape(-1, self.F, self.D)


class DLRMTrainAutocast(DLRMTrain):
    """``DLRMTrain`` with the dense side optionally under ``torch.autocast`` (``perf.autocast``).

    The whole ``DLRM`` forward runs in the autocast region; only the dense arch, interaction and over arch have
    autocast-eligible ops (the TBE lookup and the KJT all-to-alls are custom ops autocast leaves alone). Logits
    come back as float32 and the BCE loss is computed in float32.

    Args:
        model: the ``DLRM`` / ``DLRM_DCN`` network.
        autocast_dtype: ``torch.bfloat16``, ``torch.float16`` or None (off).
        device_type: ``"cuda"`` or ``"cpu"``: where the dense side runs (given here rather than read off the
            batch because TorchRec's pipeline fx-traces this forward with proxies as inputs).
    """

    def __init__(self, model: DLRM, autocast_dtype: Optional[torch.dtype] = None, device_type: str = "cpu") -> None:
        super().__init__(model)
        self.autocast_dtype = autocast_dtype
        self.device_type = device_type

    def logits(self, dense: torch.Tensor, sparse) -> torch.Tensor:  # noqa: ANN001 - KeyedJaggedTensor
        """float32 logits of shape ``[batch]``."""
        if self.autocast_dtype is None:
            return self.model(dense, sparse).squeeze(-1)
        with torch.autocast(self.device_type, dtype=self.autocast_dtype):
            out = self.model(dense, sparse)
        return out.squeeze(-1).float()

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
        logits = self.logits(batch.dense_features, batch.sparse_features)
        loss = self.loss_fn(logits, batch.labels.float())
        return loss, (loss.detach(), logits.detach(), batch.labels.detach())


class DLRMTrainSkipNonFinite(DLRMTrainAutocast):
    """``DLRMTrain`` that drops batches with non-finite inputs without a host sync (``trainer.on_nonfinite=
    skip_batch``).

    A batch whose dense features or labels hold NaN/inf, or whose labels are not 0/1, has its loss multiplied by
    0 on the device; its inputs are zeroed first so that no NaN reaches the gradients. Zero gradients leave
    Adagrad's weights and accumulators (dense and fused TBE alike) unchanged, so the batch is skipped on this
    rank while every rank still runs the same collectives.

    Returns ``(loss, (loss, logits, labels, ok))`` with ``ok`` a bool scalar tensor (False: batch skipped).
    """

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
        dense, labels = batch.dense_features, batch.labels.float()
        ok = torch.isfinite(dense).all() & ((labels == 0) | (labels == 1)).all()
        dense = torch.where(torch.isfinite(dense), dense, torch.zeros_like(dense))
        labels = torch.where((labels == 0) | (labels == 1), labels, torch.zeros_like(labels))
        logits = self.logits(dense, batch.sparse_features)
        loss = self.loss_fn(logits, labels) * ok.to(logits.dtype)
        return loss, (loss.detach(), logits.detach(), labels.detach(), ok.detach())


def build_model(cfg: ModelConfig, dense_device: Optional[torch.device] = None,
                table_device: torch.device = torch.device("meta"), skip_nonfinite: bool = False,
                perf: Optional[PerfConfig] = None) -> DLRMTrain:
    """Build the unsharded model.

    Args:
        cfg: model config.
        dense_device: device of the MLP / interaction parameters (default CPU).
        table_device: device of the embedding tables; ``meta`` (default) for DMP, ``cpu`` for an unsharded
            reference model in tests.
        skip_nonfinite: wrap in :class:`DLRMTrainSkipNonFinite` instead of :class:`DLRMTrainAutocast`.
        perf: ``perf.embedding_dtype`` (table weights) and ``perf.autocast`` (dense side); default fp32, no
            autocast. ``perf.compile`` is applied after sharding (:func:`compile_dense`).

    Returns:
        ``DLRMTrain`` whose ``forward(batch)`` returns ``(loss, (loss, logits, labels))``; logits are float32
        of shape ``[batch]``.
    """
    perf = perf or PerfConfig()
    ebc = EmbeddingBagCollection(tables=table_configs(cfg, perf.embedding_dtype), device=table_device)
    if cfg.interaction == "dcn":
        net: DLRM = DLRM_DCN(
            embedding_bag_collection=ebc,
            dense_in_features=NUM_DENSE_FEATURES,
            dense_arch_layer_sizes=list(cfg.dense_arch_layer_sizes),
            over_arch_layer_sizes=list(cfg.over_arch_layer_sizes),
            dcn_num_layers=cfg.dcn_num_layers,
            dcn_low_rank_dim=cfg.dcn_low_rank_dim,
            dense_device=dense_device,
        )
    else:
        net = DLRM(
            embedding_bag_collection=ebc,
            dense_in_features=NUM_DENSE_FEATURES,
            dense_arch_layer_sizes=list(cfg.dense_arch_layer_sizes),
            over_arch_layer_sizes=list(cfg.over_arch_layer_sizes),
            dense_device=dense_device,
        )
    net.sparse_arch = ZeroCopySparseArch(ebc)  # same submodule names: plans and checkpoints are unchanged
    cls = DLRMTrainSkipNonFinite if skip_nonfinite else DLRMTrainAutocast
    amp = None if perf.autocast == "none" else TORCH_DTYPES[perf.autocast]
    return cls(net, amp, (dense_device or torch.device("cpu")).type)


DENSE_MODULES = ("dense_arch", "inter_arch", "over_arch")


def compile_dense(train_model: torch.nn.Module, mode: str = "default") -> List[str]:
    """``torch.compile`` the dense arch, the interaction and the over arch of ``train_model`` in place
    (``perf.compile``).

    ``nn.Module.compile`` keeps parameter names, so DMP, DDP, the optimizers and checkpoints see the same
    module. TorchRec's pipelines fx-trace the model once to find the sparse arch's inputs; dynamo would refuse
    being traced, so ``torch._dynamo.config.error_on_nested_fx_trace`` is turned off and that trace runs the
    uncompiled code (the torch.compile documentation's setting for this case).

    Args:
        train_model: the unwrapped ``DLRMTrain`` (``dmp.module``), or the plain model.
        mode: ``torch.compile`` mode.

    Returns:
        The compiled submodules' names, e.g. ``["model.dense_arch", "model.inter_arch", "model.over_arch"]``.
    """
    import torch._dynamo

    torch._dynamo.config.error_on_nested_fx_trace = False
    net = train_model.model
    done = []
    for name in DENSE_MODULES:
        mod = getattr(net, name, None)
        if mod is not None:
            mod.compile(mode=None if mode == "default" else mode)
            done.append(f"model.{name}")
    log.info("torch.compile (mode %s): %s", mode, ", ".join(done))
    return done
