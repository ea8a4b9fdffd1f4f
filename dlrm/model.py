"""Model builders: TorchRec's ``DLRM_DCN`` (DLRM-v2) or ``DLRM`` (dot interaction) over a multi-hot
``EmbeddingBagCollection``, wrapped in ``DLRMTrain`` (BCE-with-logits loss).

Tables are created on the meta device so that DMP materialises each shard only on its owning rank (a 104.5 GB
MLPerf model never exists whole on one host); ``dense_device`` holds the MLPs.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, List, Optional, Tuple, Union

import torch
from torchrec import EmbeddingBagCollection
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import DLRM, DLRM_DCN, DenseArch, DLRMTrain, SparseArch
from torchrec.modules.crossnet import LowRankCrossNet
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm import torchrec_compat as compat
from dlrm.batch_check import BatchError as BatchError  # where dlrm.graphed and callers import it
from dlrm.batch_check import check_batch
from dlrm.config import NUM_DENSE_FEATURES, ModelConfig, PerfConfig
from dlrm.errors import ConfigError
from dlrm.output_dist import RANK_BLOCKS_ATTR, accepting_rank_blocks

log = logging.getLogger(__name__)

# Criteo's categorical columns C1..C26; one KJT key and one table ("t_cat_i") per feature, as torchrec's
# Criteo dataset names them.
FEATURE_NAMES: List[str] = [f"cat_{i}" for i in range(26)]


META = torch.device("meta")  # where the tables are built: DMP materialises each shard on its owner
DATA_TYPES = {"fp32": DataType.FP32, "fp16": DataType.FP16}
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def table_configs(cfg: ModelConfig, embedding_dtype: str = "fp32") -> List[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per sparse feature: rows from ``cfg.table_rows``, sum pooling, weights of
    ``embedding_dtype`` (``perf.embedding_dtype``: fp32 or fp16)."""
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


FeatureOrder = Tuple[torch.Tensor, torch.Tensor]  # (pos, inv): int64 [F] each, on the embeddings' device


