"""The adapter stack that numeric RL libraries get: categorical choices plus token ids over a small vocabulary.

``numeric_aec_env(env_id)`` builds ``NumericInfos(TokenSpaces(DiscreteChoices(drmas_envs.make(env_id))))``
with sizes a stock MLP policy can hold (``docs/plugging-in.md``): the Verifier / router pick among protocol
texts (``Discrete(2)``), writers emit ``K`` tokens from :func:`boxed_answer_vocab` (the tokens of
``\\boxed{0123456789}`` and the stop token), i.e. ``MultiDiscrete([len(vocab)] * K)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pettingzoo import AECEnv

import drmas_envs
from drmas_envs.wrappers import (
    ROUTER_CHOICES,
    VERIFIER_CHOICES,
    DiscreteChoices,
    NumericInfos,
    TokenSpaces,
    encode_ids,
)

__all__ = ["DEFAULT_CHOICES", "boxed_answer_vocab", "numeric_aec_env"]

#: Categorical agents of the built-in envs: env id -> {agent: protocol texts}.
DEFAULT_CHOICES: dict[str, dict[str, tuple[str, ...]]] = {
    "math-solver-verifier-v0": {"verifier": VERIFIER_CHOICES},
    "math-generator-verifier-refiner-v0": {"verifier": VERIFIER_CHOICES},
    "search-orchestrator-v0": {"verifier": ROUTER_CHOICES},
}


def boxed_answer_vocab(tokenizer: Any, pad_id: int, text: str = r"\boxed{0123456789}") -> list[int]:
    """Sorted distinct token ids of ``text`` plus ``pad_id``: an ``action_vocab`` for short math answers.

    With the Qwen3 tokenizer this is 14 ids (``\\``, ``boxed``, ``{``, ``}``, ten digits) plus the pad.
    """
    return sorted({*encode_ids(tokenizer, text), int(pad_id)})


def numeric_aec_env(
    env_id: str,
    tokenizer: Any,
    *,
    pad_id: int,
    max_obs_tokens: int = 64,
    max_act_tokens: int = 8,
    action_vocab: Sequence[int] | None = None,
    choices: Mapping[str, Sequence[str]] | None = None,
    numeric_infos: bool = True,
    **env_kwargs: Any,
) -> AECEnv:
    """``NumericInfos(TokenSpaces(DiscreteChoices(make(env_id, **env_kwargs), choices), tokenizer, ...)))``.

    Args:
        env_id: a drmas registry id.
        tokenizer: anything :class:`~drmas_envs.wrappers.TokenSpaces` accepts.
        pad_id: padding id, also the stop token of token actions.
        max_obs_tokens: ``O``, prompt tokens kept (the last ones).
        max_act_tokens: ``K``, tokens per writer action.
        action_vocab: token ids writers may use; default :func:`boxed_answer_vocab`.
        choices: categorical agents; default :data:`DEFAULT_CHOICES` of ``env_id`` (none for unknown ids).
        numeric_infos: add :class:`~drmas_envs.wrappers.NumericInfos` (fixed numeric info keys).

    Returns:
        the wrapped AEC env; writers' actions are ``MultiDiscrete([len(action_vocab)] * K)`` int64,
        observations ``Dict(input_ids (O,) int64, attention_mask (O,) int8[, action_mask])``.

    Raises:
        the registry's lookup errors and the wrappers' ``ValueError`` for bad sizes or vocabularies.
    """
    env: AECEnv = drmas_envs.make(env_id, **env_kwargs)
    choices = DEFAULT_CHOICES.get(env_id, {}) if choices is None else choices
    if choices:
        env = DiscreteChoices(env, dict(choices))
    vocab = list(action_vocab) if action_vocab is not None else boxed_answer_vocab(tokenizer, pad_id)
    env = TokenSpaces(env, tokenizer, max_obs_tokens, max_act_tokens, pad_id=pad_id, action_vocab=vocab)
    return NumericInfos(env) if numeric_infos else env
