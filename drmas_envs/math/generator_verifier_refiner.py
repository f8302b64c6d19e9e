r"""# Math Generator-Verifier-Refiner (``math-generator-verifier-refiner-v0``)

| | |
|---|---|
| Create | ``drmas_envs.make("math-generator-verifier-refiner-v0", data=None, max_loops=2)`` |
| Agents | ``["generator", "verifier", "refiner"]`` ("Generator Agent", "Verifier Agent", "Refiner Agent") |
| Turn order | generator, verifier, refiner, verifier, refiner, ..., refiner (at most ``2 * max_loops - 1`` calls) |
| Action | free text (any ``str``) |
| Observation | ``{"prompt": str, "messages": ({"role": "user", "content": str},)}`` |
| Default tasks | reasoning-gym ``gsm_symbolic``, 1,000 tasks from seed 0 (offline) |

A three-role variant of ``math-solver-verifier-v0`` with the same grading rules. Loop 1: the Generator proposes
a solution ending with ``\boxed{...}``. In every loop ``k < max_loops`` the Verifier reviews the most recent
solution and ends with ``<verify>approve</verify>`` (episode ends) or ``<verify>reject</verify>`` (the Refiner
writes a corrected solution, which opens loop ``k + 1``). The solution of the last loop is not verified. A missing
verdict counts as ``missing_verdict`` (default ``"approve"``) and is invalid. Team context as in the
solver-verifier env (every earlier output, each quoted up to ``max_quote_chars`` characters).

## Rewards

Only the **last proposed solution** (generator's, or the latest refiner's) is graded.

| Event | Generator | Verifier | Refiner |
|---|---|---|---|
| last solution correct | +1 | +1 | +1 |
| last solution wrong / no box / timeout | 0 | 0 | 0 |
| each generator / refiner call without a non-blank ``\boxed{}`` | -0.1 (own calls) | 0 | -0.1 (own calls) |
| each verifier call without a verdict tag | 0 | -0.1 | 0 |

## Termination vs truncation

Episodes always **terminate** (approve, or the refiner's answer in the last loop); never truncated. Final
infos: ``won``, ``score``, ``extracted``, ``grade_reason``, ``ground_truth``, ``loops``, ``verdicts``.

## Arguments

``data``, ``max_loops`` (>= 1, default 2; 1 = generator only), ``missing_verdict``, ``format_penalty`` (0.1),
``max_quote_chars`` (4000), ``prompts`` (keys ``env``, ``generator``, ``verifier``, ``refiner``), ``size`` /
``data_seed``, ``grade_timeout_s`` (1.0), ``render_mode``.

## Version history

* v0 (drmas 0.1.0): initial version.
"""

from __future__ import annotations

from collections.abc import Mapping

from drmas_envs.core import TaskSource, Turn
from drmas_envs.core.factories import make_factories
from drmas_envs.math import prompts as P
from drmas_envs.math.team import VERDICTS, MathTeamEnv, parse_verdict

__all__ = ["raw_env", "env", "parallel_env"]


class raw_env(MathTeamEnv):  # noqa: N801 - PettingZoo naming convention
    """The Generator-Verifier-Refiner env (see the module docstring for the card).

    Raises:
        ValueError: ``max_loops`` < 1 or a bad ``missing_verdict``, plus MathTeamEnv's errors.
    """

    possible_agents = ["generator", "verifier", "refiner"]
    metadata = {**MathTeamEnv.metadata, "name": "math_generator_verifier_refiner_v0"}
    DEFAULT_PROMPTS = {
        "env": P.ENV_PROMPT,
        "generator": P.GENERATOR_PROMPT,
        "verifier": P.VERIFIER_PROMPT,
        "refiner": P.REFINER_PROMPT,
    }

    def __init__(
        self,
        data: str | TaskSource | None = None,
        *,
        max_loops: int = 2,
        missing_verdict: str = "approve",
        size: int = 1000,
        data_seed: int = 0,
        format_penalty: float = 0.1,
        max_quote_chars: int = 4000,
        prompts: Mapping[str, str] | None = None,
        grade_timeout_s: float = 1.0,
        render_mode: str | None = None,
    ) -> None:
        if isinstance(max_loops, bool) or not isinstance(max_loops, int) or max_loops < 1:
            raise ValueError(f"max_loops must be an int >= 1, got {max_loops!r}")
        if missing_verdict not in VERDICTS:
            raise ValueError(f"missing_verdict must be one of {VERDICTS}, got {missing_verdict!r}")
        self.max_loops = max_loops
        self.missing_verdict = missing_verdict
        super().__init__(
            data,
            size=size,
            data_seed=data_seed,
            format_penalty=format_penalty,
            max_quote_chars=max_quote_chars,
            prompts=prompts,
            grade_timeout_s=grade_timeout_s,
            render_mode=render_mode,
        )

    def _start_episode(self) -> str:
        self.loop = 1
        self.verdicts: list[str] = []
        self._solution = None
        return "generator"

    def _prompt(self, agent: str) -> tuple[str, str]:
        reviewed = P.ROLE_NAMES["generator" if self.loop == 1 else "refiner"]
        return self._role_prompt(agent, reviewed=reviewed)

    def _act(self, agent: str, text: str) -> Turn:
        if agent in ("generator", "refiner"):
            valid, info = self._propose(text)
            info["loop"] = self.loop
            return Turn(valid, None if self.loop == self.max_loops else "verifier", info=info)
        verdict = parse_verdict(text)
        decided = verdict or self.missing_verdict
        self.verdicts.append(decided)
        info = {"verdict": decided, "verdict_found": verdict is not None, "loop": self.loop}
        if decided == "approve":
            return Turn(verdict is not None, None, info=info)
        self.loop += 1
        return Turn(verdict is not None, "refiner", info=info)

    def _episode_outcome(self):
        outcome = super()._episode_outcome()
        outcome.info.update(loops=self.loop, verdicts=list(self.verdicts))
        return outcome


env, parallel_env = make_factories(raw_env)
