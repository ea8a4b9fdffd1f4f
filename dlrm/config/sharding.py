"""The ``sharding`` section of the schema (``sharding=<preset>``, per-table ``sharding.constraints.<table>``) and the
TorchRec sharding types and compute kernels the trainer runs."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from dlrm.config.checks import check

# TorchRec ``ShardingType`` values this trainer runs (``sharding=<name>`` presets, per-table constraints), and
# the ``EmbeddingComputeKernel`` values of the EmbeddingBagCollection sharder (``dense`` is data_parallel's).
SHARDING_TYPES = (
    "table_wise",
    "row_wise",
    "column_wise",
    "table_row_wise",
    "table_column_wise",
    "data_parallel",
    "grid_shard",
)
SHARDING_PRESETS = ("auto", "table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel", "grid_shard")
COMPUTE_KERNELS = ("fused", "fused_uvm", "fused_uvm_caching", "dense")


def _check_types(values: Optional[List[str]], allowed: Sequence[str], key: str) -> None:
    if values is None:
        return
    check(len(values) > 0, key, "give at least one value, or null for no constraint")
    bad = [v for v in values if v not in allowed]
    check(not bad, key, f"unknown value(s) {bad}; choose from {', '.join(allowed)}")


@dataclass
class TableConstraintConfig:
    """Per-table planner constraints (TorchRec ``ParameterConstraints``): ``sharding.constraints.<table>.*``, e.g.
    ``+sharding.constraints.t_cat_0.sharding_types=[row_wise]``; a list field also takes one value as a one-element
    list (``sharding_types=row_wise``). Null: the table follows the preset."""

    sharding_types: Optional[List[str]] = None
    """Sharding types the planner may pick for this table."""
    compute_kernels: Optional[List[str]] = None
    """Compute kernels the planner may pick: ``fused`` (weights in HBM on GPU), ``fused_uvm`` (host memory),
    ``fused_uvm_caching`` (host memory with an HBM cache), ``dense`` (data_parallel only)."""
    min_partition: Optional[int] = None
    """Column shard width for column_wise / table_column_wise / grid_shard: a multiple of 4 dividing the dim."""
    pooling_factors: Optional[List[float]] = None
    """Mean ids per sample of the table's feature, for the planner's cost model (default: its
    ``model.multi_hot_sizes`` entry with ``data.multi_hot``, else 1)."""
    num_poolings: Optional[List[float]] = None
    """TorchRec's per-feature pooling count hint (rarely needed)."""
    batch_sizes: Optional[List[int]] = None
    """TorchRec's per-feature batch size hint (rarely needed)."""

    def validate(self, prefix: str) -> None:
        """Raise ConfigError naming ``<prefix>.<field>`` (``sharding.constraints.<table>.<field>``) for an empty or
        unknown sharding type or compute kernel list, or a ``min_partition`` or pooling factor <= 0."""
        _check_types(self.sharding_types, SHARDING_TYPES, f"{prefix}.sharding_types")
        _check_types(self.compute_kernels, COMPUTE_KERNELS, f"{prefix}.compute_kernels")
        check(
            self.min_partition is None or self.min_partition > 0,
            f"{prefix}.min_partition",
            "must be a positive number of columns or null",
        )
        check(
            self.pooling_factors is None or all(x > 0 for x in self.pooling_factors),
            f"{prefix}.pooling_factors",
            "every pooling factor must be positive",
        )


# An example value per field of ``sharding.constraints.<table>``, for the fix in a type error's message.
_CONSTRAINT_EXAMPLES = {
    "sharding_types": "[row_wise]",
    "compute_kernels": "[fused]",
    "min_partition": "8",
    "pooling_factors": "[2.0]",
    "num_poolings": "[1.0]",
    "batch_sizes": "[512]",
}
_KINDS = {str: "name", int: "whole number", float: "number"}


def _of_type(value: Any, kind: type) -> bool:
    if isinstance(value, bool):  # a bool is an int to Python, not a count or a factor
        return False
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def _typed_constraint(fields: Dict[str, Any], key: str) -> Dict[str, Any]:
    """The fields of ``sharding.constraints.<table>`` (``key``) checked against :class:`TableConstraintConfig`'s
    types, for its constructor. ``sharding.constraints`` is an untyped dict (OmegaConf cannot add keys to a dict of
    dataclasses from the command line), so nothing else checks them. A list field takes one bare value as a
    one-element list (``sharding_types=row_wise``); list items of a float field become floats.

    Raises:
        ConfigError: a value of the wrong type (a string for ``min_partition``, a mapping for a list, a list item
            of the wrong type), naming ``<key>.<field>`` and an example value.
    """
    hints = typing.get_type_hints(TableConstraintConfig)
    out: Dict[str, Any] = {}
    for name, value in fields.items():
        if value is None:
            out[name] = None
            continue
        (kind,) = [t for t in typing.get_args(hints[name]) if t is not type(None)]  # Optional[X] -> X
        is_list = typing.get_origin(kind) is list
        item = typing.get_args(kind)[0] if is_list else kind
        items = value if is_list and isinstance(value, (list, tuple)) else [value]
        what = f"a list of {_KINDS[item]}s" if is_list else f"a {_KINDS[item]}"
        check(
            all(_of_type(v, item) for v in items),
            f"{key}.{name}",
            f"got {value!r}; give {what} or null, e.g. {key}.{name}={_CONSTRAINT_EXAMPLES[name]}",
        )
        out[name] = [float(v) if item is float else v for v in items] if is_list else value
    return out


