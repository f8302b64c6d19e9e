"""Every grade is bounded by its own limit, worker restarts included (issue 14 item 4a): after a timeout the warm
spare worker answers at once; back-to-back timeouts still return within each call's limit."""

from __future__ import annotations

import time

from drmas_envs.math.grading import MathGrader, VerifyWorker

TOWER = r"\boxed{9^{9^{9^{9}}}}"  # sympy computes a 370-million-digit power: only a kill stops it
SLACK_S = 0.5  # process kill + select wake-up on a loaded 2-core machine


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def test_a_grade_right_after_a_timeout_finishes_within_its_limit():
    worker = VerifyWorker()
    grader = MathGrader(timeout_s=1.0, worker=worker)
    try:
        assert grader.grade(r"\boxed{2}", "2.0").correct  # cold start: the worker and its spare are ready
        spare_pid = worker._spare.popen.pid
        result, seconds = _timed(lambda: grader.grade(TOWER, "5"))
        assert result.reason == "timeout" and seconds < 1.0 + SLACK_S
        # a normal answer that needs math-verify (no exact shortcut), right after: the spare answers it
        result, seconds = _timed(lambda: grader.grade(r"\boxed{\frac{2}{4}}", "0.5"))
        assert result.correct and worker._proc.pid == spare_pid and worker.restarts == 1
        assert seconds < 1.0  # within its limit, restart included (before the spare: ~0.6-2 s of sympy import)
    finally:
        worker.close()


def test_back_to_back_timeouts_stay_within_each_limit():
    worker = VerifyWorker()
    grader = MathGrader(timeout_s=0.5, worker=worker)
    try:
        assert grader.grade(r"\boxed{3}", "3.0").correct
        for _ in range(3):  # the spare of the 2nd and 3rd call may still be importing: still bounded
            result, seconds = _timed(lambda: grader.grade(TOWER, "5"))
            assert result.reason == "timeout" and seconds < 0.5 + SLACK_S
        result, seconds = _timed(lambda: grader.grade(r"\boxed{\frac{3}{4}}", "0.75"))
        assert seconds < 0.5 + SLACK_S and result.reason in ("correct", "timeout")
        deadline = time.monotonic() + 60  # and the workers recover: a later grade is right again
        while not grader.grade(r"\boxed{\frac{3}{4}}", "0.75").correct:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        worker.close()
