r"""Conformance checks every registered drmas env must pass: :func:`check_env`.

``check_env(env_id)`` runs, in order:

1. ``pettingzoo.test.api_test`` on ``make(env_id)``;
2. ``pettingzoo.test.seed_test`` (two envs, seed 42, sampled actions);
3. ``pettingzoo.test.render_test`` (``ansi`` returns a str, ``human`` returns None);
4. ``pettingzoo.test.parallel_api_test`` on ``pettingzoo.utils.conversions.turn_based_aec_to_parallel(make(env_id))``;
5. **determinism**: two envs, same seeds, same scripted actions (:data:`SCRIPTED_ACTIONS`, which exercise the
   boxed / verdict / tool-tag protocols) over several episodes give identical transcripts (agent, observation,
   reward, cumulative reward, termination, truncation, infos; :func:`transcript`);
6. **cross-process**: the same transcript computed in fresh interpreters under ``PYTHONHASHSEED`` 1 and 2 equals
   the in-process one (env workers run in other processes; set/dict-order bugs show up here, as in Gymnasium's
   ``Text`` test). Needs JSON-serialisable ``kwargs``.

Separately, :func:`check_episode_record` checks that ``episode_record()`` agrees with what the AEC API reported
(calls, texts, validity, penalties, final ``score``/``won``, per-agent returns) and round-trips through JSON.

Each check raises ``AssertionError`` (PettingZoo's) or :class:`ConformanceError` naming the env and the first
difference. It returns the seconds each check took.

Example:
    >>> from drmas_envs.testing import check_env
    >>> timings = check_env("math-solver-v0")
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import drmas_envs

__all__ = [
    "ConformanceError",
    "SCRIPTED_ACTIONS",
    "transcript",
    "transcript_json",
    "cross_process_transcripts",
    "compare_transcripts",
    "check_episode_record",
    "check_env",
]

#: Actions cycled by step index in the determinism checks: plain text, the math protocol, tool tags, odd text.
SCRIPTED_ACTIONS = (
    "Let me think step by step.",
    "The answer is \\boxed{42}.",
    "Looks wrong. <verify>reject</verify>",
    "<search>capital of France</search>",
    "The result is \\boxed{\\frac{1}{2}} <verify>approve</verify> <answer>Paris</answer>",
    "",
    "ünïcödé ✓ \\fbox{7}",
)


class ConformanceError(AssertionError):
    """An env failed a drmas conformance check (the message names the env, check and first difference)."""


def transcript(
    env_id: str, *, seeds: tuple[int, ...] = (0, 1, 2), max_steps: int = 64, **kwargs: Any
) -> list[Any]:
    """Play one episode per seed with :data:`SCRIPTED_ACTIONS`; return every step as JSON-ready rows.

    Row: ``[agent, prompt, cumulative_reward, terminated, truncated, info, action]`` from ``last()`` before
    each step (dead steps included, action ``None``), plus ``["render", <ansi transcript>]`` at each episode end.

    Raises:
        ConformanceError: an episode longer than ``max_steps`` steps.
    """
    env = drmas_envs.make(env_id, render_mode="ansi", **kwargs)
    rows: list[Any] = []
    step = 0
    for seed in seeds:
        env.reset(seed=seed)
        for n, agent in enumerate(env.agent_iter()):
            if n >= max_steps:
                raise ConformanceError(
                    f"{env_id}: episode with seed {seed} did not end within {max_steps} steps"
                )
            obs, reward, terminated, truncated, info = env.last()
            action = None if terminated or truncated else SCRIPTED_ACTIONS[step % len(SCRIPTED_ACTIONS)]
            rows.append([agent, obs["prompt"], reward, terminated, truncated, info, action])
            env.step(action)
            step += 1
        rows.append(["render", env.render()])
    env.close()
    return rows


def transcript_json(env_id: str, **kwargs: Any) -> str:
    """:func:`transcript` as one JSON string (unknown objects by ``repr``, so set order differences show)."""
    return json.dumps(transcript(env_id, **kwargs), default=repr, ensure_ascii=False)


def _first_difference(a: str, b: str) -> str:
    rows_a, rows_b = json.loads(a), json.loads(b)
    for i, (ra, rb) in enumerate(zip(rows_a, rows_b, strict=False)):
        if ra != rb:
            return f"step {i}: {str(ra)[:300]!r} != {str(rb)[:300]!r}"
    return f"lengths {len(rows_a)} != {len(rows_b)}"


_CHILD = (
    "import json, sys\n"
    "from drmas_envs.testing import transcript_json\n"
    "out = {}\n"
    "for env_id in json.loads(sys.argv[1]):\n"
    "    try:\n"
    "        out[env_id] = transcript_json(env_id, **json.loads(sys.argv[2]))\n"
    "    except Exception as err:\n"
    "        out[env_id] = 'ERROR ' + type(err).__name__ + ': ' + str(err)\n"
    "print(json.dumps(out))\n"
)


def cross_process_transcripts(
    env_ids: list[str], hash_seeds: tuple[int, ...] = (1, 2), **kwargs: Any
) -> dict[int, dict[str, str]]:
    """:func:`transcript_json` of each env id, computed in one fresh interpreter per ``PYTHONHASHSEED`` value.

    The interpreters run concurrently. A failing env maps to ``"ERROR <type>: <message>"``.

    Returns:
        ``{hash_seed: {env_id: transcript_json}}``.

    Raises:
        TypeError: ``kwargs`` not JSON-serialisable. ConformanceError: a subprocess crashed.
    """
    try:
        encoded = json.dumps(kwargs)
    except TypeError as err:
        raise TypeError(
            f"the cross-process check needs JSON-serialisable env kwargs, got {kwargs!r}"
        ) from err
    procs = []
    for hash_seed in hash_seeds:
        env = {**os.environ, "PYTHONHASHSEED": str(hash_seed), "PYTHONIOENCODING": "utf-8"}
        cmd = [sys.executable, "-c", _CHILD, json.dumps(list(env_ids)), encoded]
        procs.append(
            (
                hash_seed,
                subprocess.Popen(
                    cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8"
                ),
            )
        )
    results: dict[int, dict[str, str]] = {}
    for hash_seed, proc in procs:
        out, err = proc.communicate(timeout=600)
        lines = out.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise ConformanceError(
                f"transcript subprocess (PYTHONHASHSEED={hash_seed}) failed:\n{err[-2000:]}"
            )
        results[hash_seed] = json.loads(lines[-1])
    return results


def compare_transcripts(env_id: str, expected: str, by_hash_seed: dict[int, dict[str, str]]) -> None:
    """Raise :class:`ConformanceError` unless every cross-process transcript of ``env_id`` equals ``expected``."""
    for hash_seed, transcripts in by_hash_seed.items():
        got = transcripts.get(env_id, "ERROR missing")
        if got.startswith("ERROR "):
            raise ConformanceError(f"{env_id}: transcript under PYTHONHASHSEED={hash_seed} failed: {got[6:]}")
        if got != expected:
            raise ConformanceError(
                f"{env_id}: transcript under PYTHONHASHSEED={hash_seed} differs from this process: "
                + _first_difference(expected, got)
            )


def check_episode_record(env_id: str, *, seeds: tuple[int, ...] = (0, 1, 2), max_steps: int = 64, **kwargs: Any) -> None:
    """Play :data:`SCRIPTED_ACTIONS` episodes and check the env's record against the AEC API's own reports.

    Raises:
        ConformanceError: naming the env, the seed and the first field where the record disagrees.
    """
    from drmas_envs.core.episode import EpisodeRecord, episode_record

    env = drmas_envs.make(env_id, **kwargs)
    step = 0
    for seed in seeds:
        env.reset(seed=seed)
        seen: list[tuple[str, str, bool, float]] = []  # (agent, action, valid, penalty) as the AEC API reported
        final: dict[str, Any] = {}
        for n, agent in enumerate(env.agent_iter()):
            if n >= max_steps:
                raise ConformanceError(f"{env_id}: episode with seed {seed} did not end within {max_steps} steps")
            _, _, terminated, truncated, _ = env.last()
            if terminated or truncated:
                env.step(None)
                continue
            action = SCRIPTED_ACTIONS[step % len(SCRIPTED_ACTIONS)]
            step += 1
            env.step(action)
            info = env.infos[agent]
            seen.append((agent, action, bool(info["is_action_valid"]), float(info["penalty"])))
            final = dict(info) if "score" in info else final
        record = episode_record(env)
        got = [(c.agent_id, c.text, c.valid, c.penalty) for c in record.calls]
        checks = [
            ("calls", got, seen),
            ("reward", record.reward, final.get("score")),
            ("won", record.won, final.get("won")),
            ("returns", dict(record.returns), {a: float(r) for a, r in env.unwrapped.episode_returns.items()}),
            (
                "scores",
                [c.score for c in record.calls],
                [record.reward_of(c.agent_id) - c.penalty for c in record.calls],
            ),
            ("json round trip", EpisodeRecord.from_dict(json.loads(json.dumps(record.to_dict()))), record),
        ]
        for name, value, expected in checks:
            if value != expected:
                raise ConformanceError(f"{env_id}: episode record (seed {seed}) {name} is {value!r}, expected {expected!r}")
    env.close()


def check_env(
    env_id: str,
    *,
    num_cycles: int = 20,
    cross_process: bool = True,
    hash_seeds: tuple[int, ...] = (1, 2),
    **kwargs: Any,
) -> dict[str, float]:
    """Run every conformance check on ``env_id`` (built with ``kwargs``); see the module docstring.

    Returns:
        seconds per check, e.g. ``{"api_test": 0.05, ..., "cross_process": 3.1}``.

    Raises:
        AssertionError / ConformanceError: the first failed check.
    """
    from pettingzoo.test import api_test, parallel_api_test, render_test, seed_test
    from pettingzoo.utils.conversions import turn_based_aec_to_parallel

    timings: dict[str, float] = {}

    def timed(name: str, fn: Any) -> None:
        start = time.perf_counter()
        fn()
        timings[name] = time.perf_counter() - start

    timed("api_test", lambda: api_test(drmas_envs.make(env_id, **kwargs), num_cycles=num_cycles))
    timed("seed_test", lambda: seed_test(lambda: drmas_envs.make(env_id, **kwargs), num_cycles=num_cycles))
    timed(
        "render_test",
        lambda: render_test(
            lambda render_mode=None: drmas_envs.make(env_id, render_mode=render_mode, **kwargs),
            custom_tests={"ansi": lambda text: isinstance(text, str) and len(text) > 0},
        ),
    )
    timed(
        "parallel_api_test",
        lambda: parallel_api_test(
            turn_based_aec_to_parallel(drmas_envs.make(env_id, **kwargs)), num_cycles=num_cycles
        ),
    )
    first: dict[str, str] = {}

    def determinism() -> None:
        first["json"] = transcript_json(env_id, **kwargs)
        second = transcript_json(env_id, **kwargs)
        if first["json"] != second:
            raise ConformanceError(
                f"{env_id}: two envs with the same seeds and actions differ: {_first_difference(first['json'], second)}"
            )

    timed("determinism", determinism)
    if cross_process:
        timed(
            "cross_process",
            lambda: compare_transcripts(
                env_id, first["json"], cross_process_transcripts([env_id], hash_seeds, **kwargs)
            ),
        )
    return timings
