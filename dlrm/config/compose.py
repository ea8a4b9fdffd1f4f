"""Composition of the run's config with Hydra, and the refusal of keys the schema does not have.

Hydra composes ``conf/config.yaml`` over the schema registered as ``base_config`` (:func:`register_configs`), so
every YAML file in ``conf/`` is type-checked: a wrong type fails at compose time, naming the key. Hydra's
``+key=value`` can still add a key no field takes; :func:`to_config` refuses it (:func:`unknown_key_error` names
the keys its section has) and turns the composed ``DictConfig`` into :class:`~dlrm.config.schema.Config`, whose
``__post_init__`` checks run on the way.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from dlrm.config.checks import check_finite
from dlrm.config.schema import Config
from dlrm.errors import ConfigError

# conf/ sits beside the dlrm package in a checkout and in an editable install (`pip install -e .`); an absolute
# path because Hydra resolves a relative one against the package (pkg://), where conf/ is not.
CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "conf")
# The config groups of conf/ (a directory each), in the order the configuration reference lists them.
GROUPS = ("model", "data", "optimizer", "sharding", "pipeline", "offload", "perf", "logger", "experiment")


def group_options(group: str) -> List[str]:
    """The option names of a config group: its ``conf/<group>/*.yaml`` files."""
    return sorted(n[:-5] for n in os.listdir(os.path.join(CONF_DIR, group)) if n.endswith(".yaml"))


def register_configs() -> None:
    """Register the schema as ``base_config`` so ``conf/config.yaml`` composes on top of it."""
    ConfigStore.instance().store(name="base_config", node=Config)


def compose(overrides: Sequence[str] = (), config_dir: Optional[str] = None) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides outside a Hydra app (tests, tools).

    Returns the composed ``DictConfig`` (Hydra's own ``hydra`` node removed).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir or CONF_DIR, version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def section_schema(field_: Any) -> Optional[type]:
    """The schema class of a field that is a nested section (a dataclass default factory), else None."""
    sub = field_.default_factory
    return sub if isinstance(sub, type) and dataclasses.is_dataclass(sub) else None


def _unknown_key(path: str, section: str, names: Any) -> ConfigError:
    return ConfigError(
        f"config key `{path}` is not a known setting; the keys of `{section or 'the top level'}` are: "
        f"{', '.join(sorted(names))}"
    )


def unknown_key_error(path: str) -> Optional[ConfigError]:
    """The error for a dotted ``path`` that names no schema field (listing the keys its section has), or None when
    the field exists (or lies below a field that is not a section, such as ``sharding.constraints``)."""
    schema: Optional[type] = Config
    parts = path.split(".")
    for i, part in enumerate(parts):
        names = {f.name: f for f in dataclasses.fields(schema)}  # type: ignore[arg-type]
        if part not in names:
            return _unknown_key(path, ".".join(parts[:i]), names)
        schema = section_schema(names[part])
        if schema is None:
            return None
    return None


def _reject_unknown_keys(node: Any, schema: Any, prefix: str) -> None:
    """Hydra's ``+key=value`` can add keys that no schema field takes; refuse them rather than drop them."""
    names = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in names:
            raise _unknown_key(path, prefix.rstrip("."), names)
        sub = section_schema(names[key])
        if sub is not None:
            _reject_unknown_keys(node[key], sub, path + ".")


def to_config(cfg: DictConfig | Any) -> Config:
    """Convert a composed config to :class:`Config`, running every ``__post_init__`` check.

    Raises:
        ConfigError: a value is out of range; the message names the key and the fix.
    """
    if isinstance(cfg, Config):
        return cfg
    _reject_unknown_keys(cfg, Config, "")
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, Config), type(obj)
    check_finite(obj, "")
    return obj
