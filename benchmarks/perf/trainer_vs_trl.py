"""The PPO update of drmas vs TRL's ``GRPOTrainer`` step, same model, same prompts and completions, interleaved.

Both sides train on exactly the same token sequences: one preparation process samples ``--group`` completions of
``--max-new-tokens`` for each GSM8K prompt with ``transformers.generate`` (SmolLM2-135M-Instruct by default) and
grades them; then, per round, one fresh process per side runs ``--warmup`` + ``--steps`` optimizer steps of
``--batch`` prompts x ``--group`` completions each and reports its step times and its peak RSS. Sides run one after
the other inside a round (interleaved, so that a noisy neighbour hits both), and the medians over rounds are kept.

Sides:

* ``drmas``: :func:`drmas_train.algorithm.update.ppo_update` with this library's defaults (shared prompts, chunked LM head,
  fused AdamW), ``--micro-batch-tokens`` per forward/backward;
* ``drmas-plain``: the same update on the previous path (full logits, no prompt sharing, for-loop AdamW), to
  show what the lean update buys;
* ``trl``: ``GRPOTrainer`` with its defaults (gradient checkpointing on, DAPO loss, beta 0) except ``bf16``, which
  follows ``--precision``, and the completions supplied by a ``rollout_func`` that returns the prepared ones (no
  generation is timed);
* ``trl-nogc``: the same with ``gradient_checkpointing=False``.

Precision (``--precision``), the same on both sides: ``float32`` (float32 weights and compute; TRL ``bf16=False``) or
``bf16`` (float32 master weights and AdamW state, forward and backward under ``torch.autocast(dtype=bfloat16)``:
drmas ``optim.autocast=bf16``, TRL ``bf16=True``, which on a CPU is accelerate's bf16 autocast). bf16 is native on a
CPU with AVX512-BF16 or AMX (``drmas_train.model.precision.cpu_bf16_isa``) and emulated, hence slower, elsewhere.

Advantage modes: ``nonzero`` gives every completion a distinct random reward (every advantage non-zero: like for
like, nobody can skip work); ``real`` grades the completions (math-verify), so most groups may have equal rewards
and zero advantages (drmas then skips those samples exactly; TRL computes them anyway).

Trained tokens/s = (prompt + completion tokens of the step's sequences) / step wall time (forward, backward,
optimizer step); tokens per CPU second divides by the process's CPU time instead, which a loaded machine distorts
much less (one thread per process: CPU time = time on a core). Peak RSS = the process's ``ru_maxrss`` (model load
included, the same for every side).

    python benchmarks/perf/trainer_vs_trl.py                                   # SmolLM2, 1 round, ~15 min on 1 core
    python benchmarks/perf/trainer_vs_trl.py --model tiny-llama --max-new-tokens 32 --rounds 2   # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIDES = ("drmas", "drmas-plain", "trl", "trl-nogc")
MODES = ("nonzero", "real")
INSTRUCTION = "Solve the problem step by step and put the final answer in \\boxed{}."


def _tasks(data: str | None, count: int):
    from drmas_envs.data.load import load_tasks

    spec = data or "reasoning_gym:gsm_symbolic"
    source = load_tasks(Path(spec) if Path(spec).is_file() else spec, seed=0)
    return [source[i] for i in range(count)]


def prepare(args: argparse.Namespace, out: Path) -> None:
    """Sample and grade the completions both sides train on; writes ``out`` (JSON)."""
    import numpy as np
    import torch

    from drmas_envs.math.grading import grade
    from drmas_train.model.logprobs import forward_logprobs
    from drmas_train.model.models import load_model

    torch.manual_seed(0)
    loaded = load_model(args.model)
    model, tok = loaded.model.eval(), loaded.tokenizer
    rng = np.random.default_rng(0)
    steps = []
    tasks = _tasks(args.data, args.batch * (args.warmup + args.steps))
    for s in range(args.warmup + args.steps):
        rows = []
        for task in tasks[s * args.batch : (s + 1) * args.batch]:
            text = f"{task.question}\n{INSTRUCTION}"
            prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False)  # fmt: skip
            prompt = list(prompt["input_ids"] if isinstance(prompt, dict) else prompt)
            ids = torch.tensor([prompt] * args.group)
            with torch.no_grad():
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                     top_k=0, top_p=1.0, max_new_tokens=args.max_new_tokens,
                                     pad_token_id=tok.pad_token_id)  # fmt: skip
            completions = []
            for row in gen[:, len(prompt) :].tolist():
                if tok.eos_token_id in row:
                    row = row[: row.index(tok.eos_token_id) + 1]
                completions.append([t for t in row if t != tok.pad_token_id] or [tok.eos_token_id])
            with torch.no_grad():
                old, _, _ = forward_logprobs(model, [prompt] * args.group, completions, pad_token_id=tok.pad_token_id)
            answers = task.answer if isinstance(task.answer, (list, tuple)) else [task.answer]
            for k, c in enumerate(completions):
                real = float(grade(tok.decode(c, skip_special_tokens=True), list(answers)).correct)
                rows.append({"text": text, "prompt_ids": prompt, "completion_ids": c,
                             "old_logprobs": old[k, : len(c)].tolist(), "reward_real": real,
                             "reward_nonzero": float(rng.normal())})  # fmt: skip
        steps.append(rows)
    out.write_text(json.dumps({"steps": steps, "pad_token_id": tok.pad_token_id}))


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB on Linux


def worker_drmas(args: argparse.Namespace, data: dict, plain: bool) -> dict:
    """Timed ``ppo_update`` steps; returns per-step seconds and tokens."""
    import numpy as np
    import torch

    from drmas_train.algorithm.advantages import get_estimator
    from drmas_train.algorithm.optim import build_optimizer
    from drmas_train.algorithm.settings import UpdateSettings
    from drmas_train.algorithm.update import ppo_update
    from drmas_train.collect.samples import Sample
    from drmas_train.model.models import load_model

    torch.manual_seed(0)
    model = load_model(args.model).model
    load_rss = _peak_rss_gb()
    opt = build_optimizer("m", model, lr=1e-6)
    fast = {"lm_head_chunk": None, "share_prompts": True}
    if plain:  # the previous path: full logits, no prompt sharing, per-parameter AdamW loop
        fast = {"lm_head_chunk": 0, "share_prompts": False}
        opt.optimizer = torch.optim.AdamW(opt.params, lr=1e-6, weight_decay=0.01, foreach=False)
        opt.scheduler = torch.optim.lr_scheduler.LambdaLR(opt.optimizer, lambda _: 1.0)
    times, cpu, tokens = [], [], []
    for s, rows in enumerate(data["steps"]):
        samples = [Sample(f"p{i // args.group}", f"t{i}", "solver", "m", 0, 0, r["prompt_ids"], r["completion_ids"],
                          r["old_logprobs"], [1] * len(r["completion_ids"])) for i, r in enumerate(rows)]  # fmt: skip
        rewards = np.array([r[f"reward_{args.mode}"] for r in rows])
        adv = get_estimator("grpo")(rewards, uid=[x.uid for x in samples], agent_id=["solver"] * len(samples),
                                    traj_uid=[x.traj_uid for x in samples], turn=[0] * len(samples))  # fmt: skip
        t0, c0 = time.perf_counter(), time.process_time()
        settings = UpdateSettings.defaults(micro_batch_tokens=args.micro_batch_tokens,
                                           activation_checkpointing=args.activation_checkpointing,
                                           autocast="bf16" if args.precision == "bf16" else "off", **fast)  # fmt: skip
        ppo_update(model, opt, samples, adv, settings, pad_token_id=data["pad_token_id"], seed=s)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        tokens.append(sum(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows))
    return {"step_s": times, "cpu_s": cpu, "tokens": tokens, "peak_rss_after_load_gb": load_rss}


def worker_trl(args: argparse.Namespace, data: dict, checkpointing: bool) -> dict:
    """Timed ``GRPOTrainer`` steps on the prepared completions (callback timestamps around each step)."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from drmas_train.model.models import load_model

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(0)
    loaded = load_model(args.model)
    by_text: dict[str, list[dict]] = {}
    for rows in data["steps"]:
        for r in rows:
            by_text.setdefault(r["text"], []).append(r)
    reward_of = {tuple(r["completion_ids"]): r[f"reward_{args.mode}"] for rows in data["steps"] for r in rows}
    served: dict[str, int] = {}

    def rollout_func(prompts, trainer):  # the prepared completions, in the order TRL asks for them
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for p in prompts:
            k = served.get(p, 0)
            r = by_text[p][k % len(by_text[p])]
            served[p] = k + 1
            out["prompt_ids"].append(r["prompt_ids"])
            out["completion_ids"].append(r["completion_ids"])
            out["logprobs"].append(r["old_logprobs"])
        return out

    def reward(prompts, completions, completion_ids, **kwargs):
        return [reward_of[tuple(c)] for c in completion_ids]

    prompts = [rows[i]["text"] for rows in data["steps"] for i in range(0, len(rows), args.group)]
    times: list[float] = []
    cpu: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)
            cpu.append(time.process_time() - self.c0)

    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp, per_device_train_batch_size=args.batch * args.group, num_generations=args.group,
            max_completion_length=args.max_new_tokens, learning_rate=1e-6, max_steps=len(data["steps"]),
            gradient_checkpointing=checkpointing, bf16=args.precision == "bf16", use_cpu=True, shuffle_dataset=False, report_to=[],
            save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0, dataloader_num_workers=0,
        )  # fmt: skip
        trainer = GRPOTrainer(model=loaded.model, reward_funcs=[reward], args=config,
                              train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=loaded.tokenizer,
                              rollout_func=rollout_func, callbacks=[Timer()])  # fmt: skip
        trainer.train()
        mixed = str(trainer.accelerator.mixed_precision)  # "bf16" when TRL runs under bf16 autocast, else "no"
    tokens = [sum(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows) for rows in data["steps"]]
    return {"step_s": times, "cpu_s": cpu, "tokens": tokens, "mixed_precision": mixed}


