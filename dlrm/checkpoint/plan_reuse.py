"""A resume on the layout a checkpoint was planned for loads into its saved ``plan.json`` instead of planning anew."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Dict, Optional

from dlrm.checkpoint.layout import META, PLAN
from dlrm.checkpoint.reader import read_checkpoint_meta
from dlrm.config import Config
from dlrm.process_group import DistInfo

log = logging.getLogger(__name__)


def planning_inputs(cfg: Config, global_batch: int) -> Dict[str, Any]:
    """What the plan is a function of, besides the world layout: the model, ``sharding.*`` (but a given
    ``plan_path``), ``offload.*``, the table dtype, the embedding optimizer, the global batch and the bag sizes;
    JSON-normalised, as ``meta.json`` stores it."""
    sharding = dataclasses.asdict(cfg.sharding)
    sharding.pop("plan_path")
    doc = {
        "model": dataclasses.asdict(cfg.model),
        "sharding": sharding,
        "offload": dataclasses.asdict(cfg.offload),
        "embedding_dtype": cfg.perf.embedding_dtype,
        "sparse_type": cfg.optimizer.sparse_type,
        "global_batch": global_batch,
        "multi_hot": cfg.data.multi_hot,
    }
    return json.loads(json.dumps(doc, default=str))


def saved_plan(path: str, info: DistInfo, inputs: Dict[str, Any]) -> Optional[str]:
    """The ``plan.json`` saved with checkpoint ``path`` when this job has the layout it was planned for (world
    size, ranks per host, device type) and the same :func:`planning_inputs`, else None (logged: the job plans
    anew; a ``plan.json`` or ``meta.json`` that cannot be read or lacks those fields is a warning)."""
    plan = os.path.join(path, PLAN)
    if not os.path.isfile(plan):
        return None
    try:
        with open(plan, encoding="utf-8") as f:
            doc = json.load(f)
        had = (doc["world_size"], doc["local_world_size"], doc["compute_device"])
        planning = read_checkpoint_meta(path).get("planning")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning(
            "checkpoint %s: %s or %s is unreadable or incomplete (%s: %s); planning anew",
            path,
            PLAN,
            META,
            type(e).__name__,
            e,
        )
        return None
    now = (info.world_size, info.local_world_size, info.device.type)
    if had != now:
        log.info(
            "checkpoint %s was planned for %s ranks (%s per host) on %s and this job has %d (%d per host) on "
            "%s: planning anew",
            path,
            *had,
            *now,
        )
        return None
    if planning != inputs:
        log.info("checkpoint %s was planned for another model, sharding, offload or batch config: planning anew", path)
        return None
    log.info("resuming into the plan saved with %s (fingerprint %s)", path, doc.get("fingerprint", "?"))
    return plan
