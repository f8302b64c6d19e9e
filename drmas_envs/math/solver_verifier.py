r"""# Math Solver-Verifier (``math-solver-verifier-v0``): the Dr. MAS math protocol

| | |
|---|---|
| Create | ``drmas_envs.make("math-solver-verifier-v0", data=None, max_loops=2)`` |
| Agents | ``["solver", "verifier"]`` (roles "Solver Agent", "Verifier Agent") |
| Turn order | solver, verifier, solver, verifier, ..., solver (at most ``2 * max_loops - 1`` calls) |
| Action | free text (any ``str``) |
| Observation | ``{"prompt": str, "messages": ({"role": "system", ...}, {"role": "user", "content": str})}`` |
| Default tasks | reasoning-gym ``gsm_symbolic``, 1,000 tasks from seed 0 (offline) |

Protocol (Dr. MAS, arXiv 2602.08847, Sec. 5 / Appendix C.1). For loop ``k = 1 .. max_loops``: the Solver
answers, ending with ``\boxed{...}``; unless ``k == max_loops``, the Verifier reviews the most recent solution and
ends with ``<verify>approve</verify>`` or ``<verify>reject</verify>``. *Approve* ends the episode; *reject* sends
the Solver around again. Verdicts are read as the reference does (``verdict_rule="reference"``,
:func:`~drmas_envs.math.team.reference_verdict`): exact ``<verify>approve</verify>`` first, then
``<verify>reject</verify>``; a reply with neither counts as ``missing_verdict`` (default ``"approve"``), and a
reply is invalid when it lacks the ``<verify>``/``</verify>`` tags (``verdict_rule="lenient"``: the last verdict in
any case, invalid when none is found). Each agent sees the problem plus the team context: every earlier output
of the episode, oldest first, in full as ``\nThe output of "Solver Agent": ...\n`` blocks (the reference's
``math_orchestra.py:28-36``; a verifier's reply with its verdict stripped in place). ``max_quote_chars`` (an int)
cuts each quoted output (head and tail kept); the reference bounds the whole prompt instead (middle truncation of
its tokens, on the trainer side). System message: ``system_prompt`` (the reference's "You are a helpful and
harmless assistant.").

## Rewards

Only the **last Solver answer** is graded, by ``grader`` (:mod:`drmas_envs.math.graders`): ``"reference"``
(default), the reference's reward (the text after the first ``</think>``, the last ``\boxed{...}`` only,
normalise-then-sympy equivalence; ``math_reward.py``), or ``"math_verify"`` (the whole reply, last
``\boxed{}``/``\fbox{}``, math-verify). At the end every agent gets the episode reward ``R``; each invalid call
costs its agent ``format_penalty`` at that step.

| Event | Solver | Verifier |
|---|---|---|
| last solver answer correct | +1 | +1 |
| last solver answer wrong / no box / timeout | 0 | 0 |
| each invalid solver call (``"reference"``: no readable last ``\boxed{...}``, an empty one counts; ``"math_verify"``: no non-blank box) | -0.1 | 0 |
| each verifier call without a ``<verify>...</verify>`` pair (or with CJK text) | 0 | -0.1 |

So an agent's return is ``R - 0.1 * (its invalid calls)``; ``infos[agent]["penalty"]`` is the penalty of that call.

## Termination vs truncation

Episodes always **terminate** (approve, or the solver's answer in the last loop); they are never truncated:
``max_loops`` bounds the length by construction. Final infos: ``won``, ``score``, ``extracted``,
``grade_reason``, ``ground_truth``, ``loops``, ``verdicts``.

## Arguments

``data`` (task spec or TaskSource), ``max_loops`` (>= 1, default 2), ``missing_verdict`` (``"approve"`` |
``"reject"``), ``verdict_rule`` (``"reference"`` | ``"lenient"``), ``format_penalty`` (0.1), ``max_quote_chars``
(None: full outputs), ``system_prompt``, ``prompts`` (overrides of keys ``env``, ``solver``, ``verifier``), ``size`` / ``data_seed`` (reasoning-gym source), ``grader`` (``"reference"`` | ``"math_verify"``),
``grade_timeout_s`` (1.0),
``render_mode``. Per-step infos: solver ``extracted``, ``loop``; verifier ``verdict``, ``verdict_found``, ``loop``.

## Version history

* v0 (drmas 0.1.0): initial version.
"""

from __future__ import annotations

from drmas_envs.core.factories import make_factories
from drmas_envs.math import prompts as P
from drmas_envs.math.team import VerifiedTeamEnv

__all__ = ["raw_env", "env", "parallel_env"]


class raw_env(VerifiedTeamEnv):  # noqa: N801 - PettingZoo naming convention
    """The Solver-Verifier env (see the module docstring for the card).

    Raises:
        ValueError: ``max_loops`` < 1 or ``missing_verdict`` not in ``("approve", "reject")``, plus
            :class:`~drmas_envs.math.team.MathTeamEnv`'s errors.
    """

    possible_agents = ["solver", "verifier"]
    metadata = {**VerifiedTeamEnv.metadata, "name": "math_solver_verifier_v0"}
    DEFAULT_PROMPTS = {"env": P.ENV_PROMPT, "solver": P.SOLVER_PROMPT, "verifier": P.VERIFIER_PROMPT}

    FIRST_PROPOSER = "solver"
    NEXT_PROPOSER = "solver"


env, parallel_env = make_factories(raw_env)
