"""Stage 5, run: the training loop, its config, checkpoints, run directory, metrics log and data preparation.

Nothing in the earlier stages imports this package; only :mod:`drmas_train.commands` and ``drmas_train.cli`` do.
"""
