"""``python -m dlrm.config --markdown PATH``: write the configuration reference (docs/configuration.md)."""

from dlrm.config.reference import main

main()
