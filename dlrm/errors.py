"""The trainer's exception classes that every module shares.

:class:`InputError` is the base of every user error: the command line (``dlrm/cli.py``) prints its message as one
``error:`` line and exits with status 2, with no traceback. Module-specific subclasses (``CheckpointError``,
``PlanError``, ``StorageError``, ...) live beside the code that raises them.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from the user: a config value, a data file, a plan, a checkpoint. The message names the key, file,
    row, feature or table, and the fix; the command line prints it as one ``error:`` line and exits with status 2
    (``dlrm/cli.py``), with no traceback."""


class ConfigError(InputError):
    """A config value is invalid; the message names the key and the fix."""


class UnsupportedVersionError(ImportError):
    """The installed TorchRec is not one the trainer's use of its internals was verified on
    (:mod:`dlrm.torchrec_compat`); the message names both and the fix."""
