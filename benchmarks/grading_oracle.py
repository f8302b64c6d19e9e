r"""Oracle check of math grading on the real GSM8K test (1,319) and MATH-500 (500) files.

For every problem, through ``math-solver-v0`` with ``--grader`` (default ``reference``, the env's default: the Dr.
MAS reference's reward; ``math_verify``):

* **oracle**: the Solver answers ``\boxed{<ground truth>}``; it must score 1;
* **wrong**: the Solver answers ``\boxed{<a different answer>}`` (ground truth + 1 when it is a plain number,
  else the next problem's different answer string); it must score 0.

Both graders accept an answer identical to the ground truth without parsing (``exact_shortcut``), so the
oracle pass alone does not exercise the equivalence check. The **self-check** pass therefore grades every ground truth
against itself with ``exact_shortcut=False`` (math-verify on both sides) and lists the problems math-verify
cannot match to themselves (reported, not special-cased). Times are per grading call (env step for the env
passes), in milliseconds.

Usage:
    python benchmarks/grading_oracle.py [--data-dir ../shared/data] [--stride 1] [--timeout-s 1.0]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

import drmas_envs
from drmas_envs.data import load_tasks
from drmas_envs.math.grading import MathGrader

FILES = {"gsm8k": "gsm8k_test.jsonl", "math500": "math500_test.jsonl"}
_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def wrong_answer(tasks, i: int) -> str:
    """A different answer for task ``i``: number + 1, else the next task whose answer string differs."""
    answer = tasks[i].answers[0]
    if _NUMBER.fullmatch(answer):
        return str(int(answer) + 1) if "." not in answer else str(float(answer) + 1)
    for step in range(1, len(tasks)):
        other = tasks[(i + step) % len(tasks)].answers[0]
        if other.strip() != answer.strip():
            return other
    raise ValueError("every task has the same answer")


def _ms(seconds: list[float]) -> dict[str, float]:
    arr = np.asarray(seconds) * 1000.0
    return {
        "p50": round(float(np.percentile(arr, 50)), 3),
        "p99": round(float(np.percentile(arr, 99)), 3),
        "max": round(float(arr.max()), 3),
    }


def env_pass(tasks, indices, answer_of, timeout_s: float, grader: str = "reference") -> tuple[list[float], list[float], list[dict]]:
    """Play one ``math-solver-v0`` episode per index with the answer ``answer_of(i)``; (scores, seconds, infos)."""
    env = drmas_envs.make("math-solver-v0", data=tasks, grade_timeout_s=timeout_s, grader=grader)
    scores, seconds, infos = [], [], []
    for i in indices:
        env.reset(options={"task_index": i})
        action = "\\boxed{" + answer_of(i) + "}"
        start = time.perf_counter()
        env.step(action)
        seconds.append(time.perf_counter() - start)
        info = env.unwrapped.infos["solver"]
        scores.append(info["score"])
        infos.append(info)
    return scores, seconds, infos


def run(data_dir: Path, stride: int, timeout_s: float, env_grader: str = "reference") -> dict:
    """All passes over both files; returns the JSON-ready report."""
    report: dict = {"timeout_s": timeout_s, "stride": stride, "env_grader": env_grader, "datasets": {}}
    grader = MathGrader(timeout_s=timeout_s, exact_shortcut=False)
    # warm the math-verify worker: its start-up (imports) is not part of any grading time
    grader.grade("\\boxed{1}", "1.0")
    for name, filename in FILES.items():
        path = data_dir / filename
        if not path.is_file():
            report["datasets"][name] = {"skipped": f"{path} not found"}
            continue
        tasks = load_tasks(path)
        indices = list(range(0, len(tasks), stride))
        oracle, oracle_s, _ = env_pass(tasks, indices, lambda i, t=tasks: t[i].answers[0], timeout_s, env_grader)
        wrong, wrong_s, wrong_infos = env_pass(
            tasks, indices, lambda i, t=tasks: wrong_answer(t, i), timeout_s, env_grader
        )
        self_s, self_fail = [], []
        for i in indices:
            truth = tasks[i].answers[0]
            start = time.perf_counter()
            result = grader.grade("\\boxed{" + truth + "}", truth)
            self_s.append(time.perf_counter() - start)
            if not result.correct:
                self_fail.append({"task_id": tasks[i].task_id, "answer": truth, "reason": result.reason})
        wrong_scored_1 = [
            {"task_id": tasks[i].task_id, "truth": tasks[i].answers[0], "wrong": wrong_answer(tasks, i)}
            for i, s in zip(indices, wrong, strict=True)
            if s != 0.0
        ]
        report["datasets"][name] = {
            "problems": len(indices),
            "oracle_scored_1": int(sum(s == 1.0 for s in oracle)),
            "wrong_scored_0": int(sum(s == 0.0 for s in wrong)),
            "wrong_scored_1": wrong_scored_1,
            "wrong_grade_reasons": dict(sorted(_count(info["grade_reason"] for info in wrong_infos).items())),
            "env_step_ms_oracle": _ms(oracle_s),
            "env_step_ms_wrong": _ms(wrong_s),
            "math_verify_self_check_correct": len(indices) - len(self_fail),
            "math_verify_self_check_failures": self_fail,
            "math_verify_self_check_ms": _ms(self_s),
        }
    return report


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print JSON; exit code 1 if an oracle answer scored 0 or a wrong one scored 1."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_dir = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    parser.add_argument(
        "--data-dir", type=Path, default=default_dir, help="directory with gsm8k_test.jsonl etc."
    )
    parser.add_argument("--stride", type=int, default=1, help="grade every N-th problem (1 = all)")
    parser.add_argument("--timeout-s", type=float, default=1.0, help="grading wall-clock limit per call")
    parser.add_argument("--grader", default="reference", choices=["reference", "math_verify"],
                        help="the env passes' grader (the self-check is always math-verify)")
    args = parser.parse_args(argv)
    if args.stride < 1:
        parser.error(f"--stride must be >= 1, got {args.stride}")
    report = run(args.data_dir, args.stride, args.timeout_s, args.grader)
    print(json.dumps(report, indent=2))
    bad = any(
        d.get("oracle_scored_1", 0) != d.get("problems", 0) or d.get("wrong_scored_1")
        for d in report["datasets"].values()
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
