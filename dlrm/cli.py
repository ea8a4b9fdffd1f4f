"""The trainer's command line: ``train.py`` and the ``dlrm-train`` console script (pyproject) both run :func:`main`.

    python train.py trainer.max_steps=100                          # from a checkout
    dlrm-train trainer.max_steps=100                               # after `pip install -e .`, from any directory
    torchrun --standalone --nproc_per_node 2 train.py              # run dir outputs/<torchrun's run id>
    torchx run -s local_cwd dist.ddp -j 1x2 --script train.py      # run dir outputs/<torchx app id>
    DLRM_RUN_NAME=ablation3 torchrun --nproc_per_node 2 train.py   # run dir outputs/ablation3

One run directory per job. Before Hydra starts (so no rank creates a directory it will not use), every rank
derives the same ``hydra.run.dir`` from the job: ``$DLRM_OUTPUT_ROOT/<name>`` (root default ``outputs``), where
the name is, first found: ``$DLRM_RUN_NAME`` (given by the user), the app id at the end of ``$TORCHX_JOB_ID``
(torchx sets it on every launch, ``scheduler://session/app_id``), ``$TORCHELASTIC_RUN_ID`` (torchrun's
``--rdzv_id``: a uuid with ``--standalone`` or a single node, the app id under torchx). A process with no job
name (``python train.py``) keeps the config's timestamped ``outputs/<date>/<time>``. An explicit
``hydra.run.dir=...`` on the command line always wins. Only rank 0 lets Hydra write ``.hydra/`` there.

Why our own code: Hydra resolves ``hydra.run.dir`` separately in every process, and a ``${now:...}`` name differs
between ranks that start a second apart; no Hydra or torchrun option names the directory after the job.
"""

import os
import re
import shutil
import sys
from typing import List, Mapping, Optional, Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from dlrm.config import CONF_DIR, compose, error_line, register_configs
from dlrm.errors import InputError
from dlrm.process_group import env_int
from dlrm.rundir import LOCK_NAME, make_dir, probe

RUN_NAME_ENV = "DLRM_RUN_NAME"
OUTPUT_ROOT_ENV = "DLRM_OUTPUT_ROOT"
DEFAULT_OUTPUT_ROOT = "outputs"
# torchrun's default --rdzv_id (static rendezvous without an id): the same string for every job, so not a name.
_NO_RUN_ID = {"", "none"}
_NAME_OK = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def job_name(env: Mapping[str, str]) -> Optional[str]:
    """The name every rank of this job agrees on, or ``None`` for a process started by hand.

    Args:
        env: the process environment (``os.environ``).

    Returns:
        ``$DLRM_RUN_NAME``, else the last ``/`` part of ``$TORCHX_JOB_ID``, else ``$TORCHELASTIC_RUN_ID`` unless
        it is torchrun's placeholder ``none``; scheduler ids have characters outside ``[A-Za-z0-9._-]`` replaced
        by ``_``.

    Raises:
        InputError: ``$DLRM_RUN_NAME`` is not a plain directory name (``[A-Za-z0-9][A-Za-z0-9._-]*``).
    """
    user = env.get(RUN_NAME_ENV)
    if user is not None:
        if not _NAME_OK.fullmatch(user):
            raise InputError(
                f"environment variable ${RUN_NAME_ENV}={user!r} is not a plain directory name; set it to letters, "
                f"digits, '.', '_' and '-', starting with a letter or digit, or unset it (for another parent "
                f"directory set ${OUTPUT_ROOT_ENV})"
            )
        return user
    for value in (env.get("TORCHX_JOB_ID", "").rstrip("/").rpartition("/")[2], env.get("TORCHELASTIC_RUN_ID", "")):
        if value.strip().lower() not in _NO_RUN_ID:
            return re.sub(r"[^A-Za-z0-9._-]", "_", value.strip()).lstrip(".-_") or None
    return None


def _has_override(argv: Sequence[str], key: str) -> bool:
    return any(a.lstrip("+~").startswith(key + "=") for a in argv)


def _quote(path: str) -> str:
    """Quote a path for Hydra's override grammar (``=``, ``,``, spaces and brackets would split it); the path has
    no quote or backslash (job names cannot, and :func:`run_dir_overrides` refuses them in the root)."""
    return f"'{path}'"


