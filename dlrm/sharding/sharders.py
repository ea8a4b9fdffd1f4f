"""The sharders DMP and the planner use: TorchRec's defaults, with the EmbeddingBagCollection one allowing row_wise,
table_row_wise and grid_shard on CPU, and the TBE fused params from ``perf.*``."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import ShardingType


class EmbeddingBagSharder(EmbeddingBagCollectionSharder):
    """TorchRec's EmbeddingBagCollection sharder, plus row_wise, table_row_wise and grid_shard on CPU.

    TorchRec lists those three only for CUDA; on CPU with gloo they train exactly like the unsharded model
    (tests/test_sharding_equivalence.py checks every type against an unsharded reference).
    """

    def sharding_types(self, compute_device_type: str) -> List[str]:
        """TorchRec's sharding types for ``compute_device_type`` (``cuda``, ``cpu``, ...), plus row_wise,
        table_row_wise and grid_shard on ``cpu``."""
        types = list(super().sharding_types(compute_device_type))
        if compute_device_type == "cpu":
            for t in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD):
                if t.value not in types:
                    types.append(t.value)
        return types


def sharders(fused_params: Optional[Dict[str, Any]] = None) -> List[Any]:
    """TorchRec's default sharders with the EmbeddingBagCollection one replaced by :class:`EmbeddingBagSharder`
    built with ``fused_params`` (TBE options such as ``output_dtype``: :func:`fused_params_of`)."""
    return [
        EmbeddingBagSharder(fused_params=fused_params) if type(s) is EmbeddingBagCollectionSharder else s
        for s in get_default_sharders()
    ]


def fused_params_of(
    embedding_output_dtype: str, tbe_bounds_check: str = "warning", tbe_stochastic_rounding: bool = True
) -> Optional[Dict[str, Any]]:
    """TBE fused params for ``perf.embedding_output_dtype``, ``perf.tbe_bounds_check`` and
    ``perf.tbe_stochastic_rounding`` (None when all are TorchRec's defaults: fp32 output, FBGEMM's
    ``BoundsCheckMode.WARNING``, stochastic rounding of fp16 weights)."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    dtypes = {"fp16": SparseType.FP16, "bf16": SparseType.BF16}
    params: Dict[str, Any] = {}
    if embedding_output_dtype in dtypes:
        params["output_dtype"] = dtypes[embedding_output_dtype]
    if tbe_bounds_check != "warning":
        params["bounds_check_mode"] = {"fatal": BoundsCheckMode.FATAL, "none": BoundsCheckMode.NONE}[tbe_bounds_check]
    if not tbe_stochastic_rounding:
        params["stochastic_rounding"] = False
    return params or None
