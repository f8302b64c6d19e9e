r"""The reference grader (``grader="reference"``): goldens computed with the Dr. MAS reference's own math reward.

Every expected value below was obtained by running the reference's ``RewardMathFn`` / ``extract_answer`` /
``grade_answer_mathd`` / ``grade_answer_sympy`` (``langfengQ/DrMAS agent_system/environments/env_package/math/
math_reward.py`` and ``utils.py``) on the same input; ``tests/fidelity/test_math_reward_fidelity.py`` re-runs
that comparison against the reference's code itself on held-out inputs.
"""

from __future__ import annotations

import pytest

from drmas_envs.math.graders import GRADERS, make_grader
from drmas_envs.math.grading import GradeResult, MathGrader, VerifyWorker
from drmas_envs.math.reference_equivalence import equivalent, mathd_normalize, sympy_normalize
from drmas_envs.math.reference_grading import ReferenceGrader, graded_segment, reference_boxed

# ---- extraction: utils.py:393-435 (last_boxed_only_string, remove_boxed) and :485-488 (extract_answer) ----------

EXTRACT_GOLDENS = [
    (r"\fbox{7}", None),  # \fbox is never read: extract_answer needs "\boxed" (:486)
    (r"so \boxed 42.", None),  # brace-less: remove_boxed needs "\boxed{" (:422-428)
    (r"\boxed {5}", None),  # a space before the brace: same
    (r"\boxed{}", ""),  # empty box: "" (valid, graded, never correct)
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{1} then \boxed{2}", "2"),  # the last \boxed (rfind, :394)
    (r"\boxed{3} and \fbox{4}", "3"),  # \fbox after it is ignored
    (r"\boxed{a", None),  # unclosed
    (r"\boxed{1} \boxed{2", None),  # the last one unclosed: no fallback to an earlier box
    (r"\boxed}{5}", None),
    (r"\boxed{{1}", None),
]


@pytest.mark.parametrize(("text", "expected"), EXTRACT_GOLDENS)
def test_reference_boxed(text, expected):
    assert reference_boxed(text) == expected


def test_graded_segment_is_between_the_first_and_second_think_end():
    """math_reward.py:61-66: ``response.split("</think>")[1]``; the whole response without ``</think>``."""
    assert graded_segment("a</think>b") == "b"
    assert graded_segment("a</think>b</think>c") == "b"
    assert graded_segment("</think>") == ""
    assert graded_segment(r"\boxed{1}") == r"\boxed{1}"


# ---- the reward: math_reward.py:39-107 --------------------------------------------------------------------------

REWARD_GOLDENS = [
    # (response, ground truth, reference (reward, is_correct) -> our (correct, reason))
    (r"<think>a \boxed{1}</think> b \boxed{2}", "2", (True, "correct")),  # after </think>: 2
    (r"<think>a \boxed{1}</think> b \boxed{2}", "1", (False, "mismatch")),  # the thinking's box is not graded
    (r"<think>\boxed{1}</think> no box", "1", (False, "no_box")),  # no box after </think>: reward 0 (:68-70)
    (r"x</think>\boxed{1}</think>\boxed{2}", "1", (True, "correct")),  # between first and second </think>
    (r"x</think>\boxed{1}</think>\boxed{2}", "2", (False, "mismatch")),
    ("</think>", "1", (False, "no_box")),
    ("", "1", (False, "no_box")),  # empty response: format_error_reward 0 (:56-58)
    (r"\boxed{}", "0", (False, "empty")),
    (r"\fbox{7}", "7", (False, "no_box")),
    (r"so \boxed 7", "7", (False, "no_box")),
    (r"\boxed{\dfrac{1}{2}}", "0.5", (True, "correct")),  # mathd: dfrac -> frac, 0.5 -> \frac{1}{2}
    (r"\boxed{1/2}", r"\frac{1}{2}", (True, "correct")),  # mathd: a/b -> \frac{a}{b}
    (
        r"\boxed{2/4}",
        r"\frac{1}{2}",
        (False, "mismatch"),
    ),  # fractions must match literally (utils.py:460-463)
    (r"\boxed{0.50}", r"\frac{1}{2}", (True, "correct")),  # sympy: 1/2 - 0.50 = 0
    (r"\boxed{0.333}", r"\frac{1}{3}", (False, "mismatch")),
    (r"\boxed{10\%}", "10", (True, "correct")),
    (r"\boxed{x^2+1}", "1+x^2", (True, "correct")),  # sympy simplify
    (r"\boxed{2x+2}", "2(x+1)", (True, "correct")),
    (r"\boxed{a+b+c}", "c+b+a", (False, "mismatch")),  # three letters: sympy refused (utils.py:349-352)
    (
        r"\boxed{2^{10}}",
        "1024",
        (False, "mismatch"),
    ),  # "^{" refused, and an int needs an int (utils.py:182,464)
    (r"\boxed{\text{(C)}}", "C", (True, "correct")),
    (r"\boxed{1,000}", "1000", (True, "correct")),
    (r"\boxed{1,999.99999999}", "1999", (True, "correct")),  # the reference truncates (utils.py:242-245)
    (r"\boxed{1,999.99999999}", "2000", (False, "mismatch")),
    (r"\boxed{(1,2)}", "(1, 2)", (True, "correct")),
    (r"\boxed{[1,2)}", "(1,2)", (False, "mismatch")),  # bracket shape differs (utils.py:454-455)
    (r"\boxed{5 \text{ cm}}", "5", (True, "correct")),  # mathd drops "\text{ unit}"
    (r"\boxed{5 meters}", "5", (True, "correct")),
    (r"\boxed{18 dollars}", "18", (False, "mismatch")),
    (r"\boxed{x=3}", "3", (True, "correct")),
    (r"\boxed{90^\circ}", "90", (True, "correct")),
    (r"\boxed{3\sqrt{2}}", r"\sqrt{18}", (True, "correct")),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"(3,\pi/2)", (True, "correct")),
    (r"\boxed{-\infty}", r"\infty", (False, "mismatch")),
    (r"\boxed{three}", "3", (False, "mismatch")),
    (r"\boxed{5}", r"\boxed{5}", (True, "correct")),  # a boxed ground truth is unboxed first (:85-88)
    (r"\boxed{5}", [r"\boxed{4", "5"], (True, "correct")),  # an unreadable boxed one is dropped
]


