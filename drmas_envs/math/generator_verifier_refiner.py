r"""# Math Generator-Verifier-Refiner (``math-generator-verifier-refiner-v0``)

| | |
|---|---|
| Create | ``drmas_envs.make("math-generator-verifier-refiner-v0", data=None, max_loops=2)`` |
| Agents | ``["generator", "verifier", "refiner"]`` ("Generator Agent", "Verifier Agent", "Refiner Agent") |
| Turn order | generator, verifier, refiner, verifier, refiner, ..., refiner (at most ``2 * max_loops - 1`` calls) |
| Action | free text (any ``str``) |
| Observation | ``{"prompt": str, "messages": ({"role": "system", ...}, {"role": "user", "content": str})}`` |
| Default tasks | reasoning-gym ``gsm_symbolic``, 1,000 tasks from seed 0 (offline) |

A three-role variant of ``math-solver-verifier-v0`` with the same grading rules. Loop 1: the Generator proposes
a solution ending with ``\boxed{...}``. In every loop ``k < max_loops`` the Verifier reviews the most recent
solution and ends with ``<verify>approve</verify>`` (episode ends) or ``<verify>reject</verify>`` (the Refiner
writes a corrected solution, which opens loop ``k + 1``). The solution of the last loop is not verified. Verdicts
are read as in the solver-verifier env (``verdict_rule``; a missing verdict counts as ``missing_verdict``,
default ``"approve"``). Team context as in the
solver-verifier env (every earlier output in full, as the reference; ``max_quote_chars`` caps each).

## Rewards

Only the **last proposed solution** (generator's, or the latest refiner's) is graded, by ``grader`` (default
``"reference"``, the Dr. MAS reference's reward; ``"math_verify"``; see the solver-verifier env).

| Event | Generator | Verifier | Refiner |
|---|---|---|---|
| last solution correct | +1 | +1 | +1 |
| last solution wrong / no box / timeout | 0 | 0 | 0 |
| each invalid generator / refiner call (the ``grader``'s rule, as in the solver-verifier env) | -0.1 (own calls) | 0 | -0.1 (own calls) |
| each verifier call without a ``<verify>...</verify>`` pair | 0 | -0.1 | 0 |

## Termination vs truncation

Episodes always **terminate** (approve, or the refiner's answer in the last loop); never truncated. Final
infos: ``won``, ``score``, ``extracted``, ``grade_reason``, ``ground_truth``, ``loops``, ``verdicts``.

## Arguments

``data``, ``max_loops`` (>= 1, default 2; 1 = generator only), ``missing_verdict``, ``verdict_rule``, ``format_penalty`` (0.1),
``max_quote_chars`` (None: full outputs), ``system_prompt``, ``prompts`` (keys ``env``, ``generator``,
``verifier``, ``refiner``), ``size`` /
``data_seed``, ``grader`` (``"reference"`` | ``"math_verify"``), ``grade_timeout_s`` (1.0), ``render_mode``.

## Version history

* v0 (drmas 0.1.0): initial version.
"""

from __future__ import annotations

from drmas_envs.core.factories import make_factories
from drmas_envs.math import prompts as P
from drmas_envs.math.team import VerifiedTeamEnv

__all__ = ["raw_env", "env", "parallel_env"]


class raw_env(VerifiedTeamEnv):  # noqa: N801 - PettingZoo naming convention
    """The Generator-Verifier-Refiner env (see the module docstring for the card).

    Raises:
        ValueError: ``max_loops`` < 1 or a bad ``missing_verdict``, plus MathTeamEnv's errors.
    """

    possible_agents = ["generator", "verifier", "refiner"]
    metadata = {**VerifiedTeamEnv.metadata, "name": "math_generator_verifier_refiner_v0"}
    DEFAULT_PROMPTS = {
        "env": P.ENV_PROMPT,
        "generator": P.GENERATOR_PROMPT,
        "verifier": P.VERIFIER_PROMPT,
        "refiner": P.REFINER_PROMPT,
    }

    FIRST_PROPOSER = "generator"
    NEXT_PROPOSER = "refiner"


env, parallel_env = make_factories(raw_env)
