"""DLRM-v2 training entry point (Hydra).

    python train.py                                            # synthetic MLPerf-shaped data, small model, CPU ok
    python train.py experiment=criteo_sample data.train_path=/path/to/train_head10k.tsv
    torchrun --nproc_per_node 2 train.py trainer.max_steps=100
    torchx run -s local_cwd dist.ddp -j 1x2 --script train.py -- trainer.max_steps=100
    torchx run -s local_cwd launch/components.py:trainer -j 1x2 -- trainer.max_steps=100
    python train.py --cfg job                                  # print the composed config and exit

It only hands off to ``dlrm.cli.main`` (also the ``dlrm-train`` console script): the run directory is named from
the job (``outputs/<torchx app id or torchrun run id>``, see ``dlrm/cli.py``), Hydra composes the config and
``dlrm.trainer.Trainer`` runs it; every key is in docs/configuration.md.
"""

from dlrm.cli import main

if __name__ == "__main__":
    main()
