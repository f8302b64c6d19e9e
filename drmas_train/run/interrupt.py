"""Ctrl-C during training: stop where the run can be saved exactly, save a checkpoint, and say where.

:class:`SigintGuard` installs a SIGINT handler for the training loop. Between :meth:`~SigintGuard.hold` and
:meth:`~SigintGuard.release` (the trainer holds from the end of an iteration's rollout to its checkpoint: the update,
evaluation, logging and saving) a first Ctrl-C is only noted and raised as :class:`KeyboardInterrupt` at the
release, so weights are never saved half-updated; a second Ctrl-C aborts at once. Elsewhere (the rollout, which
changes no weights) Ctrl-C raises at once. Either way :meth:`~SigintGuard.save_interrupted` then writes a checkpoint of
the last completed iteration, with the task sampler as it was after that iteration, unless one exists already.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["SigintGuard"]

logger = logging.getLogger(__name__)


class SigintGuard:
    """SIGINT handling of one training run (a context manager; see the module docstring).

    Outside the main thread, or when SIGINT is not Python's default handler (e.g. ignored by a parent), it
    installs nothing and only keeps the bookkeeping.
    """

    def __init__(self) -> None:
        self.run: Any = None
        self.done = 0  # iterations completed
        self.sampler_state: dict[str, Any] | None = None  # the task sampler's state after `done` iterations
        self._what = ""
        self._holding = False
        self._received = False
        self._previous: Any = None

    def __enter__(self) -> SigintGuard:
        if threading.current_thread() is threading.main_thread() and (
            signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: object) -> None:
        if not self._holding or self._received:
            raise KeyboardInterrupt
        self._received = True
        logger.warning("Ctrl-C: finishing %s, then saving a checkpoint (Ctrl-C again to abort without saving)",
                       self._what)  # fmt: skip

    @property
    def requested(self) -> bool:
        """Whether a Ctrl-C arrived while held (it raises at :meth:`release`)."""
        return self._received

    def attach(self, run: Any) -> None:
        """Start tracking ``run`` (a :class:`~drmas_train.run.state.RunState`) at its start iteration."""
        self.run, self.done = run, run.start_iteration
        self.sampler_state = run.sampler.state_dict()

    def hold(self, what: str) -> None:
        """From now on a Ctrl-C waits for :meth:`release`; ``what`` names the work in the message."""
        self._what, self._holding = what, True

    def release(self, done: int) -> None:
        """``done`` iterations are complete (and the sampler is past them).

        Raises:
            KeyboardInterrupt: a Ctrl-C arrived while held.
        """
        self.done, self.sampler_state = done, self.run.sampler.state_dict()
        self._holding = False
        if self._received:
            self._received = False
            raise KeyboardInterrupt

    def save_interrupted(self, save: Callable[[Any, int], Path]) -> Path | None:
        """After an interrupt: checkpoint the last completed iteration with ``save(run, iteration)`` unless a
        checkpoint of it exists (or none completed); log where it is. Returns the checkpoint (None if none)."""
        from drmas_train.run.checkpoint import latest_checkpoint

        run = self.run
        if run is None:  # interrupted while setting up: nothing to save
            return None
        run.logger.close()
        latest = latest_checkpoint(run.run_dir / "checkpoints")
        if latest is not None and latest.name == f"iter_{self.done:06d}":
            logger.warning("interrupted after iter %d; its checkpoint is %s; continue with --resume", self.done, latest)
            return latest
        if self.done == 0:
            logger.warning("interrupted before the first iteration completed: no checkpoint saved")
            return None
        run.sampler.load_state_dict(self.sampler_state)  # undo the draw of the iteration that did not finish
        ckpt = save(run, self.done)
        logger.warning("interrupted: saved checkpoint %s (iter %d); continue with --resume", ckpt, self.done)
        return ckpt
