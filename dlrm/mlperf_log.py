"""MLPerf ``mllog`` lines for the ``dlrm_dcnv2`` benchmark, written with the ``mlperf-logging`` package.

Turned on by ``logger=[stdout,jsonl,mlperf]`` (``logger.mlperf.enabled=true``); rank 0 writes
``<run_dir>/mlperf.log``. Check a run with the package's compliance checker (rulesets 5.1.0 and 6.0.0 hold
dlrm_dcnv2, with the same rules; 6.1.0 has none)::

    python -m mlperf_logging.compliance_checker --usage training --ruleset 5.1.0 <run_dir>/mlperf.log

What is logged (keys from ``mlperf_logging.mllog.constants``): cache_clear, init_start/stop, the submission keys,
seed, the hyperparameters the dlrm_dcnv2 rules check (global_batch_size, opt_name adagrad, opt_base_learning_rate,
opt_adagrad_learning_rate_decay 0, opt_weight_decay 0, opt_adagrad_initial_accumulator_value 0, opt_adagrad_epsilon,
the warmup/decay steps), train_samples, eval_samples, gradient_accumulation_steps 1, and
opt_sparse_base_learning_rate when :meth:`MlperfLogger.hyperparameters` is given the tables' own rate
(``optimizer.sparse_lr``; the dlrm_dcnv2 rules do not check this key), run_start, block_start/stop per evaluation
interval, eval_start (before the evaluation) and eval_accuracy/eval_stop (after it) with ``epoch_num`` as a fraction
of the epoch (MLPerf: 0.05 ... 1.0 with 20 evaluations per epoch), run_stop with status success or aborted: the
trainer logs success when ``eval.target_auc`` was reached, and also when it is null (a run without a target that
trained to its end), aborted when a target was set and not reached, as training ends (before the final checkpoint
and any test split, which are not timed); a run that SIGTERM ends early logs no run_stop.
``cache_clear`` is logged as true: the MLPerf rules ask to flush the page cache before each run (README).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional

MLLOG_LOGGER = "dlrm.mllog"  # writes mlperf.log only


class MlperfLogger:
    """Thin wrapper over ``mllog`` that is a no-op when disabled or off rank 0.

    Args:
        run_dir: where the log file goes.
        cfg: ``logger.mlperf`` config (``enabled``, ``file``, submission fields).
        is_main: whether this is rank 0.
    """

    def __init__(self, run_dir: str, cfg: Any, is_main: bool) -> None:
        self.on = bool(cfg.enabled) and is_main
        self.cfg = cfg
        self._m = None
        if not self.on:
            return
        from mlperf_logging import mllog

        self.c = mllog.constants
        path = os.path.join(run_dir, cfg.file)
        # mllog's default logger prints every line to stdout as well as to the file; ours writes the file only
        # (metrics.jsonl and the step lines carry the same figures), and does not propagate to train.log
        lg = logging.getLogger(MLLOG_LOGGER)
        lg.propagate = False
        lg.setLevel(logging.INFO)
        for h in list(lg.handlers):  # an earlier run's file in this process
            lg.removeHandler(h)
            h.close()
        lg.addHandler(logging.FileHandler(path))
        mllog.config(root_dir=os.path.dirname(os.path.abspath(__file__)))
        self._m = mllog.get_mllogger()
        self._m.logger = lg

    def init_start(self) -> None:
        """Log ``cache_clear``, ``init_start`` and the submission keys (benchmark ``dlrm_dcnv2``, org, division,
        status, platform from ``logger.mlperf``)."""
        if self.on:
            self._m.event(key=self.c.CACHE_CLEAR, value=True)
            self._m.start(key=self.c.INIT_START)
            self._m.event(key=self.c.SUBMISSION_BENCHMARK, value="dlrm_dcnv2")
            self._m.event(key=self.c.SUBMISSION_ORG, value=self.cfg.submission_org)
            self._m.event(key=self.c.SUBMISSION_DIVISION, value=self.cfg.submission_division)
            self._m.event(key=self.c.SUBMISSION_STATUS, value=self.cfg.submission_status)
            self._m.event(key=self.c.SUBMISSION_PLATFORM, value=self.cfg.submission_platform)

    def hyperparameters(
        self,
        *,
        global_batch: int,
        seed: int,
        lr: float,
        eps: float,
        warmup: int,
        decay_start: int,
        decay_steps: int,
        train_samples: int,
        eval_samples: int,
        sparse_lr: Optional[float] = None,
    ) -> None:
        """Log the hyperparameters the dlrm_dcnv2 compliance rules check (module docstring), one event each.

        Args:
            global_batch: samples per step over all ranks.
            seed: the run's ``seed`` (MLPerf rules: a new one per run, e.g. from ``/dev/urandom``).
            lr: base learning rate (``optimizer.lr``); eps: Adagrad epsilon.
            warmup, decay_start, decay_steps: the schedule's lengths and start, in steps.
            train_samples, eval_samples: rows of the training and validation splits.
            sparse_lr: the tables' base learning rate (``optimizer.sparse_lr``), logged as
                ``opt_sparse_base_learning_rate`` when given; None: the tables train at ``lr``.
        """
        if not self.on:
            return
        c = self.c
        values: Dict[str, Any] = {
            c.SEED: seed,
            c.GLOBAL_BATCH_SIZE: global_batch,
            c.GRADIENT_ACCUMULATION_STEPS: 1,
            c.OPT_NAME: c.ADAGRAD,
            c.OPT_BASE_LR: lr,
            c.OPT_ADAGRAD_LR_DECAY: 0,
            c.OPT_WEIGHT_DECAY: 0,
            c.OPT_ADAGRAD_INITIAL_ACCUMULATOR_VALUE: 0,
            c.OPT_ADAGRAD_EPSILON: eps,
            c.OPT_LR_WARMUP_STEPS: warmup,
            c.OPT_LR_DECAY_START_STEP: decay_start,
            c.OPT_LR_DECAY_STEPS: decay_steps,
            c.TRAIN_SAMPLES: train_samples,
            c.EVAL_SAMPLES: eval_samples,
        }
        if sparse_lr is not None:
            values[c.OPT_SPARSE_BASE_LR] = sparse_lr
        for k, v in values.items():
            self._m.event(key=k, value=v)

    def run_start(self) -> None:
        """Log ``init_stop`` and ``run_start``: set-up is over, the timed run begins."""
        if self.on:
            self._m.end(key=self.c.INIT_STOP)
            self._m.start(key=self.c.RUN_START)

    def block_start(self, epoch_num: float, samples: int) -> None:
        """Log ``block_start`` of the training up to the next evaluation: ``first_epoch_num`` ``epoch_num`` (epochs
        trained so far, a fraction), ``epoch_count`` 1, ``samples_count`` ``samples`` (training samples seen over
        all ranks)."""
        if self.on:
            self._m.start(
                key=self.c.BLOCK_START,
                metadata={"first_epoch_num": epoch_num, "epoch_count": 1, "samples_count": samples},
            )

    def block_stop(self, epoch_num: float, samples: int) -> None:
        """Log ``block_stop``: ``first_epoch_num`` ``epoch_num`` (the trainer gives epochs trained at the block's
        end, a fraction), ``samples_count`` ``samples`` (training samples seen over all ranks)."""
        if self.on:
            self._m.end(key=self.c.BLOCK_STOP, metadata={"first_epoch_num": epoch_num, "samples_count": samples})

    def eval_start(self, epoch_num: float, samples: int) -> None:
        """Log ``eval_start`` as a validation begins, at ``epoch_num`` (epochs trained, a fraction) with ``samples``
        training samples seen over all ranks."""
        if self.on:
            self._m.start(key=self.c.EVAL_START, metadata={"epoch_num": epoch_num, "samples_count": samples})

    def eval(self, epoch_num: float, auc: float, samples: int) -> None:
        """Log ``eval_accuracy`` (``auc``, the validation ROC AUC in [0, 1]) and ``eval_stop`` as a validation
        ends (after :meth:`eval_start` with the same ``epoch_num`` and ``samples``)."""
        if self.on:
            meta = {"epoch_num": epoch_num, "samples_count": samples}
            self._m.event(key=self.c.EVAL_ACCURACY, value=auc, metadata=meta)
            self._m.end(key=self.c.EVAL_STOP, metadata=meta)

    def run_stop(self, success: bool, samples: Optional[int] = None) -> None:
        """Log ``run_stop`` with status ``success`` or ``aborted`` (the caller's verdict; the trainer's is in the
        module docstring), and ``samples_count`` (training samples seen over all ranks) when given."""
        if self.on:
            meta: Dict[str, Any] = {"status": self.c.SUCCESS if success else self.c.ABORTED}
            if samples is not None:
                meta["samples_count"] = samples
            self._m.end(key=self.c.RUN_STOP, metadata=meta)