def run_dir_overrides(argv: Sequence[str], env: Mapping[str, str]) -> List[str]:
    """Hydra overrides that place this process's output, to append to ``argv``.

    Args:
        argv: the command-line arguments (without the program name).
        env: the process environment; ``RANK`` (default 0) tells the rank.

    Returns:
        ``hydra.output_subdir=null`` on ranks other than 0 (Hydra's ``.hydra/`` record comes from rank 0 only);
        ``hydra.run.dir=<root>/<job_name>`` when the job has a name (see :func:`job_name`); without one, on
        ranks other than 0, ``hydra.run.dir=<root>`` (the Trainer takes rank 0's directory, so no other rank
        makes a timestamped one of its own), and on rank 0 the timestamped default under ``<root>`` when
        ``$DLRM_OUTPUT_ROOT`` is set. Nothing about the run dir when ``argv`` sets ``hydra.run.dir``.

    Raises:
        InputError: ``$DLRM_RUN_NAME`` is not a plain directory name, or ``$DLRM_OUTPUT_ROOT`` holds a quote or
            a backslash (Hydra's override grammar cannot quote them); the message names the variable and the fix.
            ``RANK`` is not a whole number.
    """
    rank = env_int(env, "RANK", "0")  # the rest of the launch variables: dlrm.process_group.launch_env
    out: List[str] = []
    if rank != 0 and not _has_override(argv, "hydra.output_subdir"):
        out.append("hydra.output_subdir=null")
    if _has_override(argv, "hydra.run.dir"):
        return out
    root = env.get(OUTPUT_ROOT_ENV) or DEFAULT_OUTPUT_ROOT
    if "'" in root or "\\" in root:
        raise InputError(
            f"environment variable ${OUTPUT_ROOT_ENV}={root!r}: quotes and backslashes are not supported in the "
            f"output root; set it to a directory without them (or pass hydra.run.dir=<dir>)"
        )
    name = job_name(env)
    if name is not None:
        out.append(f"hydra.run.dir={_quote(os.path.join(root, name))}")
    elif rank != 0:
        out.append(f"hydra.run.dir={_quote(root)}")
    elif OUTPUT_ROOT_ENV in env:
        out.append(f"hydra.run.dir={_quote(root + '/${now:%Y-%m-%d}/${now:%H-%M-%S}')}")
    return out


def check_run_dir(argv: Sequence[str], overrides: Sequence[str], env: Mapping[str, str]) -> bool:
    """Create the run directory's fixed part (up to any ``${now:...}``) now, so that a path that cannot be one
    stops the run with one line instead of Hydra's traceback; refuse a run directory that a live run of another
    job owns (:func:`dlrm.rundir.probe`) before Hydra writes into it.

    Returns:
        Whether this launch makes the run directory (a timestamped one always; a named one that does not exist
        yet): a refused launch then removes it again (:func:`remove_refused_run_dir`).

    Raises:
        InputError: the directory cannot be made (a file in its way, no permission), naming ``hydra.run.dir`` or
            ``$DLRM_OUTPUT_ROOT`` (whichever gave it); a live run owns it (``ConfigError``).
    """
    given = [a for a in argv if a.lstrip("+").startswith("hydra.run.dir=")]
    made = [a for a in overrides if a.startswith("hydra.run.dir=")]
    if given:
        where, path = "config key `hydra.run.dir`", given[-1].split("=", 1)[1]
    elif made:
        where, path = f"environment variable ${OUTPUT_ROOT_ENV}", made[-1].split("=", 1)[1]
    else:
        where, path = f"environment variable ${OUTPUT_ROOT_ENV} (default {DEFAULT_OUTPUT_ROOT})", DEFAULT_OUTPUT_ROOT
    fixed = path.strip("'\"").split("${", 1)[0] or "."
    new = "${" in path or not (given or made) or not os.path.exists(fixed)
    if os.path.exists(fixed) and not os.path.isdir(fixed):
        raise InputError(f"{where}: the run directory {fixed} is a file; give a directory")
    make_dir(fixed, f"{where}: cannot make the run directory {fixed}", "give a writable directory")
    if "${" not in path:  # a live run of another job owns it: refuse before Hydra rewrites its .hydra/
        probe(fixed, "hydra.run.dir", env)
    return new