class _ToFeatureOrder(torch.autograd.Function):
    """``values[:, pos]`` with the backward as a gather too (``grad[:, inv]``), not autograd's default
    ``index_add`` into zeros: under torch.compile a scatter of slices is slow, a gather fuses into the kernels
    around it."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inv)
        return values.index_select(1, pos)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None]:
        (inv,) = ctx.saved_tensors
        return grad.index_select(1, inv), None, None


BlockOrder = Tuple[torch.Tensor, torch.Tensor, int]  # (rows, inv_rows, grad_divisor): see _FromRankBlocks
# how pooled embeddings arrive (to_feature_order); None: already in feature order
Order = Optional[Union[FeatureOrder, BlockOrder]]


class _FromRankBlocks(torch.autograd.Function):
    """Pooled embeddings handed over in rank-block layout (``perf.lean_output_dist``:
    :class:`dlrm.output_dist.RankBlocks`) -> ``[B, F, D]`` in feature order, by one gather of ``D``-wide rows of
    the receive buffer (``rows``: int64 ``[B * F]``, sample-major); backward: the gradient back in rank-block
    layout by the inverse gather (``inv_rows``), divided by ``grad_divisor`` as TorchRec's ``GRADIENT_DIVISION``
    does (same values: the division is the same op on the same values). Gathers both ways, for the reason
    :class:`_ToFeatureOrder` gives; under torch.compile they fuse into the kernels around them, which replaces the
    output dist's ``cat`` forward and its regrouping pass backward."""

    @staticmethod
    def forward(
        ctx: Any,
        values: torch.Tensor,
        rows: torch.Tensor,
        inv_rows: torch.Tensor,  # type: ignore[override]
        grad_divisor: int,
    ) -> torch.Tensor:
        ctx.save_for_backward(inv_rows)
        ctx.shape, ctx.grad_divisor = values.shape, grad_divisor
        b = values.size(0)
        d = values.numel() // rows.numel()
        return values.reshape(-1, d).index_select(0, rows).view(b, rows.numel() // b, d)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None, None]:
        (inv_rows,) = ctx.saved_tensors
        g = grad.reshape(-1, grad.size(-1)).index_select(0, inv_rows).view(ctx.shape)
        return (g / ctx.grad_divisor if ctx.grad_divisor != 1 else g), None, None, None


def to_feature_order(values: torch.Tensor, order: Order) -> torch.Tensor:
    """Pooled embeddings in a sharded output's layout -> ``[B, F, D]`` in feature order (``order`` from
    :meth:`ZeroCopySparseArch.forward` with ``in_key_order=True``): ``values`` ``[B, F, D]`` in key order with
    ``order`` ``(pos, inv)``, or ``[B, F * D]`` in rank-block layout with ``order`` ``(rows, inv_rows,
    grad_divisor)`` (:class:`_FromRankBlocks`); None: already in feature order, returned as is."""
    if order is None:
        return values
    if len(order) == 3:
        return _FromRankBlocks.apply(values, *order)
    return _ToFeatureOrder.apply(values, order[0], order[1])


class ZeroCopySparseArch(SparseArch):
    """TorchRec's ``SparseArch`` without its copy of the pooled embeddings.

    ``SparseArch.forward`` splits the ``KeyedTensor`` of pooled embeddings into one tensor per feature and
    concatenates them again in feature order: a full copy of ``[B, F * D]`` forward and another in backward. When
    the ``KeyedTensor``'s keys are the features, each of dim ``D`` (the EmbeddingBagCollection's and its sharded
    version's output), its values are that tensor: in feature order it is returned as a view. In another order (a
    plan over several ranks returns the features rank by rank) ``forward`` reorders them with one gather, or, with
    ``in_key_order=True``, returns the view and the order, so that :class:`DLRMTrainAutocast` can reorder inside its
    (compiled) dense step, where the gather fuses into the interaction's concatenation. Keys of any other dim take
    TorchRec's path. While TorchRec's pipeline fx-traces the model (inputs are proxies, so the keys cannot be
    compared), TorchRec's path is traced too.
    """

    def forward(  # type: ignore[override]
        self, features: KeyedJaggedTensor, in_key_order: bool = False
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, Order]]:
        """Look up ``features`` (a KJT of the model's features, batch ``B``) and pool them.

        Returns:
            ``[B, F, D]`` pooled embeddings in feature order, in the TBE output dtype
            (``perf.embedding_output_dtype``). With ``in_key_order=True``, ``(values, order)`` for
            :func:`to_feature_order`: ``values`` ``[B, F, D]`` in the ``KeyedTensor``'s key order with ``order``
            None (already feature order) or ``(pos, inv)``, or ``[B, F * D]`` in rank-block layout
            (``perf.lean_output_dist``) with ``order`` ``(rows, inv_rows, grad_divisor)``.

        Raises:
            RuntimeError: rank blocks that do not hold whole features of dim ``D`` (``perf.lean_output_dist`` on a
                plan other than table_wise).
        """
        if compat.is_fx_tracing():
            out = super().forward(features)
            return (out, None) if in_key_order else out
        with accepting_rank_blocks():  # the output dist waits in here (a lazy awaitable): this forward reads them
            kt = self.embedding_bag_collection(features)
            keys = kt.keys()
        same_dims = all(d == self.D for d in kt.length_per_key())
        blocks = getattr(kt.values(), RANK_BLOCKS_ATTR, None)
        if blocks is not None:
            order = self._block_order(tuple(keys), same_dims, blocks, kt.values())
            how = "gathered from the output dist's receive buffer (rank blocks) " + (
                "inside the dense step" if in_key_order else "by one gather"
            )
            values = kt.values()
        elif same_dims and keys == self.sparse_feature_names:
            values, order, how = kt.values().reshape(-1, self.F, self.D), None, "in place (no copy)"
        elif same_dims and sorted(keys) == sorted(self.sparse_feature_names):
            values, order = kt.values().reshape(-1, self.F, self.D), self._order(tuple(keys), kt.values().device)
            how = f"in the plan's key order ({', '.join(keys[:3])}, ...), reordered " + (
                "inside the dense step" if in_key_order else "by one gather"
            )
        else:
            sparse = kt.to_dict()
            values = torch.cat([sparse[n] for n in self.sparse_feature_names], dim=1).reshape(-1, self.F, self.D)
            order, how = None, f"after TorchRec's copy into feature order (output keys {keys[:4]}...)"
        if not getattr(self, "_path_logged", False):
            self._path_logged = True
            log.info("sparse arch: pooled embeddings used %s", how)
        return (values, order) if in_key_order else to_feature_order(values, order)

    def _block_order(self, keys: Tuple[str, ...], same_dims: bool, blocks: Any, values: torch.Tensor) -> BlockOrder:
        """``(rows, inv_rows, grad_divisor)`` for :class:`_FromRankBlocks`; cached per layout and batch size.

        Raises:
            RuntimeError: the keys are not the model's features, each of dim ``D``, whole within the rank blocks
                (only table_wise plans hand over rank blocks: :func:`dlrm.output_dist.use_lean_output_dist`).
        """
        b, dims = values.size(0), tuple(blocks.dims)
        per_rank = [d // self.D for d in dims]
        if not (
            same_dims
            and sorted(keys) == sorted(self.sparse_feature_names)
            and all(d % self.D == 0 for d in dims)
            and sum(per_rank) == len(keys)
        ):
            raise RuntimeError(
                f"perf.lean_output_dist: pooled embeddings arrived in rank blocks of dims {list(dims)} with keys "
                f"{list(keys)[:4]}...; the sparse arch can gather them only when every key is one of the model's "
                f"{self.F} features of dim {self.D} and each rank holds whole features (a table_wise plan); set "
                "perf.lean_output_dist=false or use a table_wise plan"
            )
        cache = self.__dict__.setdefault("_block_orders", {})
        key = (keys, dims, b, values.device)
        if key not in cache:
            rank_of, first_row = [], []  # per key position: its rank, and its first row in the receive buffer
            row = 0
            for r, n in enumerate(per_rank):
                rank_of += [r] * n
                first_row += [row + k for k in range(n)]
                row += b * n
            pos = [keys.index(n) for n in self.sparse_feature_names]
            sample = torch.arange(b, dtype=torch.long)[:, None]
            rows = (
                torch.tensor([first_row[p] for p in pos])[None, :]
                + sample * torch.tensor([per_rank[rank_of[p]] for p in pos])[None, :]
            ).reshape(-1)
            inv_rows = torch.empty_like(rows)
            inv_rows[rows] = torch.arange(rows.numel())
            cache[key] = (rows.to(values.device), inv_rows.to(values.device), int(blocks.grad_divisor))
        return cache[key]

    def _order(self, keys: Tuple[str, ...], device: torch.device) -> FeatureOrder:
        cache = self.__dict__.setdefault("_orders", {})
        if (keys, device) not in cache:
            pos = torch.tensor([keys.index(n) for n in self.sparse_feature_names], dtype=torch.long)
            inv = torch.empty_like(pos)
            inv[pos] = torch.arange(len(pos))
            cache[(keys, device)] = (pos.to(device), inv.to(device))
        return cache[(keys, device)]


class AutocastLowRankCrossNet(LowRankCrossNet):
    """TorchRec's ``LowRankCrossNet`` (DCNv2 low-rank cross layers, ``x_{l+1} = x_0 * (W (V x_l) + b) + x_l``)
    whose residual stream stays in the dtype of its matrix products (``perf.dcn_residual_dtype=autocast``).

    Under ``torch.autocast`` TorchRec's forward computes ``W (V x_l)`` in bf16 but adds the fp32 bias, which
    promotes ``x_{l+1}`` and every later layer, their gradients and the elementwise kernels around them to fp32:
    ``[B, 3456]`` fp32 tensors (453 MB each at batch 32768 for MLPerf DLRM-v2) read and written several times per
    layer, forward and backward. Here the bias and ``x_0`` are cast to the products' dtype, so those tensors are
    bf16 (half the bytes). The parameters are TorchRec's (same names, fp32, same init): the class only replaces
    ``forward`` (:func:`build_model` swaps the class of the ``LowRankCrossNet`` that ``DLRM_DCN`` builds). Without
    autocast (fp32 inputs) every cast is a no-op and the values equal TorchRec's bit for bit.

    Shapes: ``input`` ``[B, in_features]`` (any float dtype) -> ``[B, in_features]`` in the products' dtype
    (the autocast dtype, or the input's without autocast).
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """``x_L`` after the ``num_layers`` cross layers: ``input`` ``[B, in_features]`` -> ``[B, in_features]`` in
        the dtype of the first layer's products: the autocast dtype under autocast, else the parameters' (fp32),
        which ``input`` must then have."""
        x_0 = input
        x_l = x_0
        for layer in range(len(self.W_kernels)):
            x_l_v = torch.nn.functional.linear(x_l, self.V_kernels[layer])
            x_l_w = torch.nn.functional.linear(x_l_v, self.W_kernels[layer])
            if layer == 0:  # the products' dtype is known from here (a proxy's attribute under TorchRec's fx trace)
                x_0 = x_l = x_0.to(x_l_w.dtype)
            x_l = x_0 * (x_l_w + self.bias[layer].to(x_l_w.dtype)) + x_l
        return x_l


class DLRMTrainAutocast(DLRMTrain):
    """``DLRMTrain`` with the dense side optionally under ``torch.autocast`` (``perf.autocast``) and compiled as one
    graph (``perf.compile``, :func:`dlrm.perf.compile_dense`).

    ``forward`` runs the sparse arch (the sharded lookup: TorchRec's pipeline and DMP own it), then
    :meth:`dense_step` (which first puts pooled embeddings that arrive in the plan's key order into feature order,
    so under ``perf.compile`` that reorder is part of the compiled graph): the dense arch, the interaction and the
    over arch in the autocast region, and the BCE loss in float32 from float32 logits. The TBE lookup and the KJT
    all-to-alls stay outside autocast and outside the compiled graph.

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
        self.compiled_step: Optional[Callable[..., Tuple[torch.Tensor, ...]]] = None  # set by compile_dense
        self.compiled_parts: List[str] = []

    def dense_logits(self, dense: torch.Tensor, embedded: torch.Tensor, order: Order = None) -> torch.Tensor:
        """float32 logits ``[B]`` from dense features ``[B, 13]`` and pooled embeddings ``[B, F, D]`` (in feature
        order, or in another order or layout given by ``order``: :func:`to_feature_order`)."""
        net = self.model
        embedded = to_feature_order(embedded, order)
        amp = (
            torch.autocast(self.device_type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with amp:
            out = net.over_arch(net.inter_arch(dense_features=net.dense_arch(dense), sparse_features=embedded))
        return out.squeeze(-1).float()

    def dense_step(
        self, dense: torch.Tensor, embedded: torch.Tensor, labels: torch.Tensor, order: Order = None
    ) -> Tuple[torch.Tensor, ...]:
        """``(loss, logits, labels)``: everything after the lookup; the part :func:`dlrm.perf.compile_dense`
        compiles."""
        logits = self.dense_logits(dense, embedded, order)
        return self.loss_fn(logits, labels.float()), logits, labels

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
        """``(loss, (loss, logits, labels))`` for ``batch``, checked first by :func:`check_batch` (sizes, shapes
        and keys always; lengths' and offsets' values where they are on the CPU; nothing while TorchRec's pipeline
        fx-traces this forward with proxies).

        Raises:
            BatchError: ``batch`` does not fit the model.
        """
        arch = self.model.sparse_arch
        if not compat.is_fx_tracing():
            check_batch(batch, arch.sparse_feature_names)
        if isinstance(arch, ZeroCopySparseArch):
            embedded, order = arch(batch.sparse_features, in_key_order=True)
        else:
            embedded, order = arch(batch.sparse_features), None
        out = (self.compiled_step or self.dense_step)(batch.dense_features, embedded, batch.labels, order)
        return out[0], tuple(t.detach() for t in out)


class DLRMTrainSkipNonFinite(DLRMTrainAutocast):
    """``DLRMTrain`` that drops batches with non-finite inputs without a host sync (``trainer.on_nonfinite=
    skip_batch``).

    A batch whose dense features or labels hold NaN/inf, or whose labels are not 0/1, has its loss multiplied by
    0 on the device; its inputs are zeroed first so that no NaN reaches the gradients. Zero gradients leave
    Adagrad's weights and accumulators (dense and fused TBE alike) unchanged, so the batch is skipped on this
    rank while every rank still runs the same collectives.

    Returns ``(loss, (loss, logits, labels, ok))`` with ``ok`` a bool scalar tensor (False: batch skipped).
    """

    def dense_step(
        self, dense: torch.Tensor, embedded: torch.Tensor, labels: torch.Tensor, order: Order = None
    ) -> Tuple[torch.Tensor, ...]:
        """``(loss, logits, labels, ok)``: ``ok`` a bool scalar, true when every dense feature is finite and every
        label 0 or 1; non-finite dense features and other labels are replaced by 0 (labels float32 ``[B]``), and
        the loss is multiplied by ``ok``."""
        labels = labels.float()
        ok = torch.isfinite(dense).all() & ((labels == 0) | (labels == 1)).all()
        dense = torch.where(torch.isfinite(dense), dense, torch.zeros_like(dense))
        labels = torch.where((labels == 0) | (labels == 1), labels, torch.zeros_like(labels))
        logits = self.dense_logits(dense, embedded, order)
        loss = self.loss_fn(logits, labels) * ok.to(logits.dtype)
        return loss, logits, labels, ok


class BucketedDenseArch(DenseArch):
    """TorchRec's ``DenseArch`` (the bottom MLP) fed each dense feature and a one-hot bucket of it
    (``model.dense_buckets``, ``model.dense_bucket_width``), so its first layer can learn a step function of each
    feature beside its linear weight.

    Shapes: ``features`` ``[B, in_features]`` float (the ``log(x + 1)`` values) -> :meth:`buckets` ``[B,
    in_features * (1 + num_buckets)]`` of the same dtype -> the MLP -> ``[B, layer_sizes[-1]]``. Bucket
    ``clamp(floor(x / width), 0, num_buckets - 1)``; a NaN feature sets no bucket. Elementwise tensor ops only (no
    host sync, no data-dependent shape): it compiles into ``perf.compile``'s graph, and under ``perf.autocast`` the
    bucketing stays in the features' dtype until the first matmul. The parameters are ``DenseArch``'s
    (``dense_arch.model...``, the same names as without buckets); the first layer's ``in_features`` grows.

    ``experiment=criteo_sample`` uses 16 buckets of width 1.0 (its training rows have ``log(x + 1)`` at most 14.1);
    what they are worth there is in docs/data.md.

    Raises:
        ValueError: ``num_buckets < 1`` or ``width <= 0`` (:class:`dlrm.config.ModelConfig` refuses both first).
    """

    def __init__(
        self,
        in_features: int,
        layer_sizes: List[int],
        num_buckets: int,
        width: float = 1.0,
        device: Optional[torch.device] = None,
    ) -> None:
        if num_buckets < 1 or not width > 0:
            raise ValueError(f"BucketedDenseArch needs num_buckets >= 1 and width > 0, got {num_buckets}, {width}")
        super().__init__(in_features * (1 + num_buckets), layer_sizes, device)
        self.num_buckets, self.width = num_buckets, width

    def buckets(self, features: torch.Tensor) -> torch.Tensor:
        """``[B, F]`` -> ``[B, F * (1 + num_buckets)]``: the features, then feature ``i``'s one-hot bucket in columns
        ``F + i * num_buckets ... F + (i + 1) * num_buckets - 1`` (1.0 at the bucket, 0.0 elsewhere)."""
        b = torch.floor(features / self.width).clamp(0, self.num_buckets - 1)
        ids = torch.arange(self.num_buckets, dtype=features.dtype, device=features.device)
        return torch.cat([features, (b.unsqueeze(-1) == ids).to(features.dtype).flatten(1)], dim=1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[B, in_features]`` -> ``[B, layer_sizes[-1]]``: TorchRec's MLP (ReLU after every layer, as
        ``DenseArch``) over :meth:`buckets`."""
        return self.model(self.buckets(features))


def torchrec_dlrm(cfg: ModelConfig, ebc: EmbeddingBagCollection, dense_device: Optional[torch.device]) -> DLRM:
    """TorchRec's network for ``cfg`` as TorchRec builds it: ``DLRM_DCN`` (``model.interaction=dcn``) or ``DLRM``
    (``dot``) over ``ebc``, dense parameters on ``dense_device``. :func:`build_model` changes parts of it; the
    stock baseline of ``bench/`` uses it as it is."""
    if cfg.interaction == "dcn":
        return DLRM_DCN(
            embedding_bag_collection=ebc,
            dense_in_features=NUM_DENSE_FEATURES,
            dense_arch_layer_sizes=list(cfg.dense_arch_layer_sizes),
            over_arch_layer_sizes=list(cfg.over_arch_layer_sizes),
            dcn_num_layers=cfg.dcn_num_layers,
            dcn_low_rank_dim=cfg.dcn_low_rank_dim,
            dense_device=dense_device,
        )
    return DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=NUM_DENSE_FEATURES,
        dense_arch_layer_sizes=list(cfg.dense_arch_layer_sizes),
        over_arch_layer_sizes=list(cfg.over_arch_layer_sizes),
        dense_device=dense_device,
    )


def build_model(
    cfg: ModelConfig,
    dense_device: Optional[torch.device] = None,
    table_device: torch.device = META,
    skip_nonfinite: bool = False,
    perf: Optional[PerfConfig] = None,
) -> DLRMTrain:
    """Build the unsharded model.

    Args:
        cfg: model config.
        dense_device: device of the MLP / interaction parameters (default CPU).
        table_device: device of the embedding tables; ``meta`` (default) for DMP, ``cpu`` for an unsharded
            reference model in tests.
        skip_nonfinite: wrap in :class:`DLRMTrainSkipNonFinite` instead of :class:`DLRMTrainAutocast`.
        perf: ``perf.embedding_dtype`` (table weights), ``perf.autocast`` (dense side) and
            ``perf.dcn_residual_dtype`` (:class:`AutocastLowRankCrossNet`); default fp32, no autocast.
            ``perf.compile`` is applied after sharding (:func:`dlrm.perf.compile_dense`).

    Returns:
        ``DLRMTrain`` whose ``forward(batch)`` returns ``(loss, (loss, logits, labels))``; logits are float32
        of shape ``[batch]``.

    Raises:
        ConfigError: ``perf.dcn_residual_dtype=autocast`` on a model without TorchRec's ``LowRankCrossNet``
            (``model.interaction=dot``; :func:`dlrm.config.to_config` refuses that combination first).
    """
    perf = perf or PerfConfig()
    ebc = EmbeddingBagCollection(tables=table_configs(cfg, perf.embedding_dtype), device=table_device)
    net = torchrec_dlrm(cfg, ebc, dense_device)
    if cfg.dense_buckets:  # built after the network, so the other modules start as without buckets for a seed
        net.dense_arch = BucketedDenseArch(
            NUM_DENSE_FEATURES,
            list(cfg.dense_arch_layer_sizes),
            cfg.dense_buckets,
            cfg.dense_bucket_width,
            dense_device,
        )
    net.sparse_arch = ZeroCopySparseArch(ebc)  # same submodule names: plans and checkpoints are unchanged
    if perf.dcn_residual_dtype == "autocast":
        crossnet = getattr(net.inter_arch, "crossnet", None)
        if type(crossnet) is not LowRankCrossNet:
            raise ConfigError(
                f"config key `perf.dcn_residual_dtype`: autocast replaces TorchRec's LowRankCrossNet, "
                f"and this model's cross network is {type(crossnet).__name__}; use "
                f"perf.dcn_residual_dtype=fp32"
            )
        crossnet.__class__ = AutocastLowRankCrossNet  # forward only: no state of its own, same parameters
    cls = DLRMTrainSkipNonFinite if skip_nonfinite else DLRMTrainAutocast
    amp = None if perf.autocast == "none" else TORCH_DTYPES[perf.autocast]
    return cls(net, amp, (dense_device or torch.device("cpu")).type)
