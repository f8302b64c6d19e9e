"""What a training run may do with its run directory, decided before any model loads.

Policy (``drmas train``):

* a **fresh** directory (absent, empty, or holding no results) is used as is;
* a directory that **holds results** of an earlier run (a non-empty ``metrics.jsonl`` or a complete checkpoint)
  is never silently truncated: the run is refused with a :class:`~drmas_train.run.config.ConfigError` (the CLI exits
  2) that names the directory and the three ways on: ``--resume`` (continue it), ``run.dir=<new dir>`` (start
  elsewhere) or ``--overwrite`` (delete its results and start again);
* ``--resume`` needs a complete checkpoint under ``<run dir>/checkpoints``; without one the run is refused the
  same way, before any model loads;
* checkpoint temp folders (``checkpoints/.tmp-iter_*``) that a kill during a checkpoint write left behind are
  deleted on every start (:func:`drmas_train.run.checkpoint.remove_partial_checkpoints`).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from drmas_train.run.checkpoint import latest_checkpoint, remove_partial_checkpoints
from drmas_train.run.config import ConfigError

__all__ = ["RESULT_FILES", "holds_results", "prepare_run_dir"]

logger = logging.getLogger(__name__)

#: what ``--overwrite`` deletes: everything a run writes into its directory.
RESULT_FILES = ("metrics.jsonl", "checkpoints", "tensorboard", "samples", "summary.json", "training_curves.png",
                "config.yaml")  # fmt: skip


def holds_results(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds results of an earlier run: a non-empty ``metrics.jsonl`` or a complete checkpoint."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    has_rows = metrics.is_file() and metrics.stat().st_size > 0
    return has_rows or latest_checkpoint(run_dir / "checkpoints") is not None


def prepare_run_dir(run_dir: str | Path, *, resume: bool = False, overwrite: bool = False) -> Path | None:
    """Apply the module's policy to ``run_dir``; return the checkpoint to resume from (None when not resuming).

    Args:
        run_dir: the run directory (``run.dir``).
        resume: continue from the latest complete checkpoint.
        overwrite: delete the results of an earlier run first (:data:`RESULT_FILES`); ignored with ``resume``.

    Raises:
        ConfigError: ``resume`` without a complete checkpoint; ``resume`` together with ``overwrite``; or a
            directory that holds results without ``resume`` / ``overwrite``.
    """
    run_dir = Path(run_dir)
    ckpt_root = run_dir / "checkpoints"
    for tmp in remove_partial_checkpoints(ckpt_root):
        logger.info("removed %s (a checkpoint whose write was interrupted)", tmp)
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: resume continues the run, overwrite deletes it")
    if resume:
        ckpt = latest_checkpoint(ckpt_root)
        if ckpt is None:
            raise ConfigError(f"--resume: no checkpoint under {ckpt_root}; run without --resume first")
        return ckpt
    if holds_results(run_dir):
        if not overwrite:
            ckpt = latest_checkpoint(ckpt_root)
            held = f"checkpoint {ckpt.name}" if ckpt is not None else "metrics.jsonl"
            raise ConfigError(
                f"run.dir {str(run_dir)!r} already holds an earlier run ({held}); refusing to overwrite it. "
                f"Continue it with --resume, start elsewhere with run.dir=<new dir>, or delete it with --overwrite"
            )
        for name in RESULT_FILES:
            path = run_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        logger.warning("--overwrite: deleted the earlier run's results in %s", run_dir)
    return None