@pytest.fixture(scope="module")
def grader():
    worker = VerifyWorker(backend="reference")
    yield ReferenceGrader(worker=worker, exact_shortcut=False)
    worker.close()


@pytest.mark.parametrize(("response", "truth", "expected"), REWARD_GOLDENS)
def test_reference_reward_goldens(grader, response, truth, expected):
    result = grader.grade(response, truth)
    assert (result.correct, result.reason) == expected
    assert result.score == (1.0 if expected[0] else 0.0)


# ---- validity: agent/utils.py:214-244 (math_projection, check_think_tag=False at agents/math/solver_agent.py:56) --

VALIDITY_GOLDENS = [
    (r"\boxed{}", True),  # extract_answer gives "", not None
    (r"\boxed{7}", True),
    (r"\fbox{7}", False),
    (r"so \boxed 7", False),
    (r"<think>\boxed{7}</think> it is 7", True),  # validity reads the whole reply
    ("the answer is 7", False),
    (r"\boxed{1} \boxed{2", False),
]


@pytest.mark.parametrize(("reply", "valid"), VALIDITY_GOLDENS)
def test_reference_validity(reply, valid):
    assert ReferenceGrader().is_valid(reply) is valid


def test_the_two_graders_are_named_options():
    assert list(GRADERS) == ["reference", "math_verify"]
    assert isinstance(make_grader(), ReferenceGrader) and type(make_grader("math_verify")) is MathGrader
    with pytest.raises(
        ValueError, match=r"grader must be one of \('reference', 'math_verify'\), got 'sympy'"
    ):
        make_grader("sympy")
    with pytest.raises(ValueError, match="needs a worker with backend='reference', got 'math_verify'"):
        ReferenceGrader(worker=VerifyWorker())
    # math_verify reads what the reference does not
    assert make_grader("math_verify").grade(r"\fbox{7}", "7").correct
    assert make_grader("math_verify").is_valid(r"\boxed{}") is False


def test_the_worker_gets_the_answer_unstripped(grader):
    """The reference normalises raw box content; the exact shortcut compares stripped text (mathd strips too)."""
    assert grader.grade(r"\boxed{ \text{yes} }", r"\text{yes}") == GradeResult(r"\text{yes}", True, "correct")
    assert sympy_normalize(r" \text{yes}") == "yes" and mathd_normalize(r" \text{yes} ") == "yes"


def test_pure_equivalence_matches_the_goldens():
    """The worker's function itself, in process (test inputs are trusted)."""
    assert equivalent(r"\dfrac{1}{2}", "0.5") and not equivalent("2/4", r"\frac{1}{2}")
    assert equivalent("2.99999999", "3") and not equivalent("2.99999999", "2")


def test_adversarial_answer_is_bounded():
    """``**`` passes the reference's sympy gate (it checks ``^`` only, utils.py:181-183), so ``9**9**9**9`` makes
    the reference compute a tower power without end; drmas's worker is killed at the limit and the spare answers."""
    worker = VerifyWorker(backend="reference")
    try:
        grader = ReferenceGrader(timeout_s=1.0, worker=worker)
        assert grader.grade(r"\boxed{2x+2}", "2(x+1)").correct  # cold start (not charged)
        result = grader.grade(r"\boxed{9**9**9**9}", r"\frac{1}{2}")  # "timeout": killed at the 1 s limit
        assert result == GradeResult("9**9**9**9", False, "timeout")
        assert grader.grade(r"\boxed{0.5}", r"\frac{1}{2}").correct and worker.restarts == 1
    finally:
        worker.close()
