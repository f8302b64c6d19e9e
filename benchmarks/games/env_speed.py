"""How fast the OpenSpiel game envs step, and what a fixed opponent costs: env time only, no model.

For each ``openspiel/`` id and each of its fixed opponents (and self-play), plays ``--episodes`` seeded episodes in
which every agent replies a random legal ``<action>`` (valid calls, so no fallback), and prints one JSON object:
episodes and agent calls per second, mean calls per episode, the first-use cost of ``cfr-v0`` (the CFR+ solve, cached
afterwards), and the machine load (``os.getloadavg``) before and after.

    python benchmarks/games/env_speed.py                   # ~10 s on 2 loaded cores
    python benchmarks/games/env_speed.py --episodes 20 --ids openspiel/kuhn_poker-v0

Wall times depend on the machine and its load (printed with them); nothing here is asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time


def legal_random_player(seed: int):
    """A policy replying a uniformly random legal action named in its prompt."""
    rng = random.Random(seed)

    def policy(obs):
        line = next(line for line in obs["prompt"].splitlines() if line.startswith("Legal actions: "))
        return f"<action>{rng.choice(line.removeprefix('Legal actions: ').split(', '))}</action>"

    return policy


def measure(env_id: str, opponent: str | None, episodes: int) -> dict:
    """Episodes/s and calls/s of ``episodes`` seeded episodes of ``env_id`` against ``opponent`` (None: self-play)."""
    import drmas_envs
    from drmas_envs.core import play_episode

    env = drmas_envs.make(env_id, opponent=opponent)
    calls = 0
    start = time.perf_counter()
    for seed in range(episodes):
        policy = legal_random_player(seed)
        record = play_episode(env, dict.fromkeys(env.unwrapped.possible_agents, policy), seed=seed)
        calls += record.num_turns
    wall = time.perf_counter() - start
    return {"env_id": env_id, "opponent": opponent, "episodes": episodes, "wall_s": round(wall, 4),
            "episodes_per_s": round(episodes / wall, 1), "calls_per_s": round(calls / wall, 1),
            "calls_per_episode": round(calls / episodes, 2)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="step speed of the OpenSpiel game envs, per fixed opponent")
    p.add_argument("--episodes", type=int, default=200, help="seeded episodes per (id, opponent)")
    p.add_argument("--ids", nargs="*", default=None, help="env ids (default: every openspiel/ id)")
    args = p.parse_args(argv)
    if args.episodes < 1:
        p.error(f"--episodes must be >= 1, got {args.episodes}")

    import drmas_envs
    from drmas_envs.games.opponents import _cfr_solver

    load_before = os.getloadavg()
    ids = args.ids or sorted(i for i in drmas_envs.registry if i.startswith("openspiel/"))
    cfr_solve_s = {}
    for game in ("kuhn_poker", "leduc_poker"):
        start = time.perf_counter()
        _cfr_solver(game)
        cfr_solve_s[game] = round(time.perf_counter() - start, 3)
    rows = []
    for env_id in ids:
        for opponent in (None, *drmas_envs.make(env_id).unwrapped.OPPONENTS):
            rows.append(measure(env_id, opponent, args.episodes))
    out = {"episodes": args.episodes, "cfr_solve_s": cfr_solve_s, "rows": rows,
           "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
           "cpu_count": os.cpu_count(), "python": sys.version.split()[0]}  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
