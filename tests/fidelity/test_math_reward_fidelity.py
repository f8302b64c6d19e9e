r"""``grader="reference"`` against the Dr. MAS reference's own math reward code, on held-out inputs.

The reference's ``agent_system/environments/env_package/math/utils.py`` and ``math_reward.py`` are read from the
local mirror (skipped without one) and run in this process beside drmas's
:mod:`drmas_envs.math.reference_equivalence` / :class:`~drmas_envs.math.reference_grading.ReferenceGrader`; none of
the inputs below appears in ``tests/drmas_envs/math/test_reference_grading.py``. Cited files:
  utils  = agent_system/environments/env_package/math/utils.py
  reward = agent_system/environments/env_package/math/math_reward.py
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import types
from pathlib import Path

import pytest

from drmas_envs.data import load_tasks
from drmas_envs.math.grading import VerifyWorker
from drmas_envs.math.reference_equivalence import equivalent
from drmas_envs.math.reference_grading import ReferenceGrader, reference_boxed
from fidelity.reference_mirror import reference_file
from helpers.shared_data import shared_file

SAMPLED = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "smollm2_math_answers.jsonl"


@pytest.fixture(scope="module")
def ref() -> types.SimpleNamespace:
    """The reference's utils.py and RewardMathFn, executed from the mirror's text (its one drmas-external import
    line in math_reward.py is replaced by the names from utils.py)."""
    pytest.importorskip("pylatexenc")
    utils = types.ModuleType("reference_math_utils")
    exec(compile(reference_file("agent_system/environments/env_package/math/utils.py"), "utils.py", "exec"),  # noqa: S102
         utils.__dict__)  # fmt: skip
    source = reference_file("agent_system/environments/env_package/math/math_reward.py")
    source = "\n".join(line for line in source.splitlines() if not line.startswith("from agent_system."))
    reward = types.ModuleType("reference_math_reward")
    reward.__dict__.update(extract_answer=utils.extract_answer, grade_answer_mathd=utils.grade_answer_mathd,
                           grade_answer_sympy=utils.grade_answer_sympy)  # fmt: skip
    sys.modules[reward.__name__] = reward  # @dataclass looks its module up there
    try:
        exec(
            compile(source.split('if __name__ == "__main__":')[0], "math_reward.py", "exec"), reward.__dict__
        )  # noqa: S102
    finally:
        del sys.modules[reward.__name__]
    logging.getLogger("pylatexenc").setLevel(logging.ERROR)
    return types.SimpleNamespace(utils=utils, reward=reward.RewardMathFn(reward.RewardConfig()))


def _reference_equal(ref, given: str, truth: str) -> bool | None:
    """utils:475-482 or utils:438-472, or None if the reference's sympy runs past 5 s (it has no limit)."""

    def stop(*_):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(5)
    try:
        return ref.utils.grade_answer_mathd(given, truth) or ref.utils.grade_answer_sympy(given, truth)
    except TimeoutError:
        return None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _variants(truth: str, other: str) -> list[str]:
    """Held-out rewrites of a ground truth: spacing, LaTeX spelling, wrappers, a unit, and another answer."""
    return [truth, f" {truth} ", truth.replace("\\frac", "\\dfrac"), f"x = {truth}", f"${truth}$",
            f"\\text{{{truth}}}", truth.replace(" ", ""), f"{truth}\\%", f"{{{truth}}}",
            truth.replace("\\left", "").replace("\\right", ""), f"{truth} \\text{{ units}}", other]  # fmt: skip


@pytest.mark.slow
@pytest.mark.shared_data
def test_equivalence_equals_the_reference_on_math500_and_gsm8k(ref):
    """utils:438-482 on every MATH-500 / GSM8K ground truth against itself, 10 rewrites and another answer (21,828
    pairs, less any the reference's unbounded sympy takes over 5 s on)."""
    truths = [
        t.answers[0]
        for name in ("math500_test.jsonl", "gsm8k_test.jsonl")
        for t in load_tasks(shared_file(name))
    ]
    differences, compared = [], 0
    for i, truth in enumerate(truths):
        for given in _variants(truth, truths[(i + 1) % len(truths)]):
            expected = _reference_equal(ref, given, truth)
            if expected is None:
                continue
            compared += 1
            if equivalent(given, truth) != expected:
                differences.append((given, truth, expected))
    assert compared > 20_000 and differences == []


def _responses(truth: str) -> list[str]:
    """Held-out responses: box forms and </think> placements around a ground truth."""
    return [f"\\boxed{{{truth}}}", f"The answer: $\\boxed{{{truth}}}$.", f"\\fbox{{{truth}}}", f"\\boxed {truth}",
            f"<think>\\boxed{{0}}</think>\\boxed{{{truth}}}", f"<think>\\boxed{{{truth}}}</think>so 0",
            f"a</think>\\boxed{{{truth}}}</think>\\boxed{{0}}", f"\\boxed{{{truth}}} \\boxed{{", "\\boxed{}",
            f"\\boxed{{{truth}}}\\boxed{{{truth}}}0}}", ""]  # fmt: skip


@pytest.mark.shared_data
def test_reward_and_extraction_equal_the_reference(ref):
    """reward:39-107 (the whole reward) and utils:393-435,485-488 (extraction) on MATH-500 ground truths."""
    worker = VerifyWorker(backend="reference")
    grader = ReferenceGrader(worker=worker, timeout_s=5.0)
    try:
        differences = []
        for task in load_tasks(shared_file("math500_test.jsonl"))[:120]:
            for response in _responses(task.answers[0]):
                expected_reward, expected_correct = ref.reward({"ground_truth": task.answers[0]}, response)
                result = grader.grade(response, task.answers[0])
                if (result.score, result.correct) != (expected_reward, expected_correct):
                    differences.append((response, task.answers[0], expected_reward, result))
                if reference_boxed(response) != ref.utils.extract_answer(response):
                    differences.append(("extract", response))
        assert differences == []
    finally:
        worker.close()


def test_reward_on_sampled_model_answers_equals_the_reference(ref):
    """reward:39-107 on SmolLM2-135M-Instruct's answers to GSM8K / MATH-500 (benchmarks/data)."""
    if not SAMPLED.is_file():
        pytest.skip(f"{SAMPLED} not found (written by benchmarks/sample_math_answers.py)")
    rows = [json.loads(line) for line in SAMPLED.read_text(encoding="utf-8").splitlines() if line.strip()]
    worker = VerifyWorker(backend="reference")
    grader = ReferenceGrader(worker=worker, timeout_s=5.0)
    try:
        differences = []
        for row in rows:
            expected = ref.reward({"ground_truth": row["answers"]}, row["response"])
            result = grader.grade(row["response"], row["answers"])
            if result.reason != "timeout" and (result.score, result.correct) != expected:
                differences.append((row["task_id"], expected, result))
            assert ReferenceGrader().is_valid(row["response"]) == (
                ref.utils.extract_answer(row["response"]) is not None
            )
        assert len(rows) >= 200 and differences == []
    finally:
        worker.close()
