r"""Every prompt of the math envs, in one place.

Structure (Dr. MAS, arXiv 2602.08847, Appendix C.1; ``langfengQ/DrMAS agent_system/agent/agents/math/``): each agent
gets the system message :data:`SYSTEM_PROMPT` and one user message made of the shared
*environment prompt* (the problem), the *team context* (teammates' earlier outputs, oldest first) and its *role
instruction*. Templates are ``str.format`` strings with these fields:

* ``ENV_PROMPT``: ``{question}``.
* role templates: ``{env_prompt}`` (the filled ``ENV_PROMPT``), ``{team_context}`` (see
  :func:`format_team_context`), ``{question}``.

Envs accept ``prompts={"env": ..., "<agent id>": ...}`` to override any of them; unknown keys or fields are a
``ValueError`` at construction (:func:`resolve_prompts`).

Team context holds every teammate output in full, as the reference's (:data:`TEAM_OUTPUT` blocks). An env's
``max_quote_chars`` option (off by default) cuts each quoted output to that many characters (its head and tail,
with ``[... N characters omitted ...]`` between them, so the final ``\boxed{}`` / verdict stays visible).
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence

__all__ = [
    "ENV_PROMPT",
    "SOLVER_PROMPT",
    "VERIFIER_PROMPT",
    "GENERATOR_PROMPT",
    "REFINER_PROMPT",
    "NO_CONTEXT",
    "SYSTEM_PROMPT",
    "TEAM_OUTPUT",
    "ROLE_NAMES",
    "quote",
    "format_team_context",
    "resolve_prompts",
]

#: The system message of every agent call: the reference's fallback when the data has no system turn (its math
#: data has none): ``langfengQ/DrMAS agent_system/multi_turn_rollout/utils.py:107``.
SYSTEM_PROMPT = "You are a helpful and harmless assistant."

# ENV_PROMPT, SOLVER_PROMPT and VERIFIER_PROMPT are the reference's text verbatim (Apache-2.0, langfengQ/DrMAS),
# leading and trailing newlines included; only the field names differ ({question}, and {reviewed} which is
# "Solver Agent" in math-solver-verifier-v0).

#: ``agent_system/environments/prompts/math.py:20-22`` (``MATH_MULTIAGENT_TEMPLATE``).
ENV_PROMPT = (
    "You are a member of an expert multi-agent team tasked with solving the math problem.\n"
    "The team's math problem is: {question}\n"
)

#: ``agent_system/agent/agents/math/solver_agent.py:26-37``.
SOLVER_PROMPT = (
    "\n# Task Introduction\n{env_prompt}\n\n# Your Teammates' Outputs\n{team_context}\n\n# Your Role\n"
    'You are a "Solver Agent". Your job is to carefully reason through the math problem step by step and derive the '
    "correct answer. When reasoning, consider your teammates' outputs (if any) as auxiliary context. \n"
    "\n"
    "You should give the final answer within \\boxed{{}}.\n"
)

#: ``agent_system/agent/agents/math/verifier_agent.py:26-38``.
VERIFIER_PROMPT = """
# Task Introduction
{env_prompt}

# Your Teammates' Outputs
{team_context}

# Your Role
You are a "Verifier Agent". Your responsibility is to critically review the most recent solution provided by the \
"{reviewed}". Check each reasoning step, formula, and conclusion for accuracy, completeness, and logical consistency.
At the end of your output, you MUST provide your verdict within <verify> </verify> using exactly one of:
(1) <verify>approve</verify> if all steps and the final answer are correct.
(2) <verify>reject</verify> if you detect any issue.
"""

GENERATOR_PROMPT = """# Task Introduction
{env_prompt}

# Your Teammates' Outputs
{team_context}

# Your Role
You are a "Generator Agent". Solve the math problem step by step and propose a complete solution. You should give \
the final answer within \\boxed{{}}."""

REFINER_PROMPT = """# Task Introduction
{env_prompt}

# Your Teammates' Outputs
{team_context}

# Your Role
You are a "Refiner Agent". The Verifier Agent rejected the most recent solution. Use its review to fix the errors \
and write a corrected, complete solution. You should give the final answer within \\boxed{{}}."""

#: What ``{team_context}`` holds before anyone has spoken: nothing, as in the reference
#: (``agent_system/agent/orchestra/base.py:147``).
NO_CONTEXT = ""

#: One teammate output in ``{team_context}``: ``langfengQ/DrMAS agent_system/agent/orchestra/math/math_orchestra.py:35``.
TEAM_OUTPUT = '\nThe output of "{role}": {text}\n'

#: Display names used in team context and prompts, by agent id.
ROLE_NAMES = {
    "solver": "Solver Agent",
    "verifier": "Verifier Agent",
    "generator": "Generator Agent",
    "refiner": "Refiner Agent",
}


def quote(text: str, max_chars: int) -> str:
    """``text`` if it has at most ``max_chars`` characters, else its head and tail around an omission marker.

    Raises:
        ValueError: ``max_chars`` < 1.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars!r}")
    if len(text) <= max_chars:
        return text
    head = max_chars // 4
    tail = max_chars - head
    return f"{text[:head]}\n[... {len(text) - max_chars} characters omitted ...]\n{text[-tail:]}"


def format_team_context(outputs: Sequence[tuple[str, str]], max_quote_chars: int | None = None) -> str:
    """Render earlier ``(agent_id, text)`` outputs, oldest first, as the reference's team context.

    Each output becomes ``\\nThe output of "<Role Name>": <text>\\n`` and they are concatenated
    (``math_orchestra.py:28-36``); no outputs give :data:`NO_CONTEXT` (``""``). Texts are quoted in full, as the
    reference does, unless ``max_quote_chars`` is given: then each is cut with :func:`quote` (a drmas option,
    off by default; the reference bounds the whole prompt instead, by middle truncation of its tokens).

    Raises:
        ValueError: ``max_quote_chars`` < 1.
    """
    if not outputs:
        return NO_CONTEXT
    return "".join(
        TEAM_OUTPUT.format(role=ROLE_NAMES.get(agent, agent),
                           text=text if max_quote_chars is None else quote(text, max_quote_chars))
        for agent, text in outputs
    )


def resolve_prompts(defaults: Mapping[str, str], overrides: Mapping[str, str] | None) -> dict[str, str]:
    """``defaults`` with ``overrides`` applied, each template checked to use only the allowed fields.

    Allowed fields: ``question`` in ``"env"``; ``env_prompt``, ``team_context``, ``question`` (and ``reviewed`` for
    a verifier) in the role templates.

    Raises:
        ValueError: an override for an unknown key, a non-str template, or an unknown ``{field}``.
    """
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise ValueError(f"unknown prompt key(s) {unknown}; this env's prompts are: {sorted(defaults)}")
    merged = {**defaults, **overrides}
    for key, template in merged.items():
        if not isinstance(template, str):
            raise ValueError(f"prompt {key!r} must be a str template, got {type(template).__name__}")
        allowed = {"question"} if key == "env" else {"env_prompt", "team_context", "question", "reviewed"}
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        bad = sorted(fields - allowed)
        if bad:
            raise ValueError(f"prompt {key!r} uses unknown field(s) {bad}; allowed: {sorted(allowed)}")
    return merged
