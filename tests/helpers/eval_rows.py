"""Synthetic episode rows and run summaries for the eval/results/leaderboard tests."""

from __future__ import annotations

from drmas_train.eval.metrics import summarize_episodes
from drmas_train.eval.results import config_hash, env_version, episode_row


def make_episodes(env_id="toy-v0", sources=("gsm8k",), k=2, won=lambda t, i: (t + i) % 2 == 0, tasks=3):
    """Schema-valid rows: ``tasks`` tasks x ``k`` samples per source; ``won(task, sample)`` decides the outcome."""
    rows = []
    for src in sources:
        for t in range(tasks):
            for i in range(k):
                w = bool(won(t, i))
                rows.append(
                    episode_row(
                        run_id="r1",
                        env_id=env_id,
                        data_source=src,
                        task_id=f"{src}-{t}",
                        sample_index=i,
                        seed=1000 * t + i,
                        policy="oracle",
                        agent_models={"solver": "oracle"},
                        num_turns=1,
                        reward=float(w),
                        won=w,
                        returns={"solver": float(w)},
                        calls={"solver": 1},
                        invalid_actions={"solver": 0},
                        tokens_in={"solver": 0},
                        tokens_out={"solver": 0},
                        wall_time_s=0.001,
                    )
                )
    return rows


def make_summary(rows, k, policy="oracle", label=None, config=None):
    """A summary.json object for ``rows`` (metrics from :func:`summarize_episodes`)."""
    config = config or {"policy": policy, "k": k}
    envs = sorted({r["env_id"] for r in rows})
    return {
        "run_id": "r1",
        "label": label or policy,
        "drmas_version": "0.1.0",
        "git_commit": None,
        "config": config,
        "config_hash": config_hash(config),
        "policy": policy,
        "agent_models": {"solver": policy},
        "envs": [{"env_id": e, "version": env_version(e)} for e in envs],
        "k": k,
        "sampling": {"temperature": 0.6, "top_p": 0.95},
        "num_episodes": len(rows),
        "wall_time_s": 0.1,
        "metrics": summarize_episodes(rows),
    }
