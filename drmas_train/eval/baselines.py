"""Scripted baseline policies: sanity rows for every leaderboard.

A scripted policy is a callable ``policy(env, agent, rng) -> str``: it sees the *unwrapped* drmas env (so
the ``oracle`` can read ``env.task``), the acting agent id and a per-episode ``random.Random``. Built-ins:

=============  ======================================================================================
``oracle``     answers with the ground truth in the env's own protocol. Math solver/generator/refiner:
               ``\\boxed{answer}``; math verifier: ``<verify>approve</verify>``. Search: never searches,
               the verifier says ``<verify>yes</verify>``, answer agents give the first gold answer in
               ``<answer>...</answer>`` after a one-line ``<think>`` block. Should score (close to) 100 %: less points at a grading or
               protocol bug.
``random``     random words and digits, no protocol tags: the floor (mostly invalid actions).
``no-search``  search envs only: follows the protocol but never retrieves (the verifier says yes at once,
               the answer agent answers a fixed guess): the floor of a protocol-following policy.
=============  ======================================================================================

Roles are read with ``env.role(agent)``; an agent role no baseline knows raises :class:`BaselineError` naming
the env, the role and the known roles.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

__all__ = ["BaselineError", "ScriptedPolicy", "BASELINES", "get_baseline", "oracle", "random_text", "no_search"]

#: ``policy(env, agent, rng) -> action text``.
ScriptedPolicy = Callable[[Any, str, random.Random], str]

#: Answer given by the ``no-search`` baseline (a protocol-valid guess that is never a gold answer in practice).
NO_SEARCH_GUESS = "unknown"

_WORDS = (
    "the answer is maybe not yes no search think step first then because so we get total each "
    "number value result check verify correct wrong box final"
).split()

_MATH_SOLVER_ROLES = ("solver", "generator", "refiner", "reasoner")
_MATH_VERIFIER_ROLES = ("verifier",)
_SEARCH_ANSWER_ROLES = ("answer", "answerer", "answer_agent", "agent", "searcher")
_SEARCH_VERIFIER_ROLES = ("verifier", "verify", "verifier_agent")
_SEARCH_QUERY_ROLES = ("search", "search_agent", "query", "querier")


class BaselineError(ValueError):
    """A baseline cannot act in this env (unknown role, or ``no-search`` on a non-search env)."""


def _env_name(env: Any) -> str:
    spec = getattr(env, "spec", None)
    if spec is not None and getattr(spec, "id", None):
        return str(spec.id)
    return str(getattr(env, "metadata", {}).get("name", type(env).__name__))


def _is_search(env: Any) -> bool:
    return "search" in _env_name(env).lower() or type(env).__module__.startswith("drmas_envs.search")


def _roles(env: Any, agent: str) -> set[str]:
    """The agent id and its normalised role name (``"Solver Agent"`` -> ``"solver"``)."""
    role = str(env.role(agent)).strip().lower().replace(" ", "_")
    return {agent.lower(), role, role.removesuffix("_agent")}


def _gold(env: Any) -> str:
    return env.task.answers[0]


def _unknown(env: Any, role: str, policy: str) -> BaselineError:
    known = _SEARCH_ANSWER_ROLES + _SEARCH_VERIFIER_ROLES + _SEARCH_QUERY_ROLES if _is_search(env) else (
        _MATH_SOLVER_ROLES + _MATH_VERIFIER_ROLES
    )
    return BaselineError(
        f"baseline {policy!r} does not know role {role!r} of env {_env_name(env)!r}; known roles: {sorted(set(known))}"
    )


def _search_action(env: Any, agent: str, answer: str, policy: str) -> str:
    roles = _roles(env, agent)
    if roles & set(_SEARCH_VERIFIER_ROLES):
        return "<verify>yes</verify>"
    # one <think> block: the Dr. MAS search agents must reason first (langfengQ/DrMAS agent_system/agent/utils.py:198-208)
    if roles & set(_SEARCH_ANSWER_ROLES):
        return f"<think>The answer is known.</think><answer>{answer}</answer>"
    if roles & set(_SEARCH_QUERY_ROLES):  # only asked when a verifier said no; the baselines never do
        return f"<think>Search the question.</think><search>{env.task.question}</search>"
    raise _unknown(env, env.role(agent), policy)


def oracle(env: Any, agent: str, rng: random.Random) -> str:
    """Ground truth in the env's protocol (see the module docstring). Raises BaselineError for unknown roles, and for
    games, which have no ground truth."""
    if type(env).__module__.startswith("drmas_envs.games"):
        raise BaselineError(
            f"baseline 'oracle' plays a task's ground truth, and game env {_env_name(env)!r} has none; use --policy "
            "random (the env then plays a random legal move for each invalid reply) or --policy llm"
        )
    if _is_search(env):
        return _search_action(env, agent, _gold(env), "oracle")
    roles = _roles(env, agent)
    if roles & set(_MATH_SOLVER_ROLES):
        return f"The final answer is \\boxed{{{_gold(env)}}}."
    if roles & set(_MATH_VERIFIER_ROLES):
        return "Every step checks out. <verify>approve</verify>"
    raise _unknown(env, env.role(agent), "oracle")


def random_text(env: Any, agent: str, rng: random.Random) -> str:
    """1-24 random words and digits, without protocol markup (works in every env)."""
    words = [rng.choice(_WORDS) if rng.random() < 0.8 else str(rng.randrange(1000)) for _ in range(rng.randint(1, 24))]
    return " ".join(words)


def no_search(env: Any, agent: str, rng: random.Random) -> str:
    """Protocol-valid, never retrieves, answers :data:`NO_SEARCH_GUESS`. Raises BaselineError outside search envs."""
    if not _is_search(env):
        raise BaselineError(f"baseline 'no-search' is for search envs only, not {_env_name(env)!r}")
    return _search_action(env, agent, NO_SEARCH_GUESS, "no-search")


#: name -> scripted policy.
BASELINES: dict[str, ScriptedPolicy] = {"oracle": oracle, "random": random_text, "no-search": no_search}


def get_baseline(name: str) -> ScriptedPolicy:
    """The scripted policy called ``name``.

    Raises:
        BaselineError: unknown name (lists the known ones).
    """
    if name not in BASELINES:
        raise BaselineError(f"unknown baseline {name!r}; known: {sorted(BASELINES)}")
    return BASELINES[name]