def run_worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    data = json.loads(Path(args.data_file).read_text())
    if args.side.startswith("drmas"):
        result = worker_drmas(args, data, plain=args.side == "drmas-plain")
    else:
        result = worker_trl(args, data, checkpointing=args.side == "trl")
    result["peak_rss_gb"] = _peak_rss_gb()
    print("RESULT " + json.dumps(result), flush=True)


def _summary(runs: list[dict], warmup: int) -> dict:
    """Medians over rounds of the timed steps (warm-up steps dropped); rates per wall second and per CPU second."""
    per_round_tps = [sum(r["tokens"][warmup:]) / sum(r["step_s"][warmup:]) for r in runs]
    per_round_cpu = [sum(r["tokens"][warmup:]) / sum(r["cpu_s"][warmup:]) for r in runs]
    per_round_step = [statistics.median(r["step_s"][warmup:]) for r in runs]
    return {
        "tokens_per_s": round(statistics.median(per_round_tps), 2),
        "tokens_per_cpu_s": round(statistics.median(per_round_cpu), 2),
        "step_s": round(statistics.median(per_round_step), 3),
        "peak_rss_gb": round(statistics.median(r["peak_rss_gb"] for r in runs), 3),
        "tokens_per_s_rounds": [round(x, 2) for x in per_round_tps],
        "tokens_per_step": runs[0]["tokens"][warmup:],
        **({"mixed_precision": runs[0]["mixed_precision"]} if "mixed_precision" in runs[0] else {}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--data", default=None, help="tasks: a GSM8K JSONL (default: ../shared/data/gsm8k_test.jsonl "
                        "when present, else reasoning_gym:gsm_symbolic)")  # fmt: skip
    parser.add_argument("--batch", type=int, default=4, help="prompts per step")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per process")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per process")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each process")
    parser.add_argument("--micro-batch-tokens", default="2048", help="drmas token budget per micro-batch or 'auto'; "
                        "a comma-separated list runs the drmas side once per value (sides drmas@<value>)")  # fmt: skip
    parser.add_argument("--activation-checkpointing", type=int, default=0, help="drmas: checkpoint every k-th layer")
    parser.add_argument("--precision", choices=("float32", "bf16"), default="float32",
                        help="both sides: float32, or float32 masters with bf16 autocast (drmas optim.autocast=bf16, "
                             "TRL bf16=True)")  # fmt: skip
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--batch-file", default=None, help="prepared completions: reused when the file exists "
                        "(same --model/--batch/--group/... assumed), else written there")  # fmt: skip
    # worker mode (internal)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--data-file", help=argparse.SUPPRESS)
    parser.add_argument("--prepare-to", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    budgets = [b if b == "auto" else int(b) for b in str(args.micro_batch_tokens).split(",")]
    args.micro_batch_tokens = budgets[0]
    if args.data is None:
        default = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k_test.jsonl"
        args.data = str(default) if default.is_file() else None
    if args.prepare_to:
        import torch

        torch.set_num_threads(args.threads)
        prepare(args, Path(args.prepare_to))
        return 0
    if args.side:
        run_worker(args)
        return 0
    sides = [s for s in args.sides.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    bad = [s for s in sides if s not in SIDES] + [m for m in modes if m not in MODES]
    if bad:
        parser.error(f"unknown side/mode {bad}; sides: {list(SIDES)}, modes: {list(MODES)}")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TRL_EXPERIMENTAL_SILENCE": "1"}
    common = [sys.executable, __file__, "--model", args.model, "--batch", str(args.batch), "--group", str(args.group),
              "--max-new-tokens", str(args.max_new_tokens), "--warmup", str(args.warmup), "--steps", str(args.steps),
              "--threads", str(args.threads), "--activation-checkpointing", str(args.activation_checkpointing),
              "--precision", args.precision]  # fmt: skip
    runs_of = []  # (label, side, budget)
    for side in sides:
        if side.startswith("drmas") and len(budgets) > 1:
            runs_of += [(f"{side}@{b}", side, b) for b in budgets]
        else:
            runs_of.append((side, side, budgets[0]))
    if args.data:
        common += ["--data", args.data]
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        data_file = Path(args.batch_file or Path(tmp) / "batch.json")
        t0 = time.perf_counter()
        if not data_file.is_file():
                subprocess.run([*common, "--micro-batch-tokens", str(budgets[0]), "--prepare-to", str(data_file)], env=env,
                           check=True)  # fmt: skip
        prepare_s = time.perf_counter() - t0
        batch = json.loads(data_file.read_text())
        runs: dict[str, list[dict]] = {}
        for _ in range(args.rounds):
            for mode in modes:
                for label, side, budget in runs_of:  # interleaved: every side once per round
                    proc = subprocess.run([*common, "--micro-batch-tokens", str(budget), "--side", side, "--mode", mode,
                                           "--data-file", str(data_file)], env=env, check=True, capture_output=True,
                                          text=True)  # fmt: skip
                    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
                    runs.setdefault(f"{label}/{mode}", []).append(json.loads(line[len("RESULT ") :]))
                    print(f"{label}/{mode}: {runs[f'{label}/{mode}'][-1]}", file=sys.stderr, flush=True)
    zero_adv_groups = sum(
        len({r["reward_real"] for r in rows[i : i + args.group]}) == 1
        for rows in batch["steps"][args.warmup :] for i in range(0, len(rows), args.group)
    )  # fmt: skip
    result = {
        "config": {k: v for k, v in vars(args).items() if k not in ("side", "mode", "data_file", "prepare_to")},
        "torch_threads_per_process": args.threads,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_1min_at_start": round(load, 2),
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        "prepare_s": round(prepare_s, 1),
        "real_reward_groups_with_zero_std": f"{zero_adv_groups}/{args.steps * args.batch}",
        "sides": {k: _summary(v, args.warmup) for k, v in runs.items()},
    }
    ratios = {}
    ours_labels = [label for label, side, _ in runs_of if side == "drmas"]
    other_labels = [label for label, side, _ in runs_of if side != "drmas"]
    for mode in modes:
        for label in ours_labels:
            for other in other_labels:
                ours, theirs = result["sides"][f"{label}/{mode}"], result["sides"][f"{other}/{mode}"]
                ratios[f"{label}_vs_{other}/{mode}"] = {
                    "tokens_per_s": round(ours["tokens_per_s"] / theirs["tokens_per_s"], 3),
                    "tokens_per_cpu_s": round(ours["tokens_per_cpu_s"] / theirs["tokens_per_cpu_s"], 3),
                    "peak_rss": round(ours["peak_rss_gb"] / theirs["peak_rss_gb"], 3),
                }
    result["ratios"] = ratios
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
