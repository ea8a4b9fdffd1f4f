"""Every shipped config composes and validates; bad values fail early naming the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from dlrm.config import (
    MLPERF_MULTI_HOT_SIZES,
    MLPERF_NUM_EMBEDDINGS,
    DataConfig,
    compose,
    to_config,
)
from dlrm.errors import ConfigError, InputError

CONF = Path(__file__).resolve().parent.parent / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())


def _options(group: str):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_shipped_config_composes(group: str, option: str) -> None:
    overrides = [f"{group}={option}"]
    if (group, option) in {("data", "criteo_tsv"), ("experiment", "criteo_sample")}:
        overrides.append("data.train_path=x.tsv")  # required key; the file is only opened at run time
    if (group, option) == ("offload", "uvm_caching"):
        overrides.append("pipeline=prefetch")  # uvm_caching trains with the prefetch pipeline
    if (group, option) in {("data", "criteo_binary"), ("experiment", "mlperf_dlrmv2")}:
        overrides.append("data.dataset_dir=x")  # required key; the directory is only opened at run time
    cfg = to_config(compose(overrides))
    if group == "model":
        assert cfg.model.name == option
    elif group in ("data", "pipeline", "sharding", "offload", "perf"):
        assert getattr(cfg, group).name == option
    elif group == "logger":  # the jsonl sink has no switch: it is always written
        sinks = ("stdout", "tensorboard", "wandb", "mlperf")
        assert {k for k in sinks if getattr(cfg.logger, k).enabled} == {option} - {"jsonl"}


def test_groups_are_the_expected_ones() -> None:
    assert {"model", "data", "optimizer", "sharding", "pipeline", "logger", "experiment"} <= set(GROUPS)


def test_default_is_small_synthetic() -> None:
    cfg = to_config(compose([]))
    assert (cfg.model.name, cfg.data.name, cfg.pipeline.name) == ("dlrm_v2_small", "synthetic", "sparse_dist")
    assert cfg.optimizer.eps == 1e-8  # MLPerf Training rules


def test_dlrm_v2_is_the_mlperf_architecture() -> None:
    m = to_config(compose(["model=dlrm_v2"])).model
    assert m.num_embeddings_per_feature == MLPERF_NUM_EMBEDDINGS
    assert sum(m.num_embeddings_per_feature) == 204_184_588
    assert m.multi_hot_sizes == MLPERF_MULTI_HOT_SIZES and sum(m.multi_hot_sizes) == 214
    assert (m.embedding_dim, m.dense_arch_layer_sizes, m.over_arch_layer_sizes) == (
        128,
        [512, 256, 128],
        [1024, 1024, 512, 256, 1],
    )
    assert (m.interaction, m.dcn_num_layers, m.dcn_low_rank_dim, m.row_cap) == ("dcn", 3, 512, None)
    capped = to_config(compose(["model=dlrm_v2", "model.row_cap=1000"])).model
    assert capped.table_rows[0] == 1000 and capped.table_rows[5] == 3


def test_criteo_sample_experiment_overrides_only_what_differs() -> None:
    cfg = to_config(compose(["experiment=criteo_sample", "data.train_path=a.tsv"]))
    d = cfg.data
    assert (d.name, d.global_batch_size, d.multi_hot, d.min_id_count, cfg.trainer.epochs) == (
        "criteo_tsv",
        64,
        False,
        3,
        1,
    )
    assert (cfg.optimizer.lr, cfg.optimizer.embedding_lr, cfg.optimizer.sparse_type) == (0.01, 0.02, "adagrad")
    assert cfg.model == dataclasses.replace(to_config(compose([])).model, dense_buckets=16)  # else dlrm_v2_small


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.embedding_dim=0", "model.embedding_dim"),
        ("model.dense_arch_layer_sizes=[64,32,8]", "model.dense_arch_layer_sizes"),
        ("model.over_arch_layer_sizes=[64,2]", "model.over_arch_layer_sizes"),
        ("model.multi_hot_sizes=[1,2]", "model.multi_hot_sizes"),
        ("model.interaction=cross", "model.interaction"),
        ("model.dense_buckets=-1", "model.dense_buckets"),
        ("model.dense_bucket_width=0", "model.dense_bucket_width"),
        ("model.dense_bucket_width=-0.5", "model.dense_bucket_width"),
        ("data.batch_size=0", "data.batch_size"),
        ("optimizer.sparse_type=sgd", "optimizer.sparse_type"),
        ("device=tpu", "device"),
    ],
)
def test_bad_values_name_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"config key `{key}`"):
        to_config(compose([override]))


@pytest.mark.parametrize(
    "override,message",
    [
        ("data.multi_hot_seed=-1", "config key `data.multi_hot_seed`: must be in 0 .. 2**32 - 1 (a numpy seed)"),
        ("data.teacher_dim=-1", "config key `data.teacher_dim`: must be >= 0"),
        (
            "model.dense_arch_layer_sizes=[-5,16]",
            "config key `model.dense_arch_layer_sizes`: every layer needs a positive width",
        ),
        (
            "model.over_arch_layer_sizes=[0,1]",
            "config key `model.over_arch_layer_sizes`: every layer needs a positive width",
        ),
        (
            "optimizer.decay_power=-2",
            "config key `optimizer.decay_power`: must be positive (a negative power raises the rate)",
        ),
    ],
)
def test_values_torch_or_numpy_would_fail_on_late_are_refused(override: str, message: str) -> None:
    """Each would otherwise fail deep in torch, numpy or TorchRec with a traceback, or (a negative decay power)
    train with a rising rate."""
    with pytest.raises(ConfigError) as e:
        to_config(compose([override]))
    assert str(e.value) == message


def test_a_file_path_with_synthetic_data_is_refused() -> None:
    with pytest.raises(ConfigError, match="config key `data.train_path`: is set .* add data=criteo_tsv"):
        to_config(compose(["data.train_path=x.tsv"]))


def test_criteo_tsv_without_path_names_the_key() -> None:
    with pytest.raises(ConfigError, match="data.train_path"):
        to_config(compose(["data=criteo_tsv"]))


def test_unknown_key_fails_at_compose_time() -> None:
    with pytest.raises(ConfigError, match="config key `model.no_such_key` is not a known setting"):
        to_config(compose(["+model.no_such_key=1"]))
    with pytest.raises(ConfigCompositionException, match=r"Could not override 'data\.batchsize'"):
        compose(["data.batchsize=3"])


def test_every_field_has_a_docstring() -> None:
    """Each schema field (nested sections aside) has the docstring beside it that docs/configuration.md shows."""
    import dataclasses

    from dlrm import config as C

    for prefix, schema in C.sections():
        docs = C.field_docs(schema)
        for f in dataclasses.fields(schema):
            nested = f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory)
            assert nested or docs.get(f.name), f"{prefix}{f.name} has no docstring beside it in dlrm/config/"


def test_configuration_reference_is_up_to_date() -> None:
    """docs/configuration.md is what `python -m dlrm.config --markdown docs/configuration.md` writes."""
    from dlrm.config import configuration_markdown

    current = (CONF.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert current == configuration_markdown(), (
        "docs/configuration.md is out of date: regenerate it with "
        "python -m dlrm.config --markdown docs/configuration.md"
    )


def test_configuration_reference_sample_rows() -> None:
    from dlrm.config import configuration_markdown

    text = configuration_markdown()
    for row in (
        "| `perf.compile` | `false` | `perf=fast`: `true` |",
        "| `eval.every_n_steps` | `128` |",
        "| `model.embedding_dim` | `16` | `model=dlrm_v2`: `128` |",
        "| `sharding.constraints.<table>.sharding_types` | `null` |",
        "| `seed` | `0` |",
    ):
        assert row in text, row


def test_min_id_count_with_binary_data_is_refused() -> None:
    """data=criteo_binary reads the ids its preprocessing wrote: a threshold would be ignored."""
    with pytest.raises(ConfigError) as e:
        to_config(compose(["data=criteo_binary", "data.dataset_dir=x", "data.min_id_count=3"]))
    assert str(e.value) == (
        "config key `data.min_id_count`: data=criteo_binary reads the ids its preprocessing wrote; set "
        "data.min_id_count=0, or train on the TSV with data=criteo_tsv"
    )
    with pytest.raises(ConfigError, match="config key `data.min_id_count`: must be >= 0"):
        to_config(compose(["data.min_id_count=-1"]))


def test_val_fraction_with_binary_data_is_refused() -> None:
    """data=criteo_binary validates on the first half of its last day: a val_fraction would be ignored."""
    base = ["data=criteo_binary", "data.dataset_dir=x"]
    assert to_config(compose(base)).data.val_fraction == 0.2
    with pytest.raises(ConfigError) as e:
        to_config(compose([*base, "data.val_fraction=0.1"]))
    assert str(e.value) == (
        "config key `data.val_fraction`: data=criteo_binary validates on the first half of its last day; "
        "drop data.val_fraction"
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["data.val_fraction=0.3"],
            "config key `data.val_fraction`: data=synthetic validates on data.num_val_samples generated rows; "
            "set data.num_val_samples instead of data.val_fraction",
        ),
        (
            ["data=criteo_tsv", "data.train_path=a.tsv", "data.val_path=b.tsv", "data.val_fraction=0.3"],
            "config key `data.val_fraction`: data.val_path gives the validation rows, so data.val_fraction is "
            "unused; drop data.val_fraction, or drop data.val_path to validate on the last data.val_fraction of "
            "data.train_path",
        ),
        (
            ["data.max_rows=1000"],
            "config key `data.max_rows`: data=synthetic generates data.num_train_samples training rows; set "
            "data.num_train_samples instead of data.max_rows",
        ),
        (
            ["pipeline=semi_sync", "optimizer.warmup_steps=10"],
            "config key `pipeline.name`: pipeline=semi_sync steps only the dense optimizer, and TorchRec hands a "
            "new rate to the tables' TBE in the fused optimizer's step, so the tables would keep their base rate "
            "through optimizer.warmup_steps=10 / optimizer.decay_steps=0; set both to 0, or use pipeline=sparse_dist",
        ),
        (
            ["optimizer.sparse_lr=1e-9", "optimizer.decay_steps=10"],
            "config key `optimizer.end_lr`: 1e-07 must be in [0, the smaller of optimizer.lr and optimizer.sparse_lr] "
            "(the decay's floor for both); lower optimizer.end_lr",
        ),
    ],
)
def test_settings_the_run_would_not_follow_are_refused(overrides, message: str) -> None:
    """Settings the data source would ignore, and learning-rate schedules the tables would not follow."""
    with pytest.raises(ConfigError) as e:
        to_config(compose(overrides))
    assert str(e.value) == message


@pytest.mark.parametrize(
    "sink,module,install",
    [
        ("wandb", "wandb", "-e '.[wandb]' (or pip install wandb)"),
        ("mlperf", "mlperf_logging", "mlperf-logging==4.1.68 (or pip install -e .)"),
        ("tensorboard", "tensorboard", "tensorboard==2.21.0 (or pip install -e .)"),
    ],
)
def test_a_sink_without_its_package_is_refused_when_the_config_loads(monkeypatch, sink, module, install) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    with pytest.raises(ConfigError) as e:
        to_config(compose([f"logger=[stdout,{sink}]"]))
    assert str(e.value) == (
        f"config key `logger`: logger=[...,{sink}] needs the {module} package, which is not installed; pip install "
        f"{install}, or leave {sink} out of logger"
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["data.batch_size=abc"],
            "Error merging override data.batch_size=abc (Value 'abc' of type 'str' could not be converted to Integer)",
        ),
        (
            ["data.nokey=1"],
            "config key `data.nokey` is not a known setting; the keys of `data` are: "
            + ", ".join(f.name for f in sorted(dataclasses.fields(DataConfig), key=lambda f: f.name)),
        ),
        (  # a table of sharding.constraints is added with `+`, as Hydra says (docs/sharding.md)
            ["sharding.constraints.t_cat_0.sharding_types=[row_wise]"],
            "Could not override 'sharding.constraints.t_cat_0.sharding_types'. To append to your config use "
            "+sharding.constraints.t_cat_0.sharding_types=[row_wise] (Key 't_cat_0' is not in struct)",
        ),
        (
            ["model=nosuch"],
            "In 'config': Could not find 'model/nosuch' Available options in 'model': dlrm dlrm_v2 dlrm_v2_small",
        ),
        (
            ["logger=[stdout,csv]"],
            "In 'config': Could not load 'logger/csv'. Available options in 'logger': jsonl mlperf stdout "
            "tensorboard wandb",
        ),
        (
            ["optimizer.lr=0.01,0.02"],
            "config key `optimizer.lr`: optimizer.lr=0.01,0.02 is a sweep, one job per value; add --multirun (or "
            "hydra.mode=MULTIRUN) to run them, or give one value",
        ),
    ],
)
def test_overrides_that_do_not_compose_are_one_line_before_hydra_starts(argv, message: str) -> None:
    from dlrm.cli import check_overrides

    with pytest.raises(InputError) as e:
        check_overrides([*argv, "hydra.run.dir=/nonexistent"])
    assert str(e.value) == message
    check_overrides(["data.batch_size=abc", "--cfg", "job"])  # with a flag Hydra handles everything


@pytest.mark.parametrize(
    "env,message",
    [
        ({"RANK": "1"}, "RANK=1 is outside WORLD_SIZE=1 (ranks 0-0)"),  # alone it would wait for rank 0 forever
        (
            {"WORLD_SIZE": "abc"},
            "WORLD_SIZE='abc' is not a whole number; launch with torchrun or torchx, or unset WORLD_SIZE",
        ),
        ({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE=0 must be at least 1"),
        (
            {"WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
            "LOCAL_RANK=2 is outside LOCAL_WORLD_SIZE=2 (ranks 0-1)",
        ),
        (
            {"WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "2"},
            "WORLD_SIZE=1 is not a multiple of LOCAL_WORLD_SIZE=2 (ranks per host)",
        ),
    ],
)
def test_launch_variables_that_cannot_be_right_are_refused(env: dict, message: str) -> None:
    from dlrm.process_group import launch_env

    assert launch_env({}) == (0, 1, 0, 1)
    assert launch_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == (3, 4, 1, 2)
    with pytest.raises(ConfigError) as e:
        launch_env(env)
    assert str(e.value).startswith(f"environment: {message}")


def test_a_run_directory_that_cannot_be_made_is_refused_before_hydra(tmp_path: Path) -> None:
    from dlrm.cli import check_run_dir

    (tmp_path / "f").write_text("")
    with pytest.raises(InputError) as e:
        check_run_dir([f"hydra.run.dir={tmp_path / 'f'}"], [], {})
    assert str(e.value) == f"config key `hydra.run.dir`: the run directory {tmp_path / 'f'} is a file; give a directory"
    with pytest.raises(InputError) as e:
        check_run_dir([], [f"hydra.run.dir='{tmp_path / 'f' / 'job'}'"], {"DLRM_OUTPUT_ROOT": str(tmp_path / "f")})
    assert str(e.value) == (
        f"environment variable $DLRM_OUTPUT_ROOT: cannot make the run directory {tmp_path / 'f' / 'job'} (Not a "
        "directory); give a writable directory"
    )
    check_run_dir([], [f"hydra.run.dir='{tmp_path}/runs/${{now:%H-%M-%S}}'"], {})  # the fixed part is made
    assert (tmp_path / "runs").is_dir()


def test_valid_command_lines_pass_the_override_check(tmp_path: Path) -> None:
    """A sweep (Hydra composes each job) and a config group found only on an extra ``hydra.searchpath``."""
    from dlrm.cli import check_overrides

    check_overrides(["hydra.mode=MULTIRUN", "optimizer.lr=0.1,0.2", "data.batch_size=64"])
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\ntrainer:\n  max_steps: 3\n")
    check_overrides([f"hydra.searchpath=[file://{tmp_path}]", "experiment=mine", "hydra.run.dir=/nonexistent"])
    with pytest.raises(InputError, match="Could not find 'experiment/mine'"):
        check_overrides(["experiment=mine"])


def test_validation_or_test_file_equal_to_the_training_file_is_refused(tmp_path: Path) -> None:
    """Training on the validation (or test) rows inflates AUC: the same path, spelt differently or through a link,
    is refused naming both keys."""
    train = tmp_path / "train.tsv"
    train.write_text("")
    (tmp_path / "link.tsv").symlink_to(train)
    tsv = ["data=criteo_tsv", f"data.train_path={train}"]
    for spelt in (str(train), f"{tmp_path}/./sub/../train.tsv", str(tmp_path / "link.tsv")):
        with pytest.raises(ConfigError) as e:
            to_config(compose([*tsv, f"data.val_path={spelt}"]))
        assert str(e.value) == (
            f"config key `data.val_path`: {spelt!r} is the same file as data.train_path ({str(train)!r}): "
            "validating on the training rows inflates AUC; pass a separate validation file, or drop "
            "data.val_path to validate on the last data.val_fraction of data.train_path"
        )
    with pytest.raises(ConfigError) as e:
        to_config(compose(["data=criteo_tsv", "data.train_path=a.tsv", "data.test_path=./a.tsv"]))
    assert str(e.value) == (
        "config key `data.test_path`: './a.tsv' is the same file as data.train_path ('a.tsv'): testing on the "
        "training rows inflates AUC; pass a separate test file, or drop data.test_path"
    )
    assert to_config(compose([*tsv, f"data.val_path={tmp_path / 'val.tsv'}"])).data.val_path
    with pytest.raises(ConfigError) as e:
        to_config(compose([*tsv, "data.val_path=v.tsv", "data.test_path=./v.tsv"]))
    assert str(e.value) == (
        "config key `data.test_path`: './v.tsv' is the same file as data.val_path: the test split would repeat the "
        "validation rows the run was tuned on; pass a separate test file, or drop data.test_path"
    )


@pytest.mark.parametrize(
    "override,key,shown",
    [
        ("optimizer.lr=inf", "optimizer.lr", "inf"),
        ("optimizer.sparse_lr=1e400", "optimizer.sparse_lr", "inf"),
        ("optimizer.eps=inf", "optimizer.eps", "inf"),
        ("model.dense_bucket_width=inf", "model.dense_bucket_width", "inf"),
    ],
)
def test_infinite_floats_are_refused(override: str, key: str, shown: str) -> None:
    # each passes its `> 0` check; an infinite rate trains to a non-finite loss, an infinite eps not at all
    with pytest.raises(ConfigError) as e:
        to_config(compose([override]))
    assert str(e.value) == f"config key `{key}`: got {shown}; give a finite number"


def test_seed_outside_torchs_range_is_refused() -> None:
    assert to_config(compose([f"seed={2**63 - 1}"])).seed == 2**63 - 1
    for seed in (2**63, 99999999999999999999, -1):
        with pytest.raises(ConfigError) as e:
            to_config(compose([f"seed={seed}"]))
        assert str(e.value) == f"config key `seed`: got {seed}; use 0 .. 2**63 - 1 (torch.manual_seed's range)"


def test_mlperf_experiment_is_the_closed_recipe() -> None:
    """MLPerf Training rules for dlrm_dcnv2: global batch 65536 with lr 0.004, Adagrad eps 1e-8 on both sides,
    element-wise on the tables, no schedule, 20 evaluations per epoch (none after the last step), target AUC
    0.80275, the binary dataset, a closed-division mllog."""
    c = to_config(compose(["experiment=mlperf_dlrmv2", "data.dataset_dir=/data/criteo_bin"]))
    assert (c.model.name, c.data.name, c.data.global_batch_size, c.data.multi_hot) == (
        "dlrm_v2",
        "criteo_binary",
        65536,
        True,
    )
    o = c.optimizer
    assert (o.lr, o.embedding_lr, o.eps, o.sparse_type, o.warmup_steps, o.decay_steps) == (
        0.004,
        0.004,
        1e-8,
        "adagrad",
        0,
        0,
    )
    assert (c.eval.per_epoch, c.eval.every_n_steps, c.eval.at_end, c.eval.target_auc) == (20, None, False, 0.80275)
    assert c.logger.mlperf.enabled and c.logger.stdout.enabled and c.eval.auc_method == "auto"
    assert c.logger.mlperf.submission_division == "closed"


def test_batch_size_and_global_batch_size_that_disagree_are_refused(capsys) -> None:
    """Both keys set: they must agree at this world size (the trainer and dlrm.plan share the rule)."""
    from dlrm.config import DataConfig, per_rank_batch
    from dlrm.plan import main as plan_main

    assert per_rank_batch(DataConfig(), 4) == 256
    assert per_rank_batch(DataConfig(batch_size=64), 4) == 64
    assert per_rank_batch(DataConfig(global_batch_size=512), 4) == 128
    assert per_rank_batch(DataConfig(batch_size=128, global_batch_size=512), 4) == 128
    assert plan_main(["world_size=2", "data.batch_size=128", "data.global_batch_size=512"]) == 2
    assert capsys.readouterr().err == (
        "error: config keys `data.batch_size` and `data.global_batch_size` disagree: 128 per rank x 2 ranks is 256, "
        "not 512; set one of them (data.global_batch_size=null to give the batch per rank)\n"
    )