register_configs()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    """Hand the composed config to :class:`dlrm.trainer.Trainer` (set up, train, close on every exit path)."""
    from dlrm.errors import InputError, UnsupportedVersionError
    from dlrm.loggers import log_error_to_file
    from dlrm.process_group import shutdown

    try:
        from dlrm.trainer import Trainer
    except UnsupportedVersionError as e:  # dlrm.torchrec_compat refuses a TorchRec it was not verified on
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)

    trainer: Optional[Trainer] = None
    ok = False
    failure: Optional[BaseException] = None
    try:
        trainer = Trainer(cfg, run_dir=HydraConfig.get().runtime.output_dir)  # validates the config
        trainer.setup()
        trainer.fit()
        ok = True
    except (InputError, FileNotFoundError, FloatingPointError) as e:
        # bad input, named with its config key / file / row / table and the fix, or a diverged loss (every rank
        # raises at the same step): the message, no traceback, and the same line in train.log (rank 0's log
        # file, when set up) so that a batch job's log shows it
        failure = e
        log_error_to_file(f"error: {e}")
    finally:
        if trainer is not None:
            try:
                trainer.close()
            except InputError as e:  # the last async save failed on a full disk: its one line
                ok, failure = False, failure or e
                log_error_to_file(f"error: {e}")
        shutdown(barrier=ok)
    if failure is not None:
        print(f"error: {failure}", file=sys.stderr, flush=True)
        if _new_run_dir and not isinstance(failure, FloatingPointError) and env_int(os.environ, "RANK", "0") == 0:
            remove_refused_run_dir(HydraConfig.get().runtime.output_dir)
        sys.exit(1 if isinstance(failure, FloatingPointError) else 2)


_new_run_dir = False  # main(): this launch makes its run directory (see check_run_dir)


def remove_refused_run_dir(run_dir: str) -> bool:
    """Remove the run directory that a refused launch made, when it holds nothing of a run: no metrics record, no
    checkpoint and no owner's record (only Hydra's ``.hydra/``, ``train.log`` with the error, this launch's
    released ``owner.lock``, and what set-up made before the refusal; a launch that started at the same moment and
    owns it keeps it). Returns whether it was removed."""
    metrics, owner = os.path.join(run_dir, "metrics.jsonl"), os.path.join(run_dir, LOCK_NAME)
    if (
        os.path.isdir(os.path.join(run_dir, "checkpoints"))
        or (os.path.isfile(metrics) and os.path.getsize(metrics))
        or (os.path.isfile(owner) and os.path.getsize(owner))
    ):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return not os.path.exists(run_dir)


def check_overrides(argv: Sequence[str]) -> None:
    """Compose the config with the command line's overrides once before Hydra's app starts, so that a misspelt
    key, a value of the wrong type or an unknown group option is one ``error:`` line (exit 2) instead of Hydra's
    multi-line message. With a flag (``--cfg``, ``--multirun``, ...) or a sweep (``optimizer.lr=0.1,0.2``) with
    ``hydra.mode=MULTIRUN`` nothing is checked here: Hydra composes each job itself.

    Raises:
        InputError: the overrides do not compose (the message is Hydra's, on one line), or a sweep without
            ``--multirun``.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if any(a.startswith("-") for a in argv):
        return
    try:
        sweeps = [o for o in OverridesParser.create().parse_overrides(list(argv)) if o.is_sweep_override()]
        if sweeps and not any(a.replace(" ", "") == "hydra.mode=MULTIRUN" for a in argv):
            o = sweeps[0]
            raise InputError(
                f"config key `{o.get_key_element()}`: {o.input_line} is a sweep, one job per "
                "value; add --multirun (or hydra.mode=MULTIRUN) to run them, or give one value"
            )
        if sweeps:
            return
        compose(list(argv), CONF_DIR)
    except (HydraException, OmegaConfBaseException) as e:
        raise InputError(error_line(e)) from e


def main() -> None:
    """Entry point of ``train.py`` and ``dlrm-train``: name the run directory from the job, then run Hydra.

    A bad ``$DLRM_RUN_NAME`` or ``$DLRM_OUTPUT_ROOT``, or overrides that do not compose
    (:func:`check_overrides`), stop it before Hydra starts: one ``error:`` line, exit 2. A diverged training loss
    ends the run with its ``error:`` line and exit 1. A launch refused with exit 2 removes the run directory it
    made, unless it holds a metrics record or a checkpoint (:func:`remove_refused_run_dir`).
    """
    global _new_run_dir
    try:
        check_overrides(sys.argv[1:])
        overrides = run_dir_overrides(sys.argv[1:], os.environ)
        _new_run_dir = check_run_dir(sys.argv[1:], overrides, os.environ)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    sys.argv.extend(overrides)
    hydra_main()


if __name__ == "__main__":
    main()
