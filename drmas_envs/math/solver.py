r"""# Math Solver (``math-solver-v0``): one Solver turn, graded

| | |
|---|---|
| Create | ``drmas_envs.make("math-solver-v0", data=None)`` |
| Agents | ``["solver"]`` (role "Solver Agent") |
| Turn order | solver (one call) |
| Action | free text (any ``str``) |
| Observation | ``{"prompt": str, "messages": ({"role": "system", ...}, {"role": "user", "content": str})}`` |
| Default tasks | reasoning-gym ``gsm_symbolic``, 1,000 tasks from seed 0 (offline) |

The single-agent baseline of the Dr. MAS math experiments (arXiv 2602.08847): the Solver sees the problem (same
prompt as in ``math-solver-verifier-v0``, with an empty team context) and ends with ``\boxed{...}``.

## Rewards

| Event | Solver |
|---|---|
| boxed answer correct (``grader``, default ``"reference"``: the Dr. MAS reference's reward) | +1 |
| wrong / no box / timeout | 0 |
| the call is invalid (``"reference"``: no readable last ``\boxed{...}`` in the reply; ``"math_verify"``: no non-blank box) | -0.1 |

Grading (:mod:`drmas_envs.math.graders`): ``grader="reference"`` (default) grades the text after the first
``</think>``, reads only the last ``\boxed{...}`` (``\fbox`` and ``\boxed 2`` are no answer; an empty
``\boxed{}`` is a valid, wrong answer) and checks equivalence with the reference's normalise-then-sympy routine;
``grader="math_verify"`` grades the whole reply with math-verify (``\fbox`` and ``\boxed 2`` read).

## Termination vs truncation

The episode **terminates** after the one call; it is never truncated. Final infos: ``won``, ``score``,
``extracted``, ``grade_reason``, ``ground_truth``.

## Arguments

``data`` (task spec or TaskSource), ``format_penalty`` (0.1), ``prompts`` (keys ``env``, ``solver``),
``size`` / ``data_seed`` (reasoning-gym source), ``max_quote_chars`` (unused: no teammates), ``system_prompt``,
``grader`` (``"reference"`` | ``"math_verify"``), ``grade_timeout_s`` (1.0), ``render_mode``.

## Version history

* v0 (drmas 0.1.0): initial version.
"""

from __future__ import annotations

from drmas_envs.core import Turn
from drmas_envs.core.factories import make_factories
from drmas_envs.math import prompts as P
from drmas_envs.math.team import MathTeamEnv

__all__ = ["raw_env", "env", "parallel_env"]


class raw_env(MathTeamEnv):  # noqa: N801 - PettingZoo naming convention
    """The one-call Solver env (see the module docstring for the card)."""

    possible_agents = ["solver"]
    metadata = {**MathTeamEnv.metadata, "name": "math_solver_v0"}
    DEFAULT_PROMPTS = {"env": P.ENV_PROMPT, "solver": P.SOLVER_PROMPT}

    def _start_episode(self) -> str:
        self._solution = None
        return "solver"

    def _prompt(self, agent: str) -> tuple[str, str]:
        return self._role_prompt(agent)

    def _act(self, agent: str, text: str) -> Turn:
        valid, info = self._propose(text)
        return Turn(valid, None, info=info)


env, parallel_env = make_factories(raw_env)
