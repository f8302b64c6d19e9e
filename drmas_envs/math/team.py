r"""Shared machinery of the math team envs: tasks, grading, team context, verdict parsing, module factories.

The protocol of each env (who acts when) lives in its own module (``solver.py``, ``solver_verifier.py``,
``generator_verifier_refiner.py``); this module holds only what they share.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from drmas_envs.core import Outcome, TaskSource, TextAECEnv, Turn, tags
from drmas_envs.core.factories import complete_signature
from drmas_envs.core.projection import project_action
from drmas_envs.data import DEFAULT_MATH_SPEC, load_tasks
from drmas_envs.math import prompts as P
from drmas_envs.math.graders import DEFAULT_GRADER, make_grader

__all__ = ["MathTeamEnv", "VerifiedTeamEnv", "parse_verdict", "reference_verdict", "VERDICTS", "VERDICT_RULES"]

VERDICTS = ("approve", "reject")
#: How a verifier reply is read (see :class:`VerifiedTeamEnv`); the first is the default.
VERDICT_RULES = ("reference", "lenient")

#: ``parse_verdict(text) -> "approve" | "reject" | None``: the last ``<verify>`` pair holding a verdict (case,
#: whitespace and a trailing ``.``/``!`` ignored); :func:`drmas_envs.core.tags.parse_verdict` with the math words.
parse_verdict = functools.partial(tags.parse_verdict, verdicts=VERDICTS, last=True)


def reference_verdict(text: str) -> tuple[str | None, bool]:
    """(verdict, is_action_valid) of a math verifier reply as the Dr. MAS reference reads it.

    The reply is projected (the first ``<verify>`` content stripped in place; valid iff both tags are present and
    there is no CJK ideograph: ``langfengQ/DrMAS agent_system/agent/agents/math/verifier_agent.py:59-66``,
    ``agent_system/agent/utils.py:155-196``), then ``"approve"`` if it contains ``<verify>approve</verify>``
    (exact case, tested first), else ``"reject"`` if it contains ``<verify>reject</verify>``, else ``None``
    (``verifier_agent.py:76-82``).

    >>> reference_verdict("Fine. <verify> approve </verify>"), reference_verdict("<verify>maybe</verify>")
    (('approve', True), (None, True))
    """
    projection = project_action(text, "verify", keep_whole=True)
    for verdict in VERDICTS:
        if f"<verify>{verdict}</verify>" in projection.action:
            return verdict, projection.valid
    return None, projection.valid


class MathTeamEnv(TextAECEnv):
    """Base of the math envs: one problem, a team of text agents, the last solution graded by ``grader``.

    Subclasses set ``possible_agents``, ``DEFAULT_PROMPTS`` (agent id -> template, plus ``"env"``) and implement
    ``_start_episode`` / ``_act``; they record each proposed solution with :meth:`_propose`.

    Args:
        data: a task spec for :func:`drmas_envs.data.load_tasks` (path, ``"reasoning_gym:<name>"``, ``"hf:<id>"``)
            or a TaskSource; default ``"reasoning_gym:gsm_symbolic"`` (``size`` tasks from ``data_seed``).
        size, data_seed: size and seed of a reasoning-gym source (ignored for files).
        format_penalty: reward subtracted per invalid call (Dr. MAS default 0.1).
        max_quote_chars: ``None`` (default, the reference): teammate outputs are quoted in full; an int >= 1 cuts
            each quoted output to that many characters (head and tail kept, :func:`drmas_envs.math.prompts.quote`).
        prompts: template overrides by key (see :mod:`drmas_envs.math.prompts`).
        system_prompt: the system message of every call (default the reference's
            ``"You are a helpful and harmless assistant."``); ``None`` or ``""`` sends the user message alone.
        grader: ``"reference"`` (default): the Dr. MAS reference's math reward and solver validity rule
            (text after the first ``</think>``, last ``\boxed{...}`` only, normalise-then-sympy; a reply is
            valid iff it has a readable last ``\boxed{...}``, even empty;
            :mod:`drmas_envs.math.reference_grading`); ``"math_verify"``: last ``\boxed{}`` / ``\fbox{}`` of the
            whole reply (``\boxed 5`` too), math-verify; valid iff that box is non-blank
            (:mod:`drmas_envs.math.grading`). See :mod:`drmas_envs.math.graders`.
        grade_timeout_s: hard wall-clock limit of one equivalence check in the grading worker (seconds).
        render_mode: ``None``, ``"ansi"`` or ``"human"``.

    Raises:
        ValueError: bad prompts, ``max_quote_chars`` not None and < 1, a non-str ``system_prompt``, an unknown
            ``grader``, or any error of the base / task loading.
    """

    # the reference's math env is done after one step: its orchestra plays every Solver/Verifier loop inside that
    # step, so every call has env_step 1 (agent_system/environments/env_package/math/envs.py:22-23,
    # agent_system/agent/agents/math/solver_agent.py:59, agent_system/multi_turn_rollout/rollout_loop.py:452)
    metadata: dict[str, Any] = {**TextAECEnv.metadata, "name": "drmas_math_team", "reference_env_step": "episode"}

    DEFAULT_PROMPTS: Mapping[str, str] = {}

    def __init__(
        self,
        data: str | TaskSource | None = None,
        *,
        size: int = 1000,
        data_seed: int = 0,
        format_penalty: float = 0.1,
        max_quote_chars: int | None = None,
        prompts: Mapping[str, str] | None = None,
        system_prompt: str | None = P.SYSTEM_PROMPT,
        grader: str = DEFAULT_GRADER,
        grade_timeout_s: float = 1.0,
        render_mode: str | None = None,
    ) -> None:
        if max_quote_chars is not None and (
            isinstance(max_quote_chars, bool) or not isinstance(max_quote_chars, int) or max_quote_chars < 1
        ):
            raise ValueError(f"max_quote_chars must be an int >= 1, got {max_quote_chars!r} (or None: no cap)")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a str or None, got {type(system_prompt).__name__}")
        self.prompts = P.resolve_prompts(self.DEFAULT_PROMPTS, prompts)
        self.max_quote_chars = max_quote_chars
        self.system_prompt = system_prompt or ""
        self.grader = make_grader(grader, timeout_s=grade_timeout_s)
        self.grader.prestart()  # the grading worker imports sympy while the first episode is played
        tasks = load_tasks(DEFAULT_MATH_SPEC if data is None else data, seed=data_seed, size=size)
        super().__init__(tasks, format_penalty=format_penalty, render_mode=render_mode)
        self._solution: str | None = None

    # ---- helpers for subclasses ----
    def _team_context(self) -> str:
        # a verifier's reply enters the context with its verdict stripped in place, as the reference projects it
        # (langfengQ/DrMAS agent_system/agent/agents/math/verifier_agent.py:59-65, agent/utils.py:179-180)
        outputs = [
            (r.agent, project_action(r.text, "verify", keep_whole=True).action if r.agent == "verifier" else r.text)
            for r in self.history
        ]
        return P.format_team_context(outputs, self.max_quote_chars)

    def _role_prompt(self, agent: str, **fields: str) -> tuple[str, str]:
        question = self.task.question
        env_prompt = self.prompts["env"].format(question=question)
        user = self.prompts[agent].format(
            env_prompt=env_prompt, team_context=self._team_context(), question=question, **fields
        )
        return self.system_prompt, user

    def _propose(self, text: str) -> tuple[bool, dict[str, Any]]:
        """Record ``text`` as the team's current solution; valid by the grader's rule (``grader.is_valid``)."""
        self._solution = text
        return self.grader.is_valid(text), {"extracted": self.grader.extract(text)}

    def role(self, agent: str) -> str:
        """Display role name (``"Solver Agent"``) of an agent id."""
        return P.ROLE_NAMES.get(agent, agent)

    def _episode_outcome(self) -> Outcome:
        """Grade the last proposed solution with ``self.grader``: reward 1.0 if correct else 0.0."""
        result = self.grader.grade(self._solution or "", self.task.answers)
        return Outcome(
            result.score,
            result.correct,
            {
                "extracted": result.extracted,
                "grade_reason": result.reason,
                "ground_truth": self.task.answers[0],
            },
        )


class VerifiedTeamEnv(MathTeamEnv):
    """A propose → verify loop: a proposer writes a solution; unless it is the last loop, the ``"verifier"``
    approves (the episode ends) or rejects (the next proposer tries again); at most ``max_loops`` proposals.

    Subclasses set ``possible_agents``, ``DEFAULT_PROMPTS``, ``FIRST_PROPOSER`` (who proposes in loop 1) and
    ``NEXT_PROPOSER`` (who proposes after a rejection).

    Args:
        max_loops: most proposals per episode (>= 1); the last one is graded without review.
        missing_verdict: what a verifier reply without an approve/reject verdict counts as (reference: approve).
        verdict_rule: ``"reference"`` (default): :func:`reference_verdict`, the reply is valid when it has the
            ``<verify>`` tags, whatever their content; ``"lenient"`` (drmas v0): :func:`parse_verdict` (the last
            verdict, any case and inner spacing), valid only when a verdict is found.
        team: the other arguments, as :class:`MathTeamEnv` (the class signature lists them all).

    Raises:
        ValueError: ``max_loops`` < 1, ``missing_verdict`` not in ``("approve", "reject")``, an unknown
            ``verdict_rule``, plus
            :class:`MathTeamEnv`'s errors.
    """

    FIRST_PROPOSER: str = "solver"
    NEXT_PROPOSER: str = "solver"

    def __init__(
        self,
        data: str | TaskSource | None = None,
        *,
        max_loops: int = 2,
        missing_verdict: str = "approve",
        verdict_rule: str = "reference",
        **team: Any,
    ) -> None:
        if isinstance(max_loops, bool) or not isinstance(max_loops, int) or max_loops < 1:
            raise ValueError(f"max_loops must be an int >= 1, got {max_loops!r}")
        if missing_verdict not in VERDICTS:
            raise ValueError(f"missing_verdict must be one of {VERDICTS}, got {missing_verdict!r}")
        if verdict_rule not in VERDICT_RULES:
            raise ValueError(f"verdict_rule must be one of {VERDICT_RULES}, got {verdict_rule!r}")
        self.verdict_rule = verdict_rule
        self.max_loops = max_loops
        self.missing_verdict = missing_verdict
        super().__init__(data, **team)

    def _start_episode(self) -> str:
        self.loop = 1
        self.verdicts: list[str] = []
        self._solution = None
        return self.FIRST_PROPOSER

    def _proposer(self) -> str:
        return self.FIRST_PROPOSER if self.loop == 1 else self.NEXT_PROPOSER

    def _prompt(self, agent: str) -> tuple[str, str]:
        return self._role_prompt(agent, reviewed=P.ROLE_NAMES[self._proposer()])

    def _act(self, agent: str, text: str) -> Turn:
        if agent != "verifier":
            valid, info = self._propose(text)
            info["loop"] = self.loop
            return Turn(valid, None if self.loop == self.max_loops else "verifier", info=info)
        if self.verdict_rule == "reference":
            verdict, valid = reference_verdict(text)
        else:
            verdict = parse_verdict(text)
            valid = verdict is not None
        decided = verdict or self.missing_verdict
        self.verdicts.append(decided)
        info = {"verdict": decided, "verdict_found": verdict is not None, "loop": self.loop}
        if decided == "approve":
            return Turn(valid, None, info=info)
        self.loop += 1
        return Turn(valid, self.NEXT_PROPOSER, info=info)

    def _episode_outcome(self) -> Outcome:
        outcome = super()._episode_outcome()
        outcome.info.update(loops=self.loop, verdicts=list(self.verdicts))
        return outcome


complete_signature(VerifiedTeamEnv, MathTeamEnv)
