"""Floor 9, run (above floors 0-8): the training loop, its config, checkpoints, run directory and metrics
log (data preparation is ``drmas_train.data``, floor 1).

Nothing on a lower floor imports this package; only :mod:`drmas_train.commands` and ``drmas_train.cli`` do.
"""
