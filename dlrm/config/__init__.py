"""The trainer's configuration: a typed schema, its composition with Hydra, and its reference.

Hydra composes ``conf/config.yaml`` over the structured schema registered as ``base_config``, so every YAML file
in ``conf/`` is type-checked (an unknown key or a wrong type fails at compose time, naming the key).
:func:`to_config` then turns the composed ``DictConfig`` into the dataclasses, whose ``__post_init__`` validates
values and names the config key and the fix in its error.

One job per module; this ``__init__`` is the public API (import from ``dlrm.config``):

- :mod:`~dlrm.config.schema`: :class:`Config` and its small sections; :mod:`~dlrm.config.data`,
  :mod:`~dlrm.config.sharding`, :mod:`~dlrm.config.perf`, :mod:`~dlrm.config.logger`: the larger sections;
  :mod:`~dlrm.config.checks`: the check they share. A new key is a field with a docstring beside it.
- :mod:`~dlrm.config.mlperf`: the MLPerf DLRM-v2 table shapes and Criteo's feature counts.
- :mod:`~dlrm.config.compose`: Hydra composition (:func:`compose`), :func:`to_config` and the unknown-key checks.
- :mod:`~dlrm.config.messages`: Hydra's errors as one ``error:`` line (:func:`error_line`).
- :mod:`~dlrm.config.reference`: the generator of ``docs/configuration.md`` and its command line::

    python -m dlrm.config --markdown docs/configuration.md   # regenerate the configuration reference
    python train.py --cfg job                                 # print the composed config
"""

from __future__ import annotations

from dlrm.config.compose import (
    CONF_DIR,
    GROUPS,
    compose,
    group_options,
    register_configs,
    to_config,
    unknown_key_error,
)
from dlrm.config.data import DEFAULT_BATCH_SIZE, DataConfig, per_rank_batch
from dlrm.config.logger import LoggerConfig, MlperfSink, StdoutSink, TensorBoardSink, WandbSink
from dlrm.config.messages import error_line
from dlrm.config.mlperf import (
    MLPERF_MULTI_HOT_SIZES,
    MLPERF_NUM_EMBEDDINGS,
    NUM_DENSE_FEATURES,
    NUM_SPARSE_FEATURES,
)
from dlrm.config.perf import PerfConfig
from dlrm.config.reference import configuration_markdown, field_docs, main, sections
from dlrm.config.schema import (
    CheckpointConfig,
    Config,
    EvalConfig,
    ModelConfig,
    OffloadConfig,
    OptimizerConfig,
    PipelineConfig,
    TrainerConfig,
)
from dlrm.config.sharding import (
    COMPUTE_KERNELS,
    SHARDING_PRESETS,
    SHARDING_TYPES,
    ShardingConfig,
    TableConstraintConfig,
)
from dlrm.writable import output_file_problem  # its home is dlrm.writable; kept here for existing importers

__all__ = [
    "CONF_DIR",
    "COMPUTE_KERNELS",
    "DEFAULT_BATCH_SIZE",
    "GROUPS",
    "MLPERF_MULTI_HOT_SIZES",
    "MLPERF_NUM_EMBEDDINGS",
    "NUM_DENSE_FEATURES",
    "NUM_SPARSE_FEATURES",
    "SHARDING_PRESETS",
    "SHARDING_TYPES",
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "EvalConfig",
    "LoggerConfig",
    "MlperfSink",
    "ModelConfig",
    "OffloadConfig",
    "OptimizerConfig",
    "PerfConfig",
    "PipelineConfig",
    "ShardingConfig",
    "StdoutSink",
    "TableConstraintConfig",
    "TensorBoardSink",
    "TrainerConfig",
    "WandbSink",
    "compose",
    "configuration_markdown",
    "error_line",
    "field_docs",
    "group_options",
    "main",
    "output_file_problem",
    "per_rank_batch",
    "register_configs",
    "sections",
    "to_config",
    "unknown_key_error",
]
