"""Step time of every registered env under adversarial actions (issue 14's bad-input pass, re-runnable).

Plays ``--episodes`` episodes per env; each action is drawn from a pool of hostile and ordinary replies (a
``\\boxed{9^{9^{9^{9}}}}`` tower that only a worker kill stops, megabyte strings, deep brace nesting, control
characters, valid protocol replies, the ground truth). Prints JSON: per env the number of steps, their p50, p99
and max wall time in seconds, and how many grades timed out. Bounded grading means max ~ the 1 s limit, and a
normal answer right after a timeout costs milliseconds (a warm spare worker answers it).

    python benchmarks/adversarial_steps.py --episodes 200
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

import drmas_envs

HOSTILE = [
    r"\boxed{9^{9^{9^{9}}}}",
    "\\boxed{" + "9" * 1_000_000 + "}",
    "\\boxed{" + "{" * 200_000,
    "x{" * 300_000,
    "\x00\x1b[2J<verify>" * 1000,
    "<search>" + "a" * 100_000 + "</search>",
    "<answer>" + "\u202e" * 10_000 + "</answer>",
]
ORDINARY = [
    "The answer is \\boxed{42}.",
    "<verify>approve</verify>",
    "<verify>reject</verify>",
    "<verify>no</verify>",
    "<verify>yes</verify>",
    "<search>capital city</search>",
    "<answer>unknown</answer>",
    "I am not sure.",
]


def _action(rng: random.Random, env: object, agent: str) -> str:
    roll = rng.random()
    if roll < 0.03:
        return HOSTILE[0]  # the tower: a grade that must be killed
    if roll < 0.15:
        return rng.choice(HOSTILE[1:])
    if roll < 0.3:
        answer = getattr(getattr(env, "task", None), "answer", "0")
        answer = answer[0] if isinstance(answer, tuple) else answer
        return rng.choice([f"\\boxed{{{answer}}}", f"<answer>{answer}</answer>"])
    return rng.choice(ORDINARY)


def run(env_id: str, episodes: int, seed: int) -> dict[str, float]:
    """Step-time statistics of one env over ``episodes`` adversarial episodes."""
    env = drmas_envs.make(env_id)
    rng = random.Random(seed)
    times, slow = [], 0
    env.reset(seed=seed)  # warm-up (grader start-up is not a step)
    for ep in range(episodes):
        env.reset(seed=seed + ep)
        for agent in env.agent_iter():
            _, _, term, trunc, _ = env.last()
            action = None if term or trunc else _action(rng, env.unwrapped, agent)
            start = time.perf_counter()
            env.step(action)
            if action is not None:
                times.append(time.perf_counter() - start)
                slow += times[-1] > 0.5  # half the 1 s grading limit: a grade was killed or waited for a worker
    t = np.array(times)
    return {"steps": len(t), "p50_s": float(np.percentile(t, 50)), "p99_s": float(np.percentile(t, 99)),
            "max_s": float(t.max()), "steps_over_0.5s": slow}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env", action="append", default=None, help="env id (repeat; default: every registered env)")
    args = parser.parse_args()
    ids = args.env or sorted(drmas_envs.registry)
    print(json.dumps({env_id: run(env_id, args.episodes, args.seed) for env_id in ids}, indent=2))


if __name__ == "__main__":
    main()
