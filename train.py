"""DLRM-v2 training entry point (Hydra).

    python train.py                                            # synthetic MLPerf-shaped data, small model, CPU ok
    python train.py experiment=criteo_sample data.train_path=../shared/data/criteo/kaggle_train_head10k.tsv
    torchrun --nproc_per_node 2 train.py trainer.max_steps=100
    torchx run -s local_cwd dist.ddp -j 1x2 --script train.py -- trainer.max_steps=100
    python train.py --cfg job                                  # print the composed config and exit

It only composes the config and hands it to ``dlrm.trainer.Trainer``; see README.md for every key.
"""

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from dlrm.config import register_configs

register_configs()

if int(os.environ.get("RANK", "0")) != 0:
    # Only rank 0 writes into the run directory; other ranks keep Hydra from writing .hydra/ there.
    sys.argv.append("hydra.output_subdir=null")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from dlrm.dist import shutdown
    from dlrm.trainer import Trainer

    trainer = Trainer(cfg, run_dir=HydraConfig.get().runtime.output_dir)
    try:
        trainer.setup()
        trainer.fit()
    finally:
        trainer.close()
        shutdown()


if __name__ == "__main__":
    main()
