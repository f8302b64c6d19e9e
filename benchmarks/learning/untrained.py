"""How does the untrained model do on a preset's task? One lock-step rollout of N training tasks x k samples with
the initial weights, no update: what docs/quickstart.md's candidate tables report, measured before training.

    HF_HUB_OFFLINE=1 python benchmarks/learning/untrained.py --config quickstart_search --tasks 16 --k 4
    HF_HUB_OFFLINE=1 python benchmarks/learning/untrained.py --config quickstart_search env.kwargs.max_steps=3

Prints one JSON object: ``accuracy`` (share of episodes won), ``valid`` (per agent: the share of its calls that
followed the output protocol), ``varied_groups`` (per agent: the share of prompt groups in which that agent's calls
have more than one reward value, the condition for a non-zero Dr. MAS advantage; groups where the agent did not act
count as not varied), ``calls_per_episode`` (per agent), ``ended_by`` (the env's ``ended_by`` info, counted; search
envs), ``prompt_tokens`` / ``response_tokens`` (mean per call), ``rollout_s`` (the rollout's wall time),
``threads`` and ``load_average`` (1-minute load before the start), and with ``--show N`` the first N episodes'
transcripts on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np


def summarize(samples: list, trajectories: list) -> dict:
    """The candidate figures of one rollout (``RolloutResult.samples`` / ``.trajectories``)."""
    agents = sorted({s.agent_id for s in samples})
    rewards: dict[str, dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )  # agent -> uid -> rewards
    for s in samples:
        rewards[s.agent_id][s.uid].append(s.reward)
    groups = sorted({t.uid for t in trajectories})
    ended = Counter(str(t.episode.metrics.get("ended_by", "")) for t in trajectories)
    n = len(trajectories)
    return {
        "episodes": n,
        "accuracy": round(sum(t.won for t in trajectories) / n, 4),
        "valid": {
            a: round(float(np.mean([s.is_action_valid for s in samples if s.agent_id == a])), 4)
            for a in agents
        },
        "varied_groups": {
            a: round(sum(len(set(rewards[a].get(u, []))) > 1 for u in groups) / len(groups), 4)
            for a in agents
        },  # fmt: skip
        "calls_per_episode": {a: round(sum(s.agent_id == a for s in samples) / n, 3) for a in agents},
        "ended_by": dict(ended),
        "prompt_tokens": round(float(np.mean([len(s.prompt_ids) for s in samples])), 1),
        "response_tokens": round(float(np.mean([len(s.response_ids) for s in samples])), 1),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="quickstart_search", help="preset name or YAML path")
    parser.add_argument(
        "--tasks", type=int, default=16, help="N: training tasks (the first N of the task source)"
    )
    parser.add_argument("--k", type=int, default=4, help="samples per task (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="rollout seed")
    parser.add_argument("--show", type=int, default=0, help="print the first SHOW episodes' calls on stderr")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, as drmas train")
    args = parser.parse_args(argv)

    from drmas_train.backends.base import SamplingParams
    from drmas_train.collect.rollout import rollout
    from drmas_train.run.config import load_config
    from drmas_train.run.trainer import build_run

    run_dir = Path(tempfile.mkdtemp(prefix="drmas-untrained-")) / "run"
    cfg = load_config(args.config, [*args.overrides, f"run.dir={run_dir}", "run.progress=false", "eval.every=0",
                                    "run.tensorboard=false", "run.plot=false"])  # fmt: skip
    run = build_run(cfg)
    r = cfg.rollout
    tasks = [run.tasks[i] for i in range(min(args.tasks, len(run.tasks)))]
    sampling = SamplingParams(
        temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens
    )
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = rollout(run.env_fn, tasks, args.k, run.pool, sampling, seed=args.seed,
                     max_prompt_tokens=r.max_prompt_tokens, truncation=r.truncation, progress=False)  # fmt: skip
    out = {"config": args.config, "overrides": args.overrides, "tasks": len(tasks), "k": args.k,
           **summarize(result.samples, result.trajectories), "rollout_s": round(time.perf_counter() - t0, 1),
           "threads": cfg.run.num_threads or len(os.sched_getaffinity(0)), "load_average": load}  # fmt: skip
    by_traj: dict[str, list] = defaultdict(list)
    for s in result.samples:
        by_traj[s.traj_uid].append(s)
    for traj in result.trajectories[: args.show]:
        print(f"=== {traj.task_id} won={traj.won} {traj.episode.task.answers}", file=sys.stderr)
        for s in by_traj[traj.traj_uid]:
            print(
                f"--- {s.agent_id} valid={s.is_action_valid} reward={s.reward:+.3f}\n{s.response_text}",
                file=sys.stderr,
            )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
