"""Every grade is bounded by its own limit, worker restarts included (issue 14 item 4a): after a timeout the warm
spare worker takes over; back-to-back timeouts, even with no worker ready at all, still end each call at its limit.

No assert reads a clock. Each call under test would otherwise block far longer than any machine load could stretch
a limit: the tower exponent keeps sympy busy for minutes, and a gated worker (``helpers/gated_verify_worker.py``) never gets
ready until the test opens its gate. So a call that returns ``timeout`` at all proves its limit was enforced; the
evidence that the spare took over is its pid and its ``ready`` flag, not a stopwatch. How far past its limit a
call returns is measured by ``benchmarks/perf/time_bounds.py``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from pathlib import Path

import pytest

import drmas_envs.math.grading as grading
import helpers
from drmas_envs.math.grading import GradeResult, MathGrader, VerifyWorker

TOWER = r"\boxed{9^{9^{9^{9}}}}"  # sympy computes a 370-million-digit power (minutes): only a kill stops it
GATED_WORKER = Path(helpers.__file__).with_name("gated_verify_worker.py")
# A hang guard, not a measurement: a call limited to 0.5-1 s that has not returned after 120 s (>= 120x its limit)
# is one whose limit is not enforced; fail instead of blocking the suite for the tower's minutes or forever.
HANG_GUARD_S = 120.0
ROOMY_S = 120.0  # the limit of grades whose point is their answer, not their time: 1,000x a verification's ms


def _grade(grader: MathGrader, response: str, truth: str) -> GradeResult:
    """``grader.grade`` in a helper thread; fails the test if it has not returned within :data:`HANG_GUARD_S`."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(grader.grade, response, truth)
        try:
            return future.result(timeout=HANG_GUARD_S)
        except concurrent.futures.TimeoutError:
            worker = grader.worker
            assert worker is not None
            for proc in (worker._active, worker._spare):  # EOF on its pipe unblocks the helper thread
                if proc is not None:  # (not worker.close(): it waits for the lock the stuck call holds)
                    proc.popen.kill()
            pytest.fail(
                f"grade({response!r}) limited to {grader.timeout_s} s still runs after {HANG_GUARD_S} s"
            )


@pytest.mark.slow
def test_a_grade_right_after_a_timeout_is_served_by_the_warm_spare():
    worker = VerifyWorker()
    grader = MathGrader(timeout_s=1.0, worker=worker)
    roomy = dataclasses.replace(grader, timeout_s=ROOMY_S)
    try:
        assert roomy.grade(r"\boxed{2}", "2.0").correct  # cold start: the worker and its spare are ready
        first_pid, spare = worker._proc.pid, worker._spare
        assert spare is not None and spare.ready
        assert _grade(grader, TOWER, "5") == GradeResult("9^{9^{9^{9}}}", False, "timeout")
        # the killed worker was replaced by the spare, already warm: the next call waits for no import
        assert worker.restarts == 1 and worker._active is spare and worker._active.ready
        assert worker._proc.pid == spare.popen.pid != first_pid
        # a normal answer that needs math-verify (no exact shortcut), answered by that same process
        assert roomy.grade(r"\boxed{\frac{2}{4}}", "0.5").correct and worker._proc.pid == spare.popen.pid
    finally:
        worker.close()


@pytest.mark.slow
def test_back_to_back_timeouts_and_no_ready_worker_each_end_at_the_limit(monkeypatch, tmp_path):
    gate = tmp_path / "gate"
    monkeypatch.setenv("DRMAS_TEST_WORKER_GATE", str(gate))
    worker = VerifyWorker()
    grader = MathGrader(timeout_s=0.5, worker=worker)
    try:
        assert dataclasses.replace(grader, timeout_s=ROOMY_S).grade(r"\boxed{3}", "3.0").correct  # cold start
        monkeypatch.setattr(grading, "_WORKER_SCRIPT", GATED_WORKER)  # new spares stay unready: gate closed
        # the warm spare takes over; a gated spare starts
        assert _grade(grader, TOWER, "5").reason == "timeout"
        assert worker.restarts == 1 and worker._active.ready and not worker._spare.ready
        # killed again: the gated spare is now the active one
        assert _grade(grader, TOWER, "5").reason == "timeout"
        assert worker.restarts == 2 and not worker._active.ready
        gated_pid = worker._proc.pid
        # no worker is ready and none can be before the gate opens: the call answers ``timeout`` at its limit
        # instead of waiting for one, and keeps that worker starting (it is not killed: restarts stays 2)
        for _ in range(2):
            assert _grade(grader, r"\boxed{\frac{3}{4}}", "0.75").reason == "timeout"
        assert worker.restarts == 2 and worker._proc.pid == gated_pid and not worker._active.ready
        gate.touch()  # the gated worker now becomes a real one; a roomy call waits for it and is answered
        assert dataclasses.replace(grader, timeout_s=ROOMY_S).grade(r"\boxed{\frac{3}{4}}", "0.75").correct
        assert worker._proc.pid == gated_pid and worker._active.ready and worker.restarts == 2
    finally:
        worker.close()
