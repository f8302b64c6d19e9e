"""Per-model pacing's bookkeeping (``drmas_train.run.pacing.InFlightUpdates``) on a fake updater whose updates finish
when the test says so: who starts, who is waited for, what a barrier and a lost rank do."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from drmas_train.distributed.errors import DistributedError
from drmas_train.run.pacing import InFlightUpdates


class FakeUpdater:
    """``start_model`` returns one ref per call; a ref is done once the test (or a blocking ``ready``'s schedule) says
    so."""

    def __init__(self, model_ids, finish_order=()):
        self.model_ids = list(model_ids)
        self.done: set[str] = set()
        self.finish_order = list(finish_order)  # what a blocking ready lets finish next, one per blocking wait
        self.calls = []
        self.fail: set[str] = set()

    def start_model(self, mid, samples, adv, seed):
        self.calls.append(("start", mid, [s.i for s in samples], adv.tolist(), seed))
        return [mid]

    def finished(self, refs):
        return all(r in self.done for r in refs)

    def ready(self, pending, *, block):
        while block and pending and not any(self.finished(refs) for refs in pending):
            self.done.add(self.finish_order.pop(0))
        return [self.finished(refs) for refs in pending]

    def finish_model(self, mid, refs):
        self.done.update(refs)  # waiting for it makes it done
        self.calls.append(("finish", mid))
        if mid in self.fail:
            raise DistributedError(f"rank of {mid} died")
        return {f"loss/{mid}/loss": 1.0}


def _batch(models):
    samples = [SimpleNamespace(model_id=m, i=i) for i, m in enumerate(models)]
    return samples, np.arange(len(samples), dtype=float)


def test_each_model_starts_on_its_own_rows_and_a_step_waits_only_for_the_first():
    up = FakeUpdater(["fast", "slow"], finish_order=["fast", "fast", "slow"])
    flights = InFlightUpdates(up)
    samples, adv = _batch(["slow", "fast", "frozen", "slow"])
    assert flights.start(samples, adv, seed=7, step=0) == ["fast", "slow"]  # the frozen model's sample: no update
    assert up.calls == [("start", "fast", [1], [1.0], 7), ("start", "slow", [0, 3], [0.0, 3.0], 7)]
    done = flights.collect("any")
    assert list(done) == ["fast"] and done["fast"][0] == {"loss/fast/loss": 1.0} and done["fast"][1].step == 0
    assert flights.busy("slow") and not flights.busy("fast")
    with pytest.raises(ValueError, match="model 'slow' got samples while its update of step 1 runs"):
        flights.start(*_batch(["slow"]), seed=8, step=1)
    up.done.discard("fast")
    flights.start(*_batch(["fast"]), seed=8, step=1)
    assert list(flights.collect("any")) == ["fast"]  # the slow one is still running
    assert flights.collect("none") == {}
    up.done.discard("fast")
    flights.start(*_batch(["fast"]), seed=9, step=2)
    done = flights.collect("all")  # a barrier: both, whatever their order
    assert list(done) == ["fast", "slow"] and done["slow"][1].step == 0
    assert flights.running == {} and flights.collect("any") == {}  # nothing runs: no wait


def test_equally_fast_models_finishing_together_stay_in_step():
    up = FakeUpdater(["a", "b", "c"], finish_order=["c"])
    flights = InFlightUpdates(up)
    flights.start(*_batch(["a", "b", "c"]), seed=0, step=0)
    up.done.update({"a", "b"})  # both done by the time the step waits: both collected, c left running
    assert list(flights.collect("any")) == ["a", "b"] and flights.busy("c")
    assert list(flights.collect("any")) == ["c"]  # the next wait blocks until c is done


def test_a_lost_rank_leaves_the_others_for_abandon_and_an_unknown_wait_is_refused():
    up = FakeUpdater(["a", "b"], finish_order=["a"])
    up.fail.add("a")
    flights = InFlightUpdates(up)
    flights.start(*_batch(["a", "b"]), seed=0, step=0)
    with pytest.raises(DistributedError, match="rank of a died"):
        flights.collect("any")
    assert list(flights.running) == ["b"]
    up.fail.add("b")
    assert flights.abandon() == ["b"] and flights.running == {}  # waited for, whatever its outcome
    with pytest.raises(ValueError, match="wait='some'; accepted: none, any, all"):
        flights.collect("some")
