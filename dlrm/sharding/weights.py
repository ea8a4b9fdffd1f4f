"""Initial table weights from the seed alone, so every sharding plan and world size starts from the same tables."""

from __future__ import annotations

import zlib
from typing import Any, Sequence, Tuple

import torch

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply rounds) of int64 tensors holding values in [0, 2^32); multipliers
    below 2^31 keep every product inside int64."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def _table_key(name: str, seed: int) -> int:
    key = torch.tensor([(zlib.crc32(name.encode()) ^ (seed * 0x61C88647)) & _M32], dtype=torch.int64)
    return int(_mix32(_mix32(key))[0])


def initial_weights(
    name: str, seed: int, rows: Tuple[int, int], cols: Tuple[int, int], low: float, high: float, device: torch.device
) -> torch.Tensor:
    """Initial weights of rows ``[rows[0], rows[1])`` and columns ``[cols[0], cols[1])`` of table ``name``: uniform in
    ``[low, high)`` (TorchRec's default range is ``+-sqrt(1 / num_embeddings)``), each value a hash of ``(seed,
    table, row, column)`` alone. So a shard computes its own part wherever it lives, on any device, and every
    sharding plan and world size starts from the same tables. Returns fp32 ``[rows, cols]`` on ``device``."""
    key = _table_key(name, seed)
    r = torch.arange(rows[0], rows[1], dtype=torch.int64, device=device)[:, None]
    c = torch.arange(cols[0], cols[1], dtype=torch.int64, device=device)[None, :]
    h = _mix32(_mix32(r ^ key) ^ ((c * 0x61C88647) & _M32))
    return low + (high - low) * ((h >> 8).to(torch.float32) * (1.0 / (1 << 24)))


def seed_tables(model: torch.nn.Module, configs: Sequence[Any], seed: int, rows_per_chunk: int = 1 << 16) -> int:
    """Overwrite every table shard of the sharded ``model`` with :func:`initial_weights` (DMP initialises each
    shard from its rank's RNG stream, so the tables would otherwise depend on the plan and the world size).

    Args:
        model: the DMP model (its ``state_dict`` views the live TBE weights and data_parallel replicas).
        configs: the ``EmbeddingBagConfig`` of every table (names, init ranges).
        seed: the run's ``seed``.
        rows_per_chunk: rows computed at a time (bounds the temporary int64 tensors).

    Returns:
        How many table shards (or replicas) were written on this rank.
    """
    by_name = {c.name: c for c in configs}
    n = 0
    with torch.no_grad():
        for key, value in model.state_dict().items():
            parts = key.split(".")
            if len(parts) < 2 or parts[-1] != "weight" or parts[-2] not in by_name or "embedding_bags" not in key:
                continue
            cfg = by_name[parts[-2]]
            pieces = (
                [(s.metadata.shard_offsets, s.tensor) for s in value.local_shards()]
                if hasattr(value, "local_shards")
                else [((0, 0), value)]
            )
            for (r0, c0), t in pieces:
                for lo in range(0, t.shape[0], rows_per_chunk):
                    hi = min(t.shape[0], lo + rows_per_chunk)
                    t[lo:hi].copy_(
                        initial_weights(
                            cfg.name,
                            seed,
                            (r0 + lo, r0 + hi),
                            (c0, c0 + t.shape[1]),
                            cfg.get_weight_init_min(),
                            cfg.get_weight_init_max(),
                            t.device,
                        )
                    )
                n += 1
    return n
