"""Distributed throughput on the CPU: the Ray path (1 and 2 workers per model) against the single-process path
at equal work — the same config, tasks, samples and advantages.

For each setup it times one iteration's rollout (lock-step, one batched generate call per model per step; with
2 workers each call is spread over 2 generation workers) and one PPO update on one fixed set of samples (with 2
ranks the micro-batches are split over 2 data-parallel ranks), repeated ``--repeats`` times (medians), plus the
one-off start-up of the worker groups. Prints one JSON object:

* ``setups.<name>``: ``startup_s``, ``rollout_s``, ``agent_calls_per_s``, ``gen_tokens_per_s``, ``update_s``,
  ``update_tokens_per_s`` (prompt + response tokens trained per second);
* ``ray_overhead``: ``(ray_1 - single) / single`` for rollout and update time (the cost of the actors, the object
  store and the weight push at equal work);
* ``speedup_2_vs_1``: ``ray_1 / ray_2`` time ratios.

    python benchmarks/perf/distributed.py                               # tiny-qwen3, 4 tasks x G=4
    python benchmarks/perf/distributed.py --model tiny-llama --tasks 8 --group-size 4 --repeats 3

Timings on a shared machine vary from run to run; compare setups from the same invocation only. Two workers only
pay off when there are two idle cores for them (a 2-core laptop also runs the driver).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def _config(args, run_dir: str, *extra: str):
    from drmas_train.run.config import load_config

    return load_config(None, [
        f"models.shared.name_or_path={args.model}", f"run.dir={run_dir}", "run.progress=false", "run.tensorboard=false",
        "run.plot=false", "run.num_threads=1", f"rollout.batch_size={args.tasks}", f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={args.max_new_tokens}", f"seed={args.seed}", *extra,
    ])  # fmt: skip


def _measure(run, args, fixed_samples=None) -> tuple[dict, list]:
    import numpy as np

    from drmas_train.backends.base import SamplingParams
    from drmas_train.collect.rollout import rollout

    r = run.cfg.rollout
    sampling = SamplingParams(temperature=r.temperature, max_new_tokens=r.max_new_tokens)
    tasks = [run.tasks[i] for i in range(args.tasks)]
    roll, upd, calls, tokens, samples = [], [], 0, 0, fixed_samples
    for k in range(args.repeats):
        t0 = time.perf_counter()
        result = rollout(run.env_fn, tasks, r.group_size, run.pool, sampling, seed=args.seed + k,
                         max_prompt_tokens=r.max_prompt_tokens, progress=False)  # fmt: skip
        roll.append(time.perf_counter() - t0)
        calls, tokens = len(result.samples), sum(len(s.response_ids) for s in result.samples)
        samples = samples or result.samples  # every setup updates on the first setup's samples: equal work
        adv = np.random.default_rng(k).normal(size=len(samples))  # non-zero: no sample is skipped
        t0 = time.perf_counter()
        run.updater.update(samples, adv, k)
        upd.append(time.perf_counter() - t0)
    trained = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    rollout_s, update_s = statistics.median(roll), statistics.median(upd)
    return {"rollout_s": round(rollout_s, 3), "rollout_s_runs": [round(x, 3) for x in roll],
            "agent_calls_per_s": round(calls / rollout_s, 2), "gen_tokens_per_s": round(tokens / rollout_s, 1),
            "update_s": round(update_s, 3), "update_s_runs": [round(x, 3) for x in upd],
            "update_tokens_per_s": round(trained / update_s, 1)}, samples  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-qwen3")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--num-cpus", type=int, default=4, help="logical CPUs of the local Ray")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import ray
    import torch

    from drmas_train.distributed.cluster import init_ray
    from drmas_train.run.trainer import build_run

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    init_ray(None, num_cpus=args.num_cpus)
    setups, samples = {}, None
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("single", ()), ("ray_1", ("distributed.enabled=true", "distributed.world_size.shared=1")),
                            ("ray_2", ("distributed.enabled=true", "distributed.world_size.shared=2"))):  # fmt: skip
            t0 = time.perf_counter()
            run = build_run(_config(args, os.path.join(tmp, name), *extra))
            startup = time.perf_counter() - t0
            try:
                setups[name], samples = _measure(run, args, samples)
            finally:
                run.updater.close()
            setups[name]["startup_s"] = round(startup, 2)
    ray.shutdown()
    s, r1, r2 = setups["single"], setups["ray_1"], setups["ray_2"]
    out = {
        "benchmark": "distributed", "model": args.model, "tasks": args.tasks, "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2), "setups": setups,
        "ray_overhead": {"rollout": round((r1["rollout_s"] - s["rollout_s"]) / s["rollout_s"], 3),
                         "update": round((r1["update_s"] - s["update_s"]) / s["update_s"], 3)},
        "speedup_2_vs_1": {"rollout": round(r1["rollout_s"] / r2["rollout_s"], 3),
                           "update": round(r1["update_s"] / r2["update_s"], 3)},
    }  # fmt: skip
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
