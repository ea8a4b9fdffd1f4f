"""The training loop: set up (process group, data, model, plan, DMP, optimizers, pipeline), train, evaluate.

``train.py`` composes the config with Hydra and hands it here::

    python train.py                                   # synthetic default, 1 process
    torchrun --nproc_per_node 2 train.py              # same, 2 processes (gloo on CPU, NCCL on GPU)

Why our own loop rather than a generic one: the loop is this project's subject (pipelined sparse dist with
in-training evaluation, per-rank data layout, TorchRec's fused optimizers); everything around it is a library
(Hydra, TorchRec planner / DMP / pipelines, torchmetrics).
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any, Dict, Iterator, Optional

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torchrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist
from torchrec.optim.keyed import CombinedOptimizer

from dlrm import data as data_mod
from dlrm.config import Config, to_config
from dlrm.dist import DistInfo, init_distributed
from dlrm.loggers import MetricsLogger, setup_logging
from dlrm.metrics import EvalAccumulator
from dlrm.model import FEATURE_NAMES, build_model
from dlrm.sharding import dense_optimizer, format_plan, save_plan, shard

log = logging.getLogger(__name__)


class Trainer:
    """Owns one run. Call :meth:`fit`; :meth:`close` runs on every exit path (``train.py`` uses try/finally).

    Args:
        cfg: composed config (``DictConfig`` from Hydra or a :class:`Config`).
        run_dir: directory for ``config.yaml``, ``metrics.jsonl`` and ``train.log`` (rank 0 writes them).
    """

    def __init__(self, cfg: DictConfig | Config, run_dir: str) -> None:
        self.raw_cfg = cfg
        self.cfg: Config = to_config(cfg)
        self.run_dir = run_dir
        self.info: Optional[DistInfo] = None
        self.metrics: Optional[MetricsLogger] = None
        self.step = 0
        self.samples_seen = 0
        self.history: list = []

    # ------------------------------------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg = self.cfg
        self.info = info = init_distributed(cfg.device)
        self.run_dir = self._agree_run_dir(self.run_dir)
        if info.is_main:
            os.makedirs(self.run_dir, exist_ok=True)
        setup_logging(info.rank, self.run_dir)
        if info.is_main:
            resolved = (OmegaConf.to_yaml(self.raw_cfg, resolve=True) if isinstance(self.raw_cfg, DictConfig)
                        else OmegaConf.to_yaml(OmegaConf.structured(cfg)))
            with open(os.path.join(self.run_dir, "config.yaml"), "w", encoding="utf-8") as f:
                f.write(resolved)
        self.metrics = MetricsLogger(self.run_dir, info.is_main, cfg.logger.stdout)

        gb = cfg.data.global_batch_size
        if gb is not None and gb % info.world_size:
            raise ValueError(f"config key `data.global_batch_size`: {gb} does not divide over "
                             f"{info.world_size} ranks; use a multiple of the world size")
        self.batch_size = gb // info.world_size if gb else cfg.data.batch_size
        self.global_batch = self.batch_size * info.world_size
        self.eval_batch_size = cfg.eval.batch_size or self.batch_size

        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        self.train_split, self.val_split = data_mod.load_splits(cfg.data, cfg.model, cfg.seed)
        self.multi_hot = (data_mod.MultiHot(cfg.model.table_rows, cfg.model.multi_hot_sizes, cfg.data.multi_hot_seed)
                          if cfg.data.multi_hot else None)
        self.steps_per_epoch = data_mod.steps_per_epoch(len(self.train_split), self.global_batch, info.world_size)
        if self.steps_per_epoch == 0:
            raise ValueError(f"the training split has {len(self.train_split)} rows, fewer than the world size "
                             f"({info.world_size}); give more rows")
        total = self.steps_per_epoch * cfg.trainer.epochs
        self.total_steps = min(total, cfg.trainer.max_steps) if cfg.trainer.max_steps else total
        log.info("data %s: %d train rows, %d val rows (%.1fs); %s ids per sample", cfg.data.name,
                 len(self.train_split), len(self.val_split), time.perf_counter() - t0,
                 sum(cfg.model.multi_hot_sizes) if self.multi_hot else len(FEATURE_NAMES))

        model = build_model(cfg.model, dense_device=info.device)
        pooling = {f"t_{f}": float(m if cfg.data.multi_hot else 1)
                   for f, m in zip(FEATURE_NAMES, cfg.model.multi_hot_sizes)}
        self.model, self.plan = shard(model, info, cfg.sharding, cfg.optimizer, self.batch_size, pooling)
        dense = dense_optimizer(self.model, cfg.optimizer)  # MLPs, and data_parallel tables
        self.optimizer = CombinedOptimizer([self.model.fused_optimizer, dense])
        pipe_cls = TrainPipelineSparseDist if cfg.pipeline.name == "sparse_dist" else TrainPipelineBase
        self.pipeline = pipe_cls(self.model, self.optimizer, info.device)

        n_params = sum(p.numel() for p in model.parameters())
        log.info("model %s (%s interaction), %.2f M parameters on rank 0 incl. local shards; world %d on %s (%s)",
                 cfg.model.name, cfg.model.interaction, n_params / 1e6, info.world_size, info.device, info.backend)
        if info.is_main:
            log.info("%s", format_plan(self.model.plan_info))
            save_plan(self.model.plan_info, os.path.join(self.run_dir, "plan.json"))
        log.info("batch %d per rank, %d global; %d steps/epoch, %d steps to run; run dir %s",
                 self.batch_size, self.global_batch, self.steps_per_epoch, self.total_steps, self.run_dir)

    def _agree_run_dir(self, run_dir: str) -> str:
        """Use rank 0's run directory everywhere; remove the empty one another rank's Hydra made (its
        timestamp can differ by a second)."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return run_dir
        obj = [run_dir]
        dist.broadcast_object_list(obj, src=0)
        if obj[0] != run_dir and os.path.isdir(run_dir):
            try:
                os.rmdir(run_dir)
            except OSError:
                pass
        return obj[0]

    # ------------------------------------------------------------------------------------------------ train
    def _train_iter(self) -> Iterator[Any]:
        cfg, info = self.cfg, self.info
        assert info is not None
        return data_mod.train_batches(
            self.train_split, global_batch=self.global_batch, rank=info.rank, world_size=info.world_size,
            epochs=cfg.trainer.epochs, max_steps=self.total_steps, feature_names=FEATURE_NAMES,
            multi_hot=self.multi_hot, shuffle=cfg.data.shuffle, seed=cfg.seed)

    def fit(self) -> Dict[str, Any]:
        """Train ``self.total_steps`` steps, validating as configured. Returns the last validation metrics."""
        if self.info is None:
            self.setup()
        cfg, info = self.cfg, self.info
        assert info is not None and self.metrics is not None
        it = self._train_iter()
        every = cfg.logger.log_every_n_steps
        window_losses = []
        window_start, window_steps, window_samples = time.perf_counter(), 0, 0
        last_val: Dict[str, Any] = {}
        t_start = time.perf_counter()
        self.model.train()
        while self.step < self.total_steps:
            out = self.pipeline.progress(it)
            loss, _logits, labels = out
            self.step += 1
            window_steps += 1
            n = int(labels.shape[0]) * info.world_size
            window_samples += n
            self.samples_seen += n
            window_losses.append(loss.detach())
            if self.step % every == 0 or self.step == self.total_steps:
                elapsed = time.perf_counter() - window_start
                mean_loss = self._global_mean(torch.stack(window_losses).float().mean())
                if not math.isfinite(mean_loss):
                    raise FloatingPointError(
                        f"non-finite training loss {mean_loss} at step {self.step} (mean of steps "
                        f"{self.step - window_steps + 1}..{self.step}); lower optimizer.lr or check the data")
                rec = {
                    "step": self.step,
                    "epoch": self.step / self.steps_per_epoch,
                    "loss": mean_loss,
                    "lr": cfg.optimizer.lr,
                    "samples_per_s": window_samples / elapsed,
                    "samples": self.samples_seen,
                    "time_s": time.perf_counter() - t_start,
                }
                self.metrics.log(rec, (
                    f"step {self.step:>6}/{self.total_steps} | epoch {rec['epoch']:.2f} | loss {mean_loss:.5f} | "
                    f"lr {rec['lr']:.3g} | {rec['samples_per_s']:,.0f} samples/s | {rec['time_s']:.1f}s"))
                self.history.append(rec)
                window_losses, window_steps, window_samples = [], 0, 0
                window_start = time.perf_counter()
            ev = cfg.eval.every_n_steps
            due = (ev and self.step % ev == 0) or (cfg.eval.at_end and self.step == self.total_steps)
            if due:
                last_val = self.evaluate()
                window_start = time.perf_counter()
        if last_val and info.is_main:
            print(f"final validation AUC {last_val['val_auc']:.4f} (logloss {last_val['val_logloss']:.5f}, "
                  f"{last_val['val_samples']:,} samples) after {self.step} steps, "
                  f"{time.perf_counter() - t_start:.1f}s", flush=True)
        return last_val

    def _global_mean(self, x: torch.Tensor) -> float:
        if dist.is_initialized() and dist.get_world_size() > 1:
            x = x.clone()
            dist.all_reduce(x)
            x /= dist.get_world_size()
        return float(x)

    # ------------------------------------------------------------------------------------------------- eval
    @torch.no_grad()
    def evaluate(self) -> Dict[str, Any]:
        """Validate on the whole validation split (all ranks); logs and returns ``val_*`` metrics."""
        info = self.info
        assert info is not None and self.metrics is not None
        t0 = time.perf_counter()
        model = self.pipeline.detach() if hasattr(self.pipeline, "detach") else self.model
        model.eval()
        acc = EvalAccumulator()
        for batch, weight in data_mod.eval_batches(
                self.val_split, batch_size=self.eval_batch_size, rank=info.rank, world_size=info.world_size,
                feature_names=FEATURE_NAMES, multi_hot=self.multi_hot):
            _, (_, logits, labels) = model(batch.to(info.device))
            acc.update(logits, labels, weight)
        res = acc.compute(info.device)
        model.train()  # the pipeline re-attaches its pipelined forwards on the next progress()
        rec = {"step": self.step, "samples": self.samples_seen, "val_auc": res["auc"],
               "val_logloss": res["logloss"], "val_samples": res["samples"], "eval_s": time.perf_counter() - t0}
        self.metrics.log(rec, f"val  {self.step:>6}/{self.total_steps} | auc {res['auc']:.4f} | "
                              f"logloss {res['logloss']:.5f} | {res['samples']:,} samples | {rec['eval_s']:.1f}s")
        self.history.append(rec)
        return rec

    # ------------------------------------------------------------------------------------------------ close
    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
