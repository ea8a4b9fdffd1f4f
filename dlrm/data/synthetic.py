"""``data=synthetic``: MLPerf-shaped rows labelled by a hidden teacher model, generated in memory.

:func:`load_synthetic` returns :class:`dlrm.data.in_memory.Split` objects; labels come from :class:`Teacher`, so a
model that learns reaches an AUC well above 0.5 without any dataset on disk.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch

from dlrm.config import NUM_DENSE_FEATURES, DataConfig
from dlrm.data.in_memory import Split

# Synthetic ids are drawn from at most this many rows per table, so the teacher stays small for huge tables.
SYNTHETIC_MAX_VOCAB = 100_000


class Teacher:
    """The hidden model that labels synthetic samples.

    logit = dense · w + sum_t bias_t[id_t] + sum_{t<s} <v_t[id_t], v_s[id_s]> (factorisation-machine pairs),
    each part at unit scale (weights 1 : 1 : 0.5), rescaled to a standard deviation of 2 and shifted so that about
    25% of samples click (Criteo: 26%). Labels are Bernoulli(sigmoid(logit)), so the best achievable AUC is
    about 0.85, well above 0.5.
    """

    def __init__(self, vocab: Sequence[int], dim: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(NUM_DENSE_FEATURES, generator=g) / math.sqrt(NUM_DENSE_FEATURES)
        self.bias = [torch.randn(v, generator=g) for v in vocab]
        self.v = [torch.randn(v, dim, generator=g) for v in vocab]

    def logits(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Unnormalised teacher logits, float32 ``[N]``: dense, per-id and pairwise parts, each scaled to unit
        standard deviation, weighted 1 : 1 : 0.5."""

        def unit(x: torch.Tensor) -> torch.Tensor:
            return (x - x.mean()) / x.std().clamp_min(1e-12)

        t = ids.shape[1]
        bias = sum(self.bias[k][ids[:, k]] for k in range(t))
        vs = torch.stack([self.v[k][ids[:, k]] for k in range(t)], dim=1)  # [N, T, dim]
        pairs = 0.5 * (vs.sum(1).pow(2).sum(-1) - vs.pow(2).sum((1, 2)))
        return unit(dense @ self.w) + unit(bias) + 0.5 * unit(pairs)


def load_synthetic(cfg: DataConfig, table_rows: Sequence[int], seed: int) -> Tuple[Split, Split, Optional[Split]]:
    """Teacher-labelled MLPerf-shaped splits of ``data.num_train_samples``, ``data.num_val_samples`` and
    ``data.num_test_samples`` rows (no test split when 0).

    Dense features are ``log(count + 1)`` of log-normal counts, ids are uniform over each table's first
    ``min(rows, 100000)`` rows. Both splits come from one generator seeded by ``data.teacher_seed`` (the
    global ``seed`` only drives model init), so every rank and every world size sees the same rows.
    """
    del seed
    vocab = [min(r, SYNTHETIC_MAX_VOCAB) for r in table_rows]
    teacher = Teacher(vocab, cfg.teacher_dim, cfg.teacher_seed)
    g = torch.Generator().manual_seed(cfg.teacher_seed + 1)
    n = cfg.num_train_samples + cfg.num_val_samples + cfg.num_test_samples
    counts = torch.exp(torch.randn(n, NUM_DENSE_FEATURES, generator=g) * 1.5 + 1.0).floor()
    dense = torch.log1p(counts)
    ids = torch.stack([torch.randint(0, v, (n,), generator=g) for v in vocab], dim=1)
    z = teacher.logits(dense, ids)
    z = (z - z.mean()) / z.std() * 2.0
    z = z - 1.6  # about 25% positives after the sigmoid draw
    labels = torch.bernoulli(torch.sigmoid(z), generator=g)
    whole = Split(dense, ids, labels, "all")
    k, v = cfg.num_train_samples, cfg.num_train_samples + cfg.num_val_samples
    test = whole.rows(v, n, "test") if cfg.num_test_samples else None
    return whole.rows(0, k, "train"), whole.rows(k, v, "val"), test
