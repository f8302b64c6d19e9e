"""Per-model pacing of the asynchronous loop (``run.pacing: per_model``, docs/async.md, "Per-model pacing").

With ``lockstep`` pacing every step of the asynchronous loop waits for every trained model's update, so a team's
step lasts as long as its slowest model's update. With ``per_model`` pacing a step starts the update of every model
that is idle (each on its own worker group, on bundles of its own) and waits only until the first of the running
updates finishes; a model whose update is still running at the next step takes no groups there (its part of them
is skipped, :meth:`~drmas_train.collect.group_buffer.GroupBuffer.skip`, so its backlog stays one batch) and its
engines go on generating with its older weights. A small model thus runs ahead of a large one, each version counter
advancing at its own pace; every sample still stays within its model's staleness bound (the buffer drops the rest).
Steps that validate or checkpoint, the last step, and a Ctrl-C wait for every update (a barrier), so a checkpoint
never holds half an update.

:class:`InFlightUpdates` is the bookkeeping: which model's update runs since which step, polled through the
updater's :meth:`~drmas_train.distributed.updater.RayUpdater.start_model` / ``finished`` / ``wait_any`` /
``finish_model``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["InFlight", "InFlightUpdates", "WAITS"]

#: how long :meth:`InFlightUpdates.collect` waits: for nothing, the first running update, or all of them.
WAITS = ("none", "any", "all")


@dataclass
class InFlight:
    """One model's update that was started and not yet finished."""

    refs: list[Any]
    """the ranks' refs (:meth:`RayUpdater.start_model`)."""
    step: int
    """the 0-based step that started it."""
    started: float = field(default_factory=time.perf_counter)
    """``time.perf_counter()`` at its start (seconds)."""


class InFlightUpdates:
    """The updates of per-model pacing that run while the loop goes on.

    Args:
        updater: the run's :class:`~drmas_train.distributed.updater.RayUpdater` (or an object with its
            ``start_model``, ``finished``, ``wait_any`` and ``finish_model``).
    """

    def __init__(self, updater: Any) -> None:
        self.updater = updater
        self.running: dict[str, InFlight] = {}  # model id -> its update in flight

    def busy(self, model_id: str) -> bool:
        """Whether ``model_id``'s update is still running (it takes no groups this step)."""
        return model_id in self.running

    def start(self, samples: list[Any], adv: np.ndarray, seed: int, step: int) -> list[str]:
        """Start one update per model of ``samples`` (each on its own samples and their rows of ``adv``, (B,) or
        (B, T)).

        Returns:
            the models started, sorted.

        Raises:
            ValueError: a model of ``samples`` whose update is still running (the loop gives it no samples).
            DistributedError: a training rank is gone.
        """
        by_model: dict[str, list[int]] = {}
        for i, s in enumerate(samples):
            by_model.setdefault(s.model_id, []).append(i)
        trained = set(self.updater.model_ids)
        for mid in sorted(by_model):
            if mid not in trained:  # a frozen model's samples: nothing to update
                continue
            if mid in self.running:
                raise ValueError(f"model {mid!r} got samples while its update of step {self.running[mid].step + 1} runs")
            idx = by_model[mid]
            self.running[mid] = InFlight(self.updater.start_model(mid, [samples[i] for i in idx], adv[idx], seed), step)
        return sorted(m for m in by_model if m in trained)

    def collect(self, wait: str) -> dict[str, tuple[dict[str, float], InFlight]]:
        """The updates that are done after waiting for ``wait`` (:data:`WAITS`): ``none`` (poll), ``any`` (the first
        of the running ones; returns at once when none runs) or ``all``; every other one that is done by then is
        collected too, so equally fast models stay in step.

        Returns:
            model id -> (its update's metrics, as :meth:`RayUpdater.finish_model`, and its :class:`InFlight`), in
            model id order; each collected model is idle again.

        Raises:
            ValueError: an unknown ``wait``.
            DistributedError: a training rank died; the failed model's update is dropped from the running ones (the
                others keep running: :meth:`abandon` them before a rewind).
        """
        if wait not in WAITS:
            raise ValueError(f"wait={wait!r}; accepted: {', '.join(WAITS)}")
        if wait == "any":
            self.updater.wait_any([f.refs for f in self.running.values()])
        done = {}
        for mid in sorted(self.running):
            flight = self.running[mid]
            if wait == "all" or self.updater.finished(flight.refs):
                del self.running[mid]
                done[mid] = (self.updater.finish_model(mid, flight.refs), flight)
        return done

    def abandon(self) -> list[str]:
        """Wait for every running update and forget it, whatever its outcome (before a rewind reloads the
        weights of every model from a checkpoint: nothing may still write them).

        Returns:
            the models whose updates were abandoned, sorted.
        """
        from drmas_train.distributed.errors import DistributedError

        gone = sorted(self.running)
        for mid in gone:
            try:
                self.updater.finish_model(mid, self.running.pop(mid).refs)
            except DistributedError:
                pass
        return gone
