"""What a training run may do with its run directory: decided before anything is written, applied after.

Policy (``drmas train``):

* a **fresh** directory (absent, empty, or holding no results) is used as is;
* a directory that **holds results** of an earlier run (a non-empty ``metrics.jsonl`` or a complete checkpoint)
  is never silently truncated: the run is refused with a :class:`~drmas_train.run.config.ConfigError` (the CLI exits
  2) that names the directory and the three ways on: ``--resume`` (continue it), ``run.dir=<new dir>`` (start
  elsewhere) or ``--overwrite`` (delete the earlier run and start again);
* ``--resume`` needs a complete checkpoint under ``<run dir>/checkpoints``; without one the run is refused the
  same way. ``--resume`` of a run whose latest checkpoint already reached ``run.iterations`` is a no-op
  (:class:`RunFinished`): nothing is loaded and no byte is written;
* ``--overwrite`` removes the **whole** earlier run: every entry a run writes (:data:`RUN_ENTRIES`), folders
  included. It refuses a directory that also holds entries ``drmas train`` never writes (they may be the user's):
  the message lists them. The entries are first moved into one hidden sibling folder (one ``rename`` each, atomic
  on POSIX within a filesystem), then that folder is deleted, so a kill mid-way never leaves a half-deleted run
  inside ``run.dir``;
* a directory without results that still holds entries of a run that completed no iteration (its config, an
  iteration-0 validation, TensorBoard events) has them removed the same way, so they never mix with the new run;
  checkpoint temp folders (``checkpoints/.tmp-iter_*``) that a kill during a checkpoint write left behind are
  deleted (:func:`drmas_train.run.checkpoint.remove_partial_checkpoints`).

The two halves are separate so that the trainer can validate everything (config, env, data, model names) and load
its models between them: :func:`plan_run_dir` only reads the disk; :meth:`RunDirPlan.apply` is the first write.
A command refused at any point before it changes nothing on disk.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from pathlib import Path

from drmas_train.run.checkpoint import checkpoint_iteration, latest_checkpoint, remove_partial_checkpoints
from drmas_train.run.config import ConfigError

__all__ = ["RUN_ENTRIES", "RunDirPlan", "RunFinished", "holds_results", "plan_run_dir"]

logger = logging.getLogger(__name__)

#: every entry ``drmas train`` writes into its run directory (what ``--overwrite`` removes).
RUN_ENTRIES = ("metrics.jsonl", "checkpoints", "tensorboard", "samples", "validation", "summary.json",
               "training_curves.png", "config.yaml")  # fmt: skip


class RunFinished(Exception):
    """``--resume`` of a run whose latest checkpoint already reached ``run.iterations``: nothing to do.

    Attributes:
        run_dir: the run directory. iteration: the latest checkpoint's iteration. iterations: ``run.iterations``.
    """

    def __init__(self, run_dir: Path, iteration: int, iterations: int) -> None:
        self.run_dir, self.iteration, self.iterations = run_dir, iteration, iterations
        super().__init__(
            f"run.dir {str(run_dir)!r} already finished at iter {iteration} of {iterations}; nothing to do "
            f"(raise run.iterations above {iteration} to continue it)"
        )


def holds_results(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds results of an earlier run: a non-empty ``metrics.jsonl`` or a complete checkpoint."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    has_rows = metrics.is_file() and metrics.stat().st_size > 0
    return has_rows or latest_checkpoint(run_dir / "checkpoints") is not None


@dataclasses.dataclass(frozen=True)
class RunDirPlan:
    """What :func:`plan_run_dir` decided; :meth:`apply` carries it out.

    Attributes:
        run_dir: the run directory. resume_from: the checkpoint to continue from (``--resume``), else None.
        delete: entries of an earlier run to remove: everything it wrote with ``--overwrite``, or the leftovers of a
            run that completed no iteration (no metrics row, no checkpoint). reason: why, for the log.
    """

    run_dir: Path
    resume_from: Path | None = None
    delete: tuple[str, ...] = ()
    reason: str = ""

    def apply(self) -> None:
        """The plan's writes: remove the earlier run's entries (:attr:`delete`), else the checkpoint temp folders of
        interrupted writes."""
        if not self.delete:
            for tmp in remove_partial_checkpoints(self.run_dir / "checkpoints"):
                logger.info("removed %s (a checkpoint whose write was interrupted)", tmp)
            return
        trash = Path(tempfile.mkdtemp(prefix=f".{self.run_dir.name}.deleting-", dir=self.run_dir.parent))
        for name in self.delete:  # one rename per entry: run.dir never holds half of an entry
            os.rename(self.run_dir / name, trash / name)
        shutil.rmtree(trash)
        logger.warning("%s: deleted %s in %s", self.reason, ", ".join(self.delete), self.run_dir)


def plan_run_dir(
    run_dir: str | Path, *, resume: bool = False, overwrite: bool = False, iterations: int | None = None
) -> RunDirPlan:
    """Apply the module's policy to ``run_dir`` without writing anything.

    Args:
        run_dir: the run directory (``run.dir``).
        resume: continue from the latest complete checkpoint.
        overwrite: delete the earlier run first (every entry of :data:`RUN_ENTRIES` present).
        iterations: ``run.iterations``; with ``resume``, a checkpoint at or past it raises :class:`RunFinished`.

    Raises:
        ConfigError: ``resume`` together with ``overwrite``; ``resume`` without a complete checkpoint; a directory
            that holds results without ``resume`` / ``overwrite``; ``overwrite`` of a directory that also holds
            entries a run never writes; ``run.dir`` naming a file.
        RunFinished: ``resume`` of a run that already reached ``iterations``.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run.dir {str(run_dir)!r} is a file; run.dir must be a directory (absent or not)")
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: resume continues the run, overwrite deletes it")
    ckpt_root = run_dir / "checkpoints"
    if resume:
        ckpt = latest_checkpoint(ckpt_root)
        if ckpt is None and holds_results(run_dir):  # metrics of a run whose first save failed or never came
            raise ConfigError(f"--resume: no complete checkpoint under {ckpt_root}, so the earlier run in "
                              f"{str(run_dir)!r} (metrics.jsonl) cannot be continued; start it again with --overwrite, "
                              f"or elsewhere with run.dir=<new dir>")  # fmt: skip
        if ckpt is None:
            raise ConfigError(f"--resume: no checkpoint under {ckpt_root}; run without --resume first")
        if iterations is not None and checkpoint_iteration(ckpt) >= iterations:
            raise RunFinished(run_dir, checkpoint_iteration(ckpt), iterations)
        return RunDirPlan(run_dir, resume_from=ckpt)
    if not holds_results(run_dir):  # leftovers of a run that completed no iteration would mix with this one
        return RunDirPlan(run_dir, delete=_present(run_dir), reason="leftovers of a run that completed no iteration")
    if not overwrite:
        ckpt = latest_checkpoint(ckpt_root)
        if ckpt is None:  # --resume would refuse it: say so instead of pointing there
            raise ConfigError(
                f"run.dir {str(run_dir)!r} already holds an earlier run (metrics.jsonl, no complete checkpoint, so "
                f"--resume cannot continue it); refusing to overwrite it. Start it again with --overwrite, or "
                f"elsewhere with run.dir=<new dir>"
            )
        done = checkpoint_iteration(ckpt)
        if iterations is not None and done >= iterations:  # --resume alone would have nothing to do
            raise ConfigError(
                f"run.dir {str(run_dir)!r} already holds a finished run (checkpoint {ckpt.name}, run.iterations="
                f"{iterations}); refusing to overwrite it. Continue it with --resume and run.iterations above {done}, "
                f"start elsewhere with run.dir=<new dir>, or delete it with --overwrite"
            )
        raise ConfigError(
            f"run.dir {str(run_dir)!r} already holds an earlier run (checkpoint {ckpt.name}); refusing to overwrite "
            f"it. Continue it with --resume, start elsewhere with run.dir=<new dir>, or delete it with --overwrite"
        )
    foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in RUN_ENTRIES)
    if foreign:
        raise ConfigError(
            f"--overwrite: run.dir {str(run_dir)!r} also holds {foreign}, which drmas train never writes; refusing "
            f"to delete them. Move them out of the run directory, or start elsewhere with run.dir=<new dir>"
        )
    return RunDirPlan(run_dir, delete=_present(run_dir), reason="--overwrite")


def _present(run_dir: Path) -> tuple[str, ...]:
    return tuple(name for name in RUN_ENTRIES if (run_dir / name).exists() or (run_dir / name).is_symlink())

