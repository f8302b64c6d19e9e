r"""Sample model answers to GSM8K / MATH-500 questions for the grader-agreement benchmark.

SmolLM2-135M-Instruct (drmas's offline named model) answers the first ``--per-source`` questions of each file as
the ``math-solver-v0`` Solver (the env's own prompt and system message, chat template, one sample per question),
and every reply is written with its ground truths to one JSONL row::

    {"source": "gsm8k", "task_id": "gsm8k-0", "answers": ["18"], "response": "..."}

The file is committed (``benchmarks/data/smollm2_math_answers.jsonl``) so that
``benchmarks/grading_agreement.py`` reruns the comparison without the model. Deterministic for a given torch
build (seeded sampling, one thread).

Usage:
    OMP_NUM_THREADS=1 python benchmarks/sample_math_answers.py [--data-dir DIR] [--per-source 150] \
        [--max-new-tokens 320] [--out benchmarks/data/smollm2_math_answers.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

DEFAULT_DATA = Path(
    os.environ.get("DRMAS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)
FILES = {"gsm8k": "gsm8k_test.jsonl", "math500": "math500_test.jsonl"}
DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "smollm2_math_answers.jsonl"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    p.add_argument("--per-source", type=int, default=150)
    p.add_argument("--max-new-tokens", type=int, default=320)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args()

    import torch

    import drmas_envs
    from drmas_train.model.models import load_model

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    loaded = load_model("smollm2-135m-instruct")
    model, tok = loaded.model, loaded.tokenizer
    tok.padding_side = "left"
    rows = []
    for source, name in FILES.items():
        env = drmas_envs.make("math-solver-v0", data=str(args.data_dir / name))
        for i in range(min(args.per_source, len(env.unwrapped.tasks))):
            env.reset(options={"task_index": i})
            task = env.unwrapped.task
            messages = list(env.observe("solver")["messages"])
            prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            rows.append(
                {"source": source, "task_id": task.task_id, "answers": list(task.answers), "prompt": prompt}
            )
    start = time.monotonic()
    for b in range(0, len(rows), args.batch):
        chunk = rows[b : b + args.batch]
        enc = tok([r["prompt"] for r in chunk], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(
                **enc,
                do_sample=True,
                temperature=args.temperature,
                top_p=1.0,
                max_new_tokens=args.max_new_tokens,
                pad_token_id=tok.pad_token_id,
            )
        for r, seq in zip(chunk, out[:, enc["input_ids"].shape[1] :], strict=True):
            r["response"] = tok.decode(seq, skip_special_tokens=True)
        print(f"{b + len(chunk)}/{len(rows)} answers, {time.monotonic() - start:.0f} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(
                json.dumps(
                    {k: r[k] for k in ("source", "task_id", "answers", "response")}, ensure_ascii=False
                )
                + "\n"
            )
    print(
        json.dumps({"rows": len(rows), "seconds": round(time.monotonic() - start, 1), "out": str(args.out)})
    )


if __name__ == "__main__":
    main()
