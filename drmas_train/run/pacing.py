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

:class:`InFlightUpdates` is the bookkeeping: which model's update runs since which step, polled through what the
:class:`~drmas_train.run.updater.PacedUpdater` protocol declares (``start_model``, ``ready``, ``finish_model``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from drmas_train.run.policy_versions import PolicyVersions
    from drmas_train.run.updater import PacedUpdater

__all__ = ["InFlight", "InFlightUpdates", "WAITS"]

#: how long :meth:`InFlightUpdates.collect` waits: for nothing, the first running update, or all of them.
WAITS = ("none", "any", "all")


@dataclass
class InFlight:
    """One model's update that was started and not yet finished."""

    refs: Any
    """what :meth:`PacedUpdater.start_model` returned (Ray: the ranks' refs)."""
    step: int
    """the 0-based step that started it."""
    started: float = field(default_factory=time.perf_counter)
    """``time.perf_counter()`` at its start (seconds)."""


class InFlightUpdates:
    """The updates of per-model pacing that run while the loop goes on.

    Args:
        updater: the run's updater, with the :class:`~drmas_train.run.updater.PacedUpdater` capability
            (``RayUpdater``).
        at_start: each trained model's version when the loop started (``pacing/<m>/updates`` counts from it).
    """

    def __init__(self, updater: PacedUpdater, at_start: Mapping[str, int] | None = None) -> None:
        self.updater = updater
        self.at_start = dict(at_start or {})  # each trained model's version when the loop started
        self.running: dict[str, InFlight] = {}  # model id -> its update in flight

    def finish_step(self, versions: PolicyVersions, step: int, wait: str, metrics: dict[str, float]) -> set[str]:
        """The end of the updates of ``step`` (0-based): collect those done after ``wait`` (:meth:`collect`), advance
        their models' ``versions``, and add to ``metrics`` their update metrics, the versions and per trained model
        ``pacing/<m>/updated`` (1: an update of it finished in this step), ``pacing/<m>/in_flight`` (1: its update
        still runs after the step), ``pacing/<m>/updates`` (the updates this process added to the weights:
        ``version/<m>`` minus its value when the loop started, :attr:`at_start`) and, for each finished one,
        ``pacing/<m>/update_s`` (its wall-clock seconds, start to collection) and ``pacing/<m>/update_steps`` (steps
        it spanned: 1 = started and finished in this step).

        Returns:
            the models whose versions advanced.

        Raises:
            DistributedError: a training rank died.
        """
        done = self.collect(wait)
        now = time.perf_counter()
        for mid, (update_metrics, flight) in done.items():
            metrics.update(update_metrics)
            metrics[f"pacing/{mid}/update_s"] = now - flight.started
            metrics[f"pacing/{mid}/update_steps"] = float(step - flight.step + 1)
        versions.advance(set(done))
        for mid, start in self.at_start.items():
            metrics[f"pacing/{mid}/updated"] = float(mid in done)
            metrics[f"pacing/{mid}/in_flight"] = float(self.busy(mid))
            metrics[f"pacing/{mid}/updates"] = float(versions[mid] - start)
        metrics.update(versions.metrics())
        return set(done)

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
            model id -> (its update's metrics, as :meth:`PacedUpdater.finish_model`, and its :class:`InFlight`), in
            model id order; each collected model is idle again.

        Raises:
            ValueError: an unknown ``wait``.
            DistributedError: a training rank died; the failed model's update is dropped from the running ones (the
                others keep running: :meth:`abandon` them before a rewind).
        """
        if wait not in WAITS:
            raise ValueError(f"wait={wait!r}; accepted: {', '.join(WAITS)}")
        flights = sorted(self.running.items())
        finished = [True] * len(flights) if wait == "all" else \
            self.updater.ready([f.refs for _, f in flights], block=wait == "any")  # fmt: skip
        done = {}
        for (mid, flight), over in zip(flights, finished, strict=True):
            if over:
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
