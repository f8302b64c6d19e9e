r"""Every prompt of the math envs, in one place.

Structure (Dr. MAS, arXiv 2602.08847, Appendix C.1): each agent gets one user message made of the shared
*environment prompt* (the problem), the *team context* (teammates' earlier outputs, oldest first) and its *role
instruction*. Templates are ``str.format`` strings with these fields:

* ``ENV_PROMPT``: ``{question}``.
* role templates: ``{env_prompt}`` (the filled ``ENV_PROMPT``), ``{team_context}`` (see
  :func:`format_team_context`), ``{question}``.

Envs accept ``prompts={"env": ..., "<agent id>": ...}`` to override any of them; unknown keys or fields are a
``ValueError`` at construction (:func:`resolve_prompts`).

Team context is bounded: each quoted output keeps at most ``max_quote_chars`` characters (its head and tail,
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
    "ROLE_NAMES",
    "quote",
    "format_team_context",
    "resolve_prompts",
]

ENV_PROMPT = (
    "You are a member of an expert multi-agent team tasked with solving the math problem. "
    "The team's math problem is: {question}"
)

SOLVER_PROMPT = """# Task Introduction
{env_prompt}

# Your Teammates' Outputs
{team_context}

# Your Role
You are a "Solver Agent". Your job is to carefully reason through the math problem step by step and derive the \
correct answer. When reasoning, consider your teammates' outputs (if any) as auxiliary context. You should give the \
final answer within \\boxed{{}}."""

VERIFIER_PROMPT = """# Task Introduction
{env_prompt}

# Your Teammates' Outputs
{team_context}

# Your Role
You are a "Verifier Agent". Your responsibility is to critically review the most recent solution provided by the \
"{reviewed}". Check each reasoning step, formula, and conclusion for accuracy, completeness, and logical \
consistency. At the end of your output, you MUST provide your verdict within <verify> </verify> using exactly one of:
(1) <verify>approve</verify> if all steps and the final answer are correct.
(2) <verify>reject</verify> if you detect any issue."""

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

#: What ``{team_context}`` says before anyone has spoken.
NO_CONTEXT = "(none yet: you are the first to act)"

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


def format_team_context(outputs: Sequence[tuple[str, str]], max_quote_chars: int) -> str:
    """Render earlier ``(agent_id, text)`` outputs, oldest first, each quoted with :func:`quote`."""
    if not outputs:
        return NO_CONTEXT
    blocks = [
        f"[{ROLE_NAMES.get(agent, agent)}, turn {i}]\n{quote(text, max_quote_chars)}"
        for i, (agent, text) in enumerate(outputs, start=1)
    ]
    return "\n\n".join(blocks)


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
