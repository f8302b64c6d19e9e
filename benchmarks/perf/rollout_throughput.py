"""Rollout throughput: the lock-step engine (one batched generate call per model per step) vs a naive loop that
plays one env at a time (one generate call per agent call), same model, same envs, same sampling.

Prints one JSON object: for each engine the wall time, agent calls/s and generated tokens/s, the speed-up
(target >= 5x at 16 tasks x n=4), and the lock-step engine's share of wall time spent outside generation
(env steps, observation building, bookkeeping; target < 1 %). For the ``hf`` backend each engine also reports the
backend's counters: real prompt tokens vs tokens actually prefilled (shared prompt prefixes are computed once in a
batch, see ``drmas_train.model.prefill``), forwards and generated tokens.

    python benchmarks/perf/rollout_throughput.py                      # tiny-qwen3, math-solver-verifier-v0
    python benchmarks/perf/rollout_throughput.py --model smollm2-135m-instruct --repeats 2   # ~25 min on 1 core
    python benchmarks/perf/rollout_throughput.py --model tiny-llama --tasks 16 --n 4 --max-new-tokens 32

On a shared machine the naive loop's time varies by +-20 % from run to run (its single-row decode is bound by
memory bandwidth, which neighbours share), so ``--repeats`` alternates the engines and reports median times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def naive_loop(env_fn, tasks, n, backend, sampling, seed):
    """One env at a time, one generate call per agent call. Returns (calls, generated tokens, generate seconds)."""
    calls = tokens = 0
    gen_s = 0.0
    k = 0
    for task in tasks:
        for _ in range(n):
            env = env_fn()
            env.reset(seed=seed + k, options={"task_index": task})
            for agent in env.agent_iter():
                _, _, terminated, truncated, _ = env.last()
                if terminated or truncated:
                    env.step(None)
                    continue
                t0 = time.perf_counter()
                (gen,) = backend.generate(
                    [list(env.observe(agent)["messages"])], sampling.replace(seed=seed + k * 1000 + calls)
                )
                gen_s += time.perf_counter() - t0
                calls += 1
                tokens += len(gen.response_ids)
                env.step(gen.text)
            k += 1
    return calls, tokens, gen_s


def summarise(runs: list[dict]) -> dict:
    """Median wall time over repeated runs of one engine, rates from it, every run's wall time, the first
    run's counts (identical across repeats for the same seed), the worst outside-generation share."""
    wall = statistics.median(r["wall_s"] for r in runs)
    first = runs[0]
    return {
        "wall_s": round(wall, 3),
        "wall_s_runs": [round(r["wall_s"], 3) for r in runs],
        "agent_calls": first["agent_calls"],
        "generated_tokens": first["generated_tokens"],
        "agent_calls_per_s": round(first["agent_calls"] / wall, 3),
        "tokens_per_s": round(first["generated_tokens"] / wall, 1),
        "generate_calls": first["generate_calls"],
        "outside_generation_share": round(max(r["outside_generation_share"] for r in runs), 5),
        "backend_counters": first["backend_counters"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default="tiny-qwen3", help="named model, local path or HF id (one model for all agents)"
    )
    p.add_argument("--env", default="math-solver-verifier-v0")
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--n", type=int, default=4, help="rollouts per task (group size)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="alternate lock-step and naive runs this often; medians reported",
    )
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import drmas_envs
    from drmas_train.backends.base import SamplingParams
    from drmas_train.backends.factory import build_models
    from drmas_train.collect.rollout import rollout

    def env_fn():
        return drmas_envs.make(args.env)

    probe = env_fn()
    pool = build_models({"*": args.model}, env_agents=list(probe.possible_agents))
    (backend,) = pool.backends.values()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    tasks = list(range(args.tasks))
    rollout(
        env_fn, tasks[:1], 1, pool, sampling, seed=args.seed, progress=False
    )  # warm-up (imports, allocator)

    from collections import Counter

    def run_lockstep() -> dict:
        backend.counters = Counter()
        t0 = time.perf_counter()
        result = rollout(
            env_fn,
            tasks,
            args.n,
            pool,
            sampling,
            seed=args.seed,
            max_prompt_tokens=args.max_prompt_tokens,
            progress=False,
        )
        wall = time.perf_counter() - t0
        return {
            "wall_s": wall,
            "agent_calls": len(result.samples),
            "generated_tokens": sum(len(s.response_ids) for s in result.samples),
            "generate_calls": int(result.timing["generate_calls"]),
            "outside_generation_share": 1 - result.timing["generate"] / result.timing["total"],
            "backend_counters": dict(getattr(backend, "counters", {})),
        }

    def run_naive() -> dict:
        backend.counters = Counter()
        t0 = time.perf_counter()
        calls, tokens, gen_s = naive_loop(env_fn, tasks, args.n, backend, sampling, args.seed)
        wall = time.perf_counter() - t0
        return {
            "wall_s": wall,
            "agent_calls": calls,
            "generated_tokens": tokens,
            "generate_calls": calls,
            "outside_generation_share": 1 - gen_s / wall,
            "backend_counters": dict(getattr(backend, "counters", {})),
        }

    runs: dict[str, list[dict]] = {"lockstep": [], "naive": []}
    for _ in range(args.repeats):  # alternate, so slow phases of a shared machine hit both engines
        runs["lockstep"].append(run_lockstep())
        runs["naive"].append(run_naive())
    engines = {name: summarise(rs) for name, rs in runs.items()}
    lock, naive = engines["lockstep"], engines["naive"]
    speedup_calls = lock["agent_calls_per_s"] / naive["agent_calls_per_s"]
    speedup_tokens = lock["tokens_per_s"] / naive["tokens_per_s"]
    print(
        json.dumps(
            {
                "benchmark": "rollout_throughput",
                "model": args.model,
                "env": args.env,
                "tasks": args.tasks,
                "n": args.n,
                "max_new_tokens": args.max_new_tokens,
                "torch_threads": args.threads,
                "repeats": args.repeats,
                "lockstep": lock,
                "naive": naive,
                "speedup_agent_calls_per_s": round(speedup_calls, 2),
                "speedup_tokens_per_s": round(speedup_tokens, 2),
                "targets": {
                    "speedup_ge_5x": speedup_calls >= 5,
                    "outside_generation_lt_1pct": lock["outside_generation_share"] < 0.01,
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
