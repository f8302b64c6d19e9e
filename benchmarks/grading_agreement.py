r"""How far the two math graders agree: ``grader="reference"`` (the Dr. MAS reference's reward) vs ``"math_verify"``.

Cases (GSM8K test, 1,319 problems, and MATH-500, 500, from ``--data-dir``):

* ``self``: each ground truth graded against itself (``pre_extracted``, the exact-match shortcut off, so each
  grader's own equivalence check decides);
* ``boxed``: the response ``The answer is $\boxed{<ground truth>}$.`` (shortcut off: extraction + check);
* ``rewrites`` (MATH-500): six rewrites of each ground truth a model might write (``\dfrac`` for ``\frac``,
  ``x = ...``, ``\text{...}``, spaces removed, ``\left``/``\right`` removed, a unit), in a box; shortcut off;
  disagreements are also keyed by the kind of rewrite;
* ``sampled``: SmolLM2-135M-Instruct's replies as the ``math-solver-v0`` Solver
  (``benchmarks/data/smollm2_math_answers.jsonl``, written by ``benchmarks/sample_math_answers.py``), graded as
  in training (shortcut on); also whether the two validity rules (the format penalty) agree.

A disagreement is a pair the graders score differently. Each class is keyed by the two grade reasons
(``reference:<reason> / math_verify:<reason>``) with up to ``--examples`` examples. Prints one JSON object.

Usage:
    python benchmarks/grading_agreement.py [--data-dir ../shared/data] [--answers FILE] [--timeout-s 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from drmas_envs.data import load_tasks
from drmas_envs.math.graders import make_grader

DEFAULT_DATA = Path(
    os.environ.get("DRMAS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)
DEFAULT_ANSWERS = Path(__file__).resolve().parent / "data" / "smollm2_math_answers.jsonl"
FILES = {"gsm8k": "gsm8k_test.jsonl", "math500": "math500_test.jsonl"}


def rewrites(truth: str) -> dict[str, str]:
    """Ways a model writes the same answer (each goes in a box), by kind."""
    return {
        "dfrac": truth.replace("\\frac", "\\dfrac"),
        "x = ...": f"x = {truth}",
        "\\text{...}": f"\\text{{{truth}}}",
        "no spaces": truth.replace(" ", ""),
        "no \\left \\right": truth.replace("\\left", "").replace("\\right", ""),
        "unit": f"{truth} \\text{{ units}}",
    }


def compare(
    pairs: Iterable[tuple[str, str, dict]], graders: dict, *, pre_extracted: bool, examples: int
) -> dict:
    """Grade each ``(response, truth, meta)`` with both graders; agreement and classes of disagreement."""
    n = agree = 0
    correct: Counter[str] = Counter()
    classes: Counter[str] = Counter()
    shown: dict[str, list] = defaultdict(list)
    reasons: dict[str, Counter[str]] = {name: Counter() for name in graders}
    for response, truth, meta in pairs:
        results = {name: g.grade(response, truth, pre_extracted=pre_extracted) for name, g in graders.items()}
        n += 1
        for name, r in results.items():
            correct[name] += r.correct
            reasons[name][r.reason] += 1
        ref, mv = results["reference"], results["math_verify"]
        if ref.correct == mv.correct:
            agree += 1
            continue
        key = (
            "" if "kind" not in meta else f"{meta['kind']}: "
        ) + f"reference:{ref.reason} / math_verify:{mv.reason}"
        classes[key] += 1
        if len(shown[key]) < examples:
            shown[key].append({**meta, "truth": truth, "response": response[-300:],
                               "reference_extracted": ref.extracted, "math_verify_extracted": mv.extracted})  # fmt: skip
    return {
        "n": n,
        "agree": agree,
        "agreement": round(agree / n, 4) if n else None,
        "accuracy": {name: round(correct[name] / n, 4) for name in graders} if n else {},
        "reasons": {name: dict(reasons[name].most_common()) for name in graders},
        "disagreements": {key: {"count": c, "examples": shown[key]} for key, c in classes.most_common()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    p.add_argument("--answers", type=Path, default=DEFAULT_ANSWERS)
    p.add_argument("--timeout-s", type=float, default=1.0)
    p.add_argument("--examples", type=int, default=3)
    args = p.parse_args()
    start = time.monotonic()
    strict = {
        name: make_grader(name, timeout_s=args.timeout_s, exact_shortcut=False)
        for name in ("reference", "math_verify")
    }
    default = {name: make_grader(name, timeout_s=args.timeout_s) for name in ("reference", "math_verify")}
    for g in (*strict.values(), *default.values()):
        g.prestart()
    tasks = {source: load_tasks(args.data_dir / name) for source, name in FILES.items()}
    out: dict = {"graders": {"reference": "drmas_envs.math.reference_grading", "math_verify": "drmas_envs.math.grading"},
                 "timeout_s": args.timeout_s, "cases": {}}  # fmt: skip
    for source, items in tasks.items():
        truths = [(t.answers[0], {"task_id": t.task_id}) for t in items]
        out["cases"][f"self/{source}"] = compare(((a, a, m) for a, m in truths), strict, pre_extracted=True,
                                                 examples=args.examples)  # fmt: skip
        out["cases"][f"boxed/{source}"] = compare(
            ((f"The answer is $\\boxed{{{a}}}$.", a, m) for a, m in truths),
            strict,
            pre_extracted=False,
            examples=args.examples,
        )
    out["cases"]["rewrites/math500"] = compare(
        ((f"\\boxed{{{w}}}", t.answers[0], {"task_id": t.task_id, "kind": k})
         for t in tasks["math500"] for k, w in rewrites(t.answers[0]).items()),
        strict, pre_extracted=False, examples=args.examples,
    )  # fmt: skip
    if args.answers.is_file():
        rows = [
            json.loads(line) for line in args.answers.read_text(encoding="utf-8").splitlines() if line.strip()
        ]
        out["cases"]["sampled"] = compare(((r["response"], r["answers"], {"task_id": r["task_id"]}) for r in rows),
                                          default, pre_extracted=False, examples=args.examples)  # fmt: skip
        valid: Counter[tuple[bool, bool]] = Counter(
            (default["reference"].is_valid(r["response"]), default["math_verify"].is_valid(r["response"]))
            for r in rows
        )
        out["sampled_validity"] = {
            "n": len(rows),
            "agree": valid[(True, True)] + valid[(False, False)],
            "valid_reference_only": valid[(True, False)],
            "valid_math_verify_only": valid[(False, True)],
            "valid_both": valid[(True, True)],
        }
    else:
        out["sampled"] = f"skipped: {args.answers} not found (benchmarks/sample_math_answers.py writes it)"
    out["seconds"] = round(time.monotonic() - start, 1)
    out["load_avg_1m"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
