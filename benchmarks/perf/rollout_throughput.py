"""Rollout throughput: the lock-step engine (one batched generate call per model per step) vs a naive loop that
plays one env at a time (one generate call per agent call), same model, same envs, same sampling.

Prints one JSON object: for each engine the wall time, agent calls/s and generated tokens/s, the speed-up
(target >= 5x at 16 tasks x n=4), and the lock-step engine's share of wall time spent outside generation
(env steps, observation building, bookkeeping; target < 1 %). For the ``hf`` backend each engine also reports the
backend's counters: real prompt tokens vs tokens actually prefilled (shared prompt prefixes are computed once in a
batch, see ``drmas_train.backends.prefill``), forwards and generated tokens.

    python benchmarks/perf/rollout_throughput.py                      # tiny-qwen3, math-solver-verifier-v0
    python benchmarks/perf/rollout_throughput.py --model tiny-llama --tasks 16 --n 4 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default="tiny-qwen3", help="named model, local path or HF id (one model for all agents)"
    )
    p.add_argument("--env", default="math-solver-verifier-v0")
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--n", type=int, default=4, help="rollouts per task (group size)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import drmas_envs
    from drmas_train.assignment import build_models
    from drmas_train.backends.base import SamplingParams
    from drmas_train.rollout import rollout

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
    lock_s = time.perf_counter() - t0
    lock_calls = len(result.samples)
    lock_tokens = sum(len(s.response_ids) for s in result.samples)

    lock_counters = dict(getattr(backend, "counters", {}))
    backend.counters = Counter()
    t0 = time.perf_counter()
    naive_calls, naive_tokens, naive_gen_s = naive_loop(env_fn, tasks, args.n, backend, sampling, args.seed)
    naive_s = time.perf_counter() - t0
    naive_counters = dict(getattr(backend, "counters", {}))

    lock = {
        "wall_s": round(lock_s, 3),
        "agent_calls": lock_calls,
        "generated_tokens": lock_tokens,
        "agent_calls_per_s": round(lock_calls / lock_s, 2),
        "tokens_per_s": round(lock_tokens / lock_s, 1),
        "generate_calls": int(result.timing["generate_calls"]),
        "generate_s": round(result.timing["generate"], 3),
        "outside_generation_share": round(1 - result.timing["generate"] / result.timing["total"], 5),
        "backend_counters": lock_counters,
    }
    naive = {
        "wall_s": round(naive_s, 3),
        "agent_calls": naive_calls,
        "generated_tokens": naive_tokens,
        "agent_calls_per_s": round(naive_calls / naive_s, 2),
        "tokens_per_s": round(naive_tokens / naive_s, 1),
        "generate_calls": naive_calls,
        "outside_generation_share": round(1 - naive_gen_s / naive_s, 5),
        "backend_counters": naive_counters,
    }
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