@dataclass
class ShardingConfig:
    """How the TorchRec planner places the embedding tables (``sharding=<preset>``; ``dlrm/sharding/``,
    docs/sharding.md)."""

    name: str = "auto"
    """The preset: ``auto`` lets the planner choose among every sharding type the backend runs; ``table_wise``,
    ``row_wise``, ``column_wise``, ``table_row_wise``, ``data_parallel`` and ``grid_shard`` force that type on
    every table (per-table constraints still override)."""
    sharding_types: Optional[List[str]] = None
    """The sharding types the planner may use for every table (null: all); set by the ``conf/sharding`` files."""
    compute_kernel: Optional[str] = None
    """Kernel of every table: ``fused``, ``fused_uvm``, ``fused_uvm_caching`` (GPU), ``dense`` (data_parallel);
    null: the planner chooses."""
    min_partition: Optional[int] = None
    """Column shard width for every column-split table (null: TorchRec's 128, capped at the dim)."""
    # Typed per entry in __post_init__: OmegaConf cannot add keys to a Dict[str, <dataclass>] from the command line.
    constraints: Dict[str, Any] = field(default_factory=dict)
    """Per-table overrides keyed by table name (``t_cat_0`` .. ``t_cat_25``); the fields of
    ``sharding.constraints.<table>`` below."""
    storage_reservation: float = 0.05
    """Fraction of device memory the planner keeps free for activations and the dense model (TorchRec
    ``HeuristicalStorageReservation``; the MLPerf reference uses 0.05)."""
    hbm_cap_gb: Optional[float] = None
    """Device memory per rank the planner may use, in GiB (null: the device's capacity; required to plan for
    CUDA on a machine without a GPU)."""
    ddr_cap_gb: Optional[float] = None
    """Host memory per rank, in GiB (null: this host's RAM / local world size)."""
    plan_path: Optional[str] = None
    """A ``plan.json`` (written by a run or by ``python -m dlrm.plan``) used exactly, without planning, after
    checking that it matches the model, world size and device."""
    data_parallel_max_rows: Optional[int] = None
    """Tables of at most this many rows (after ``model.row_cap``) are data_parallel: replicated, their pooled
    embeddings skip the output dist, their gradients join DDP's all-reduce (HugeCTR's hybrid placement). A
    table's own ``sharding_types`` wins; needs fp32 tables. Null: off."""

    def __post_init__(self) -> None:
        check(
            self.name in SHARDING_PRESETS,
            "sharding.name",
            f"got {self.name!r}; choose sharding={'|'.join(SHARDING_PRESETS)}",
        )
        _check_types(self.sharding_types, SHARDING_TYPES, "sharding.sharding_types")
        check(
            self.compute_kernel is None or self.compute_kernel in COMPUTE_KERNELS,
            "sharding.compute_kernel",
            f"got {self.compute_kernel!r}; choose from {', '.join(COMPUTE_KERNELS)} or null",
        )
        if self.compute_kernel == "dense":
            check(
                self.sharding_types == ["data_parallel"],
                "sharding.compute_kernel",
                "the dense kernel only runs data_parallel tables; use sharding=data_parallel, or a fused kernel",
            )
        if self.sharding_types == ["data_parallel"]:
            check(
                self.compute_kernel in (None, "dense"),
                "sharding.compute_kernel",
                f"data_parallel tables run the dense kernel, not {self.compute_kernel}; "
                "set sharding.compute_kernel=null",
            )
        check(
            self.min_partition is None or self.min_partition > 0,
            "sharding.min_partition",
            "must be a positive number of columns or null",
        )
        for table, c in list(self.constraints.items()):
            key = f"sharding.constraints.{table}"
            if not isinstance(c, TableConstraintConfig):
                check(isinstance(c, dict), key, "must be a mapping of constraint fields")
                names = {f.name for f in dataclasses.fields(TableConstraintConfig)}
                bad = sorted(set(c) - names)
                check(not bad, key, f"unknown field(s) {bad}; the fields are: {', '.join(sorted(names))}")
                c = self.constraints[table] = TableConstraintConfig(**_typed_constraint(c, key))
            c.validate(key)
        check(0.0 <= self.storage_reservation < 1.0, "sharding.storage_reservation", "must be in [0, 1)")
        check(
            self.data_parallel_max_rows is None or self.data_parallel_max_rows > 0,
            "sharding.data_parallel_max_rows",
            "must be a positive number of rows, or null (off)",
        )
        check(self.hbm_cap_gb is None or self.hbm_cap_gb > 0, "sharding.hbm_cap_gb", "must be positive or null")
        check(self.ddr_cap_gb is None or self.ddr_cap_gb > 0, "sharding.ddr_cap_gb", "must be positive or null")
