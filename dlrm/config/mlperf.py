"""The MLPerf Training DLRM-v2 dataset shape (recommendation_v2/torchrec_dlrm README) and Criteo's feature counts:
the defaults of ``model.num_embeddings_per_feature`` and ``model.multi_hot_sizes``, and what the data tools and
benchmarks build."""

from __future__ import annotations

from typing import List

# MLPerf Training DLRM-v2 (recommendation_v2/torchrec_dlrm README): per-feature cardinalities of the 26 tables.
MLPERF_NUM_EMBEDDINGS: List[int] = [
    40000000,
    39060,
    17295,
    7424,
    20265,
    3,
    7122,
    1543,
    63,
    40000000,
    3067956,
    405282,
    10,
    2209,
    11938,
    155,
    4,
    976,
    14,
    40000000,
    40000000,
    40000000,
    590152,
    12973,
    108,
    36,
]
# MLPerf Training DLRM-v2: ids per sample per feature (214 in all) of the synthetic multi-hot dataset.
MLPERF_MULTI_HOT_SIZES: List[int] = [
    3,
    2,
    1,
    2,
    6,
    1,
    1,
    1,
    1,
    7,
    3,
    8,
    1,
    6,
    9,
    5,
    1,
    1,
    1,
    12,
    100,
    27,
    10,
    3,
    1,
    1,
]
NUM_DENSE_FEATURES = 13  # Criteo: I1..I13
NUM_SPARSE_FEATURES = 26  # Criteo: C1..C26
