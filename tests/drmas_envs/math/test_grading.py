"""Table tests for drmas_envs.math.grading: extraction, equivalence via math-verify, time/memory bounds."""

from __future__ import annotations

import dataclasses

import pytest

import drmas_envs.math.grading as grading
from drmas_envs.math.grading import (
    REASONS,
    GradeResult,
    MathGrader,
    VerifyWorker,
    default_worker,
    extract_boxed,
    grade,
)

EXTRACT_CASES = [
    # (text, expected extraction)
    (r"first \boxed{1} then \boxed{2}", "2"),  # last box wins
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces kept
    (r"\boxed{\left\{ x \right\} + {a}^{b}}", r"\left\{ x \right\} + {a}^{b}"),
    (r"\fbox{7}", "7"),
    (r"\boxed{3} and finally \fbox{4}", "4"),
    (r"\fbox{3} and finally \boxed{5}", "5"),
    (r"so \boxed 42.", "42"),  # brace-less form
    (r"\boxed{}", ""),
    ("no box here", None),
    (r"\boxed{unclosed {", None),
    (r"\boxed{1} \boxed{2", None),  # the last box is unclosed: no fallback to an earlier one
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), EXTRACT_CASES)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_boxed_rejects_non_str():
    with pytest.raises(TypeError, match="extract_boxed expects a str, got bytes"):
        extract_boxed(b"\\boxed{1}")


GRADE_CASES = [
    # (response, ground truth, pre_extracted, expected (extracted, correct, reason))
    (r"\boxed{1} ... \boxed{2}", "2", False, ("2", True, "correct")),
    (r"\boxed{2} ... \boxed{1}", "2", False, ("1", False, "mismatch")),
    (r"\boxed{\frac{1}{2}}", "0.5", False, (r"\frac{1}{2}", True, "correct")),
    (r"\boxed{0.5}", r"\frac{1}{2}", False, ("0.5", True, "correct")),
    (r"\boxed{\dfrac{1}{2}}", r"\frac12", False, (r"\dfrac{1}{2}", True, "correct")),
    (r"\boxed{\dfrac{3}{4}}", r"\frac{1}{2}", False, (r"\dfrac{3}{4}", False, "mismatch")),
    (r"\boxed{\text{Evelyn}}", r"\text{Evelyn}", False, (r"\text{Evelyn}", True, "correct")),
    (r"\boxed{Evelyn}", r"\text{Evelyn}", False, ("Evelyn", True, "correct")),
    (r"\fbox{\text{(C)}}", "C", False, (r"\text{(C)}", True, "correct")),
    (r"\boxed{1,000}", "1000", False, ("1,000", True, "correct")),
    (r"\boxed{}", "0", False, ("", False, "empty")),
    (r"\boxed{   }", "0", False, ("", False, "empty")),
    ("the answer is 7", "7", False, (None, False, "no_box")),
    ("7", "7", True, ("7", True, "correct")),  # pre-extracted
    (r"\frac{1}{2}", "0.5", True, (r"\frac{1}{2}", True, "correct")),
    (r"\boxed{3}", ("2", "3"), False, ("3", True, "correct")),  # several acceptable answers
]


@pytest.mark.parametrize(("response", "truth", "pre", "expected"), GRADE_CASES)
def test_grade_table(response, truth, pre, expected):
    result = grade(response, truth, pre_extracted=pre)
    assert (result.extracted, result.correct, result.reason) == expected
    assert result.score == (1.0 if expected[1] else 0.0)
    assert result.reason in REASONS


def test_grade_equivalence_without_exact_shortcut_uses_math_verify():
    grader = MathGrader(exact_shortcut=False)
    assert grader.grade(r"\boxed{18}", "18") == GradeResult("18", True, "correct")
    assert grader.grade(r"\boxed{x^2+1}", "1+x^2").correct


def test_too_long_answer_is_rejected_before_parsing():
    result = MathGrader(max_answer_chars=10).grade(r"\boxed{12345678901}", "1")
    assert (result.correct, result.reason) == (False, "too_long")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout_s": 0}, "timeout_s must be > 0 seconds, got 0"),
        ({"max_answer_chars": 0}, "max_answer_chars must be > 0"),
    ],
)
def test_grader_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MathGrader(**kwargs)


