"""Plan a job without training: the TorchRec planner on the meta device, for up to 1024 ranks, on any machine.

    python -m dlrm.plan model=dlrm_v2 world_size=8 device=cuda sharding.hbm_cap_gb=139.8 data.global_batch_size=65536
    python -m dlrm.plan sharding=row_wise world_size=4 local_world_size=2 out=plan.json --link-gbps 400
    python -m dlrm.plan experiment=mlperf_dlrmv2 data.dataset_dir=DIR perf=fast world_size=8 device=cuda \\
        sharding.hbm_cap_gb=139.8 --estimate      # + an estimate of one MLPerf epoch and the time to the target
    python train.py sharding.plan_path=plan.json ...          # then train with exactly that plan

Arguments are the trainer's Hydra overrides plus ``world_size=N`` (default 1), ``local_world_size=N`` (default:
the world size, i.e. one host), ``out=<file>`` (write ``plan.json``; an existing file is refused unless
``force=true``) and ``--link-gbps R`` (the link rate for the traffic times, Gb/s per direction per rank, within and
across hosts); each once, and only the flags with a leading ``--``. ``device=cuda`` plans for GPUs
(``sharding.hbm_cap_gb`` is required where no GPU is visible); ``device=cpu`` or ``auto`` plans for this
machine's kind. The per-rank batch is ``data.global_batch_size / world_size`` when set, else
``data.batch_size``, as in the trainer. Prints the plan table and the estimated memory per rank, then the
communication of one training step (``dlrm.traffic``): bytes per rank for the input dist's all-to-alls, the output
dist and the all-reduces, and their time at ``--link-gbps``, or on CUDA without it at NVLink's rate on H200 (3600
Gb/s = 450 GB/s) within a host and 400 Gb/s InfiniBand across hosts (no times for CPU jobs without it). A bad
override, config or plan: one ``error:`` line, exit status 2. No process group and no table memory are needed:
tables stay on meta.
``--estimate`` adds :mod:`dlrm.estimate`'s estimate of one epoch of the configured data (``data.dataset_dir``'s
rows, the synthetic sizes, or the TSV's rows: :func:`dataset_epoch`) and, on MLPerf's Criteo 1TB, the time to AUC
0.80275 on ``world_size`` H200s (the step's compute from measured one-GPU figures of ``perf=fast``: eager, or with
``pipeline=graphed`` the one-rank or several-rank graph, on skewed ids for real Criteo data where measured; or
``--step-ms X``). Its step line names the figure it used. A ``data.dataset_dir`` hashed into other table rows than
the model's is refused before planning.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import List, Optional, Sequence, Tuple

import torch
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from dlrm import estimate as est
from dlrm.config import (
    Config,
    compose,
    error_line,
    per_rank_batch,
    to_config,
    unknown_key_error,
)
from dlrm.errors import ConfigError, InputError
from dlrm.graphed import check_graphed
from dlrm.model import FEATURE_NAMES, build_model, table_configs
from dlrm.offload import offload_constraints
from dlrm.sharding import PlanInfo, format_plan, fuse_embedding_optimizer, plan_model, save_plan, sharding_types_of
from dlrm.traffic import WHOLE_BAGS, StepTraffic, model_traffic
from dlrm.traffic_report import link_rates, traffic_report
from dlrm.writable import output_file_problem, report_unwritable

# The largest world size planned: TorchRec's planner (1.8) took about a minute for 1024 CPU ranks of the default
# model on a 2-core host (its enumerator 27 s for 182 options, 311 partitions 23 s); both grow with the ranks
# (every option holds a shard per rank, every partition deep-copies the per-rank topology).
MAX_WORLD_SIZE = 1024
OWN_KEYS = ("world_size", "local_world_size", "out", "force")
LINK_FLAG = "--link-gbps"
ESTIMATE_FLAG = "--estimate"
STEP_MS_FLAG = "--step-ms"


# flag -> (key in the parsed options, what to give when the value is not a positive number)
NUMBER_FLAGS = {
    LINK_FLAG: (
        "link_gbps",
        f"give the link rate in Gb/s per direction per rank, e.g. {LINK_FLAG} 400 (400 Gb/s InfiniBand) or 3600 "
        "(NVLink on H200, 450 GB/s)",
    ),
    STEP_MS_FLAG: (
        "step_ms",
        "give the ms of one training step per GPU at this per-GPU batch, measured without collectives "
        "(bench.throughput on one GPU)",
    ),
}


def _split_args(argv: Sequence[str]) -> Tuple[dict, List[str]]:
    """``key=value`` of :data:`OWN_KEYS`, ``--link-gbps R`` / ``--step-ms X`` (or ``--flag=value``) and
    ``--estimate`` apart from the overrides.

    Raises:
        ConfigError: ``--link-gbps`` or ``--step-ms`` without a positive number after it; ``--step-ms`` without
            ``--estimate``; ``world_size`` or ``local_world_size`` not a whole number; ``force`` not true or false;
            one of these given twice; a setting or override written with a leading ``--``, or another unknown
            ``--`` option.
    """
    own, overrides = {}, []
    given: dict = {}  # own key or flag -> the value first given, to refuse a second one
    args = list(argv)
    while args:
        a = args.pop(0)
        key, eq, value = a.partition("=")
        if key == ESTIMATE_FLAG:
            if eq:
                raise ConfigError(f"{a}: {ESTIMATE_FLAG} takes no value; write {ESTIMATE_FLAG}")
            own["estimate"] = True
        elif key in NUMBER_FLAGS:
            name, hint = NUMBER_FLAGS[key]
            value = value if eq else (args.pop(0) if args else "")
            _once(given, key, value, key)
            try:
                number = float(value)
            except ValueError:
                number = 0.0
            if not number > 0:
                raise ConfigError(f"{key}: got {value!r}; {hint}")
            own[name] = number
        elif key.startswith("--"):
            raise _dashed(a, args)
        elif eq and key in OWN_KEYS:
            _once(given, key, value, f"config key `{key}`")
            if key == "out":
                own[key] = value
            elif key == "force":
                if value.lower() not in ("true", "false"):
                    raise ConfigError(f"config key `force`: got {value!r}; give true or false, e.g. force=true")
                own[key] = value.lower() == "true"
            else:
                try:
                    own[key] = int(value)
                except ValueError:
                    raise ConfigError(
                        f"config key `{key}`: got {value!r}; give a number of ranks, e.g. {key}=8"
                    ) from None
        else:
            overrides.append(a)
    if "step_ms" in own and not own.get("estimate"):
        raise ConfigError(f"{STEP_MS_FLAG}: sets the step time of {ESTIMATE_FLAG}; add {ESTIMATE_FLAG}, or drop it")
    return own, overrides


def _once(given: dict, key: str, value: str, what: str) -> None:
    """Record ``key=value``; a second value would otherwise silently replace the first.

    Raises:
        ConfigError: ``key`` was given before (``what`` names it).
    """
    if key in given:
        raise ConfigError(f"{what}: given twice ({given[key]!r}, then {value!r}); give it once")
    given[key] = value


def _dashed(arg: str, rest: Sequence[str]) -> ConfigError:
    """The error for ``arg``, a ``--`` option that is none of the flags: a setting or override written with a
    leading ``--`` (Hydra's own message for it is a lexer error) gets the spelling without it."""
    body = arg[2:]
    key, eq, _ = body.partition("=")
    known = key in OWN_KEYS or (bool(key) and unknown_key_error(key) is None)
    if eq and key:
        fixed = body
    elif key == "force":
        fixed = "force=true"
    elif known:
        fixed = f"{key}={rest[0] if rest and not rest[0].startswith('-') else '<value>'}"
    else:
        return ConfigError(
            f"{arg}: unknown option; the options are {LINK_FLAG} R, {STEP_MS_FLAG} X and {ESTIMATE_FLAG} (settings "
            "and overrides are key=value, e.g. world_size=2)"
        )
    return ConfigError(f"{arg}: write {fixed} (settings and overrides take no leading --)")


def plan_job(overrides: Sequence[str], world_size: int = 1, local_world_size: Optional[int] = None) -> PlanInfo:
    """Compose the config and plan its model for ``world_size`` ranks (``local_world_size`` per host; None: one
    host).

    Raises:
        ConfigError / PlanError: a bad config, ``world_size`` below 1, a ``local_world_size`` below 1 or not dividing
            ``world_size``, or an impossible plan; the message names the key or table.
    """
    return _plan_job(overrides, world_size, local_world_size)[0]


def _plan_job(
    overrides: Sequence[str], world_size: int, local_world_size: Optional[int]
) -> Tuple[PlanInfo, Config, torch.nn.Module, int]:
    """:func:`plan_job`, also returning the config, the model (tables on meta) and the batch per rank."""
    cfg = to_config(compose(list(overrides)))
    if world_size < 1:
        raise ConfigError(f"config key `world_size`: must be >= 1 (got {world_size})")
    if world_size > MAX_WORLD_SIZE:
        raise ConfigError(
            f"config key `world_size`: {world_size} ranks is more than this planner plans ({MAX_WORLD_SIZE}): "
            "TorchRec's planner copies every rank's state for each of its hundreds of proposals, so its time grows "
            f"with the world size (about a minute at {MAX_WORLD_SIZE}, far longer beyond); plan for at most "
            f"{MAX_WORLD_SIZE} ranks"
        )
    if local_world_size is not None and (local_world_size < 1 or world_size % local_world_size):
        raise ConfigError(
            f"config key `local_world_size`: must be >= 1 and divide world_size={world_size} (got "
            f"{local_world_size}); give the ranks per host, e.g. local_world_size=8"
        )
    local = world_size if local_world_size is None else local_world_size
    if cfg.device == "cuda":
        device = torch.device("cuda")
    elif cfg.device == "cpu":
        device = torch.device("cpu")
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batch = per_rank_batch(cfg.data, world_size)
    model = build_model(cfg.model, dense_device=torch.device("meta"), perf=cfg.perf)
    fuse_embedding_optimizer(model, cfg.optimizer)
    pooling = {
        f"t_{f}": float(m if cfg.data.multi_hot else 1) for f, m in zip(FEATURE_NAMES, cfg.model.multi_hot_sizes)
    }
    tables = table_configs(cfg.model)
    pi = plan_model(
        model,
        cfg.sharding,
        world_size=world_size,
        local_world_size=local,
        device=device,
        batch_size=batch,
        sparse_type=cfg.optimizer.sparse_type,
        pooling_factors=pooling,
        constraint_hook=lambda c: offload_constraints(cfg.offload, tables, base=c),
    )
    return pi, cfg, model, batch


def dataset_epoch(cfg: Config, table_rows: Sequence[int]) -> Tuple[int, int, str]:
    """The epoch of the configured data: ``(training rows, validation rows, what they are)``.

    ``data=synthetic``: ``data.num_train_samples`` / ``num_val_samples``. ``data=criteo_binary``: the rows of
    ``data.dataset_dir``'s ``meta.json`` (MLPerf split rule, ``data.max_rows`` applied), its table rows checked
    against the model's as the trainer does. ``data=criteo_tsv``: ``data.max_rows`` or the lines of
    ``data.train_path``, validated by ``data.val_path``'s lines or the ``data.val_fraction`` split.

    Raises:
        BinaryFormatError: ``data.dataset_dir`` has no usable ``meta.json``, or other table rows than the model.
        FileNotFoundError / InputError: a ``criteo_tsv`` path that is not a file.
    """
    d = cfg.data
    if d.name == "synthetic":
        return d.num_train_samples, d.num_val_samples, "the synthetic data"
    if d.name == "criteo_binary":
        assert d.dataset_dir is not None  # the config refuses criteo_binary without it
        from dlrm.data import binary

        meta = binary.read_dataset_meta(d.dataset_dir)
        binary.check_table_rows(meta, d.dataset_dir, table_rows)
        r = binary.split_ranges(meta, d.dataset_dir)
        train = sum(stop - first for _, first, stop in r["train"])
        train = min(train, d.max_rows) if d.max_rows else train
        val = sum(stop - first for _, first, stop in r["val"])
        return train, val, d.dataset_dir
    from dlrm.data import held_out_rows
    from dlrm.data.criteo_tsv import check_file, count_rows

    assert d.train_path is not None  # the config refuses criteo_tsv without it
    check_file(d.train_path)
    rows = count_rows(d.train_path)
    if d.val_path:
        check_file(d.val_path, "data.val_path")
        return min(rows, d.max_rows or rows), count_rows(d.val_path), d.train_path
    # as dlrm.data.load_criteo_tsv splits the rows it reads
    want = d.max_rows + held_out_rows(d.max_rows, d.val_fraction) if d.max_rows else rows
    read = min(rows, want)
    if d.max_rows and read == want:
        train = d.max_rows
    else:
        train = int(round(read * (1.0 - d.val_fraction)))
        train = min(train, d.max_rows) if d.max_rows else train
    return train, read - train, d.train_path


def _estimate(cfg: Config, pi: PlanInfo, traffic: StepTraffic, batch: int, own: dict) -> str:
    """The ``--estimate`` block (:mod:`dlrm.estimate`) for this plan: the step's compute from ``--step-ms`` or
    the measured one-GPU figures (:func:`dlrm.estimate.step_kind`: eager, ``pipeline=graphed`` on one rank, or the
    several-rank graph; skewed ids for real Criteo data where measured), its collectives from ``dlrm.traffic``.

    Raises:
        ConfigError: no measured figure for this config and no ``--step-ms``, or ``pipeline=graphed`` with a
            config or plan the graph refuses (:func:`dlrm.graphed.check_graphed`); named after ``--estimate``.
    """
    intra, inter = link_rates("cuda", own.get("link_gbps"))
    assert intra is not None and inter is not None
    comm_ms = traffic.step_seconds(intra, inter) * 1e3
    kind = est.step_kind(cfg.pipeline.name == "graphed", pi.world_size)
    if "step_ms" in own:
        compute, source = own["step_ms"], STEP_MS_FLAG
    else:
        graphed = cfg.pipeline.name == "graphed"
        if cfg.perf.name != "fast":
            raise ConfigError(
                f"{ESTIMATE_FLAG}: measured figures are for perf=fast (this config: perf={cfg.perf.name}); give "
                "--step-ms"
            )
        if graphed:  # the trainer refuses what the graph cannot replay: so does the estimate
            try:
                check_graphed(cfg, pi.world_size, torch.device("cuda"), sharding_types_of(pi.plan))
            except ConfigError as e:
                raise ConfigError(f"{ESTIMATE_FLAG}: {e}") from None
        try:
            compute, skewed = est.step_ms(
                cfg.optimizer.sparse_type, kind, batch, skewed=cfg.data.name in est.CRITEO_DATA
            )
        except ValueError as e:  # no measured figure for this optimizer or batch
            raise ConfigError(f"{ESTIMATE_FLAG}: {e}") from None
        source = est.step_source(kind, skewed)
        if kind == est.GRAPHED_RANKS:  # row-split tables: whole bags looked up on every rank (of the host)
            ids = {s: sum(t.ids_per_sample for t in traffic.tables if t.sharding_type == s) for s in WHOLE_BAGS}
            extra = est.whole_bag_tbe_ms(
                batch,
                pi.world_size,
                ids["row_wise"],
                sum(t.ids_per_sample for t in traffic.tables),
                ids["table_row_wise"],
                traffic.local_world_size,
            )
            if extra:
                compute += extra
                what = " and ".join(s for s in WHOLE_BAGS if ids[s])
                source += f"; + {extra:.2f} ms of TBE for {what} tables' whole bags, estimated"
    train, val, what = dataset_epoch(cfg, cfg.model.table_rows)
    e = est.estimate(
        batch * pi.world_size, pi.world_size, compute, comm_ms, train_samples=train, eval_samples=val, eval_kind=kind
    )
    return est.format_estimate(e, source, dataset=what)


def _check_out(out: str, force: bool) -> None:
    """Refuse an ``out=`` that cannot be written, or that exists without ``force=true``, before the planner runs.

    Raises:
        ConfigError: ``out`` is empty or a directory, its directory does not exist or is not writable, or it
            exists and ``force`` is false (a hand-balanced plan such as conf/plans/*.json would be lost) or it
            is not writable.
    """
    why = output_file_problem(out, overwrite=force)
    if why == "already exists":
        raise ConfigError(
            f"config key `out`: {out!r}: already exists; pass another path, or force=true to overwrite it"
        )
    if why is not None:
        raise ConfigError(f"config key `out`: {out!r}: {why}; give the plan.json file to write, e.g. out=plan.json")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m dlrm.plan [OVERRIDES] [world_size=N] ...`` (module docstring; ``sys.argv`` when ``argv`` is None);
    returns the exit status: 0, or 2 after one ``error:`` line on stderr for a config, plan or estimate error."""
    # TorchRec's planner warns about meta-device dry runs, direct Topology construction and, on the root logger,
    # data_parallel tables having no sharding spec: noise here (basicConfig is a no-op once root has a handler).
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    try:
        own, overrides = _split_args(args)
        if "out" in own:
            _check_out(own["out"], own.get("force", False))
        cfg = to_config(compose(list(overrides)))
        dataset_epoch(cfg, cfg.model.table_rows)  # the data it names is usable: checked before planning
        pi, cfg, model, batch = _plan_job(
            overrides,
            own.get("world_size", 1),
            own.get("local_world_size"),
        )
    except (InputError, FileNotFoundError, HydraException, OmegaConfBaseException) as e:
        # ConfigError and PlanError are InputErrors; any other exception is a defect and keeps its traceback
        print(f"error: {error_line(e)}", file=sys.stderr)  # Hydra's: a misspelt key, a value of the wrong type
        return 2
    print(format_plan(pi))
    traffic = model_traffic(
        cfg, pi.plan, model, world_size=pi.world_size, local_world_size=pi.local_world_size, batch_size=batch
    )
    print(traffic_report(traffic, pi.compute_device, own.get("link_gbps")))
    if own.get("estimate"):
        try:
            print(_estimate(cfg, pi, traffic, batch, own))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if "out" in own:
        try:
            save_plan(pi, own["out"])
        except OSError as e:  # checked writable above; e.g. the disk filled up
            return report_unwritable("config key `out`:", own["out"], e.strerror or e)
        print(f"wrote {own['out']} (train with it: sharding.plan_path={own['out']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
