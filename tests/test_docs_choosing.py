"""docs/choosing.md's memory example is the arithmetic on the model's real table sizes.

.venv/bin/python -m pytest tests/test_docs_choosing.py -q
"""

from conftest import REPO
from dlrm.config import MLPERF_NUM_EMBEDDINGS, ModelConfig

DOC = (REPO / "docs" / "choosing.md").read_text(encoding="utf-8")
GB, GIB = 1e9, 2**30


def _sizes(rows: int) -> str:
    """A row of the doc's table: weights, with element-wise Adagrad, with row-wise Adagrad (dim 128, fp32)."""
    w, ew, rw = rows * 128 * 4, rows * 128 * 4 * 2, rows * (128 * 4 + 4)
    return " | ".join(f"{b / GB:.2f} GB ({b / GIB:.2f} GiB)" for b in (w, ew, rw))


def test_memory_table_is_computed_from_the_table_sizes() -> None:
    mlperf = {"embedding_dim": 128, "dense_arch_layer_sizes": [512, 256, 128]}  # conf/model/dlrm_v2.yaml
    full = ModelConfig(**mlperf, row_cap=None).table_rows
    capped = ModelConfig(**mlperf, row_cap=4_000_000).table_rows
    assert sum(full) == sum(MLPERF_NUM_EMBEDDINGS) == 204_184_588 and sum(capped) == 24_184_588
    assert f"| full (`model=dlrm_v2`) | {sum(full):,} | {_sizes(sum(full))} |" in DOC
    assert f"| capped, `model.row_cap=4000000` | {sum(capped):,} | {_sizes(sum(capped))} |" in DOC
    assert f"| one 40 M-row table | {max(full):,} | {_sizes(max(full))} |" in DOC
    assert sorted(full, reverse=True)[:6] == [40_000_000] * 5 + [3_067_956]  # "five of 40,000,000, one of ..."
    ew = sum(full) * 128 * 8
    assert f"leaves {139.8 * 0.95:.2f} GiB" in DOC  # the planner's 5% reservation of an H200
    assert f"{ew / GIB / 2:.2f} GiB per GPU if spread evenly" in DOC
    assert f"{ew / GIB / 8:.2f} GiB per GPU if even" in DOC
    assert f"{3 * 40_000_000 * 128 * 8 / GIB:.2f} GiB of host memory (3 x {40_000_000 * 1024 / GIB:.2f})" in DOC
    capped_ew = sum(capped) * 128 * 8
    assert f"{28.1 - capped_ew / GB:.1f} GB above its {capped_ew / GB:.2f} GB of tables and state" in DOC
    assert f"16,044,545 parameters: {16_044_545 * 8 / GB:.2f} GB" in DOC