def test_grade_rejects_bad_ground_truth():
    with pytest.raises(ValueError, match="ground_truth must be a str or a non-empty sequence of str"):
        grade(r"\boxed{1}", [])
    with pytest.raises(TypeError, match="response must be a str, got int"):
        grade(1, "1")


@pytest.mark.slow
def test_tower_exponent_times_out_and_worker_recovers():
    """The tower makes sympy compute a 370-million-digit power (minutes of CPU): a ``timeout`` answer can only
    come from the 1 s limit killing the worker, however loaded the machine (load makes sympy slower, not faster).
    How close to the limit the call returns is measured by ``benchmarks/perf/time_bounds.py``, not asserted."""
    worker = VerifyWorker()
    grader = MathGrader(timeout_s=1.0, worker=worker)
    roomy = dataclasses.replace(grader, timeout_s=120.0)  # answers, not times, are checked around the tower
    try:
        assert roomy.grade(r"\boxed{2}", "2.0").correct  # warm the worker (start-up is not charged to a call)
        result = grader.grade(r"\boxed{9^{9^{9^{9}}}}", "5")
        assert (result.correct, result.reason) == (False, "timeout")
        assert worker.restarts == 1
        assert roomy.grade(r"\boxed{\frac{2}{4}}", "0.5").correct  # the fresh worker answers
    finally:
        worker.close()
    worker.close()  # safe twice


class _CountingBraceScan:
    """Stands in for ``grading._BRACE_RE``: records the window ``endpos - pos`` of every scan for braces."""

    def __init__(self, pattern):
        self.pattern, self.windows = pattern, []

    def finditer(self, text, pos=0, endpos=None):
        endpos = len(text) if endpos is None else min(endpos, len(text))
        self.windows.append(endpos - pos)
        return self.pattern.finditer(text, pos, endpos)


def test_one_megabyte_strings_are_scanned_only_up_to_the_answer_cap(monkeypatch):
    """The cost bound as a count, not a stopwatch: however long the response, the brace scan reads at most
    ``max_answer_chars + 2`` characters of a box, and a text without a box is never scanned (one ``rfind``)."""
    scan = _CountingBraceScan(grading._BRACE_RE)
    monkeypatch.setattr(grading, "_BRACE_RE", scan)
    cap = MathGrader().max_answer_chars
    cases = [
        ("\\boxed{" + "9" * 1_000_000 + "}", (None, False, "too_long")),
        ("x{" * 500_000, (None, False, "no_box")),
        ("\\boxed{" + "{" * 1_000_000, (None, False, "too_long")),  # adversarial open nesting
    ]
    for text, expected in cases:
        scan.windows.clear()
        result = grade(text, "9")
        assert (result.extracted, result.correct, result.reason) == expected
        assert scan.windows == ([] if expected[2] == "no_box" else [cap + 2])
    scan.windows.clear()
    # the pure extractor (no cap): unclosed -> None, after one linear scan of the 1,001 characters after the marker
    assert extract_boxed("\\boxed{" + "{" * 1000) is None and scan.windows == [1001]


def test_default_worker_is_shared():
    assert default_worker() is default_worker()


@pytest.mark.slow
def test_forked_child_starts_its_own_worker():
    import json
    import os

    worker = VerifyWorker()
    grader = MathGrader(timeout_s=120.0, worker=worker)  # about which process answers, not how fast
    assert grader.grade(r"\boxed{0.25}", r"\frac14").correct
    parent_pid = worker._proc.pid
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # child: must not write into the parent's worker pipe
        try:
            result = grader.grade(r"\boxed{0.75}", r"\frac34")
            os.write(write_fd, json.dumps([result.correct, worker._proc.pid]).encode())
            worker.close()
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(child, 0)
    correct, child_worker_pid = json.loads(os.read(read_fd, 1000))
    os.close(read_fd)
    assert correct and child_worker_pid != parent_pid
    assert grader.grade(r"\boxed{1.5}", r"\frac32").correct and worker._proc.pid == parent_pid
    worker.close()
