"""The adapter stack that numeric RL libraries get: categorical choices plus token ids over a small vocabulary.

``numeric_aec_env(env_id)`` builds ``NumericInfos(TokenSpaces(DiscreteChoices(drmas_envs.make(env_id))))``
with sizes a stock MLP policy can hold (``docs/plugging-in.md``): the Verifier / router pick among protocol
texts (``Discrete(2)``), writers emit ``K`` tokens from :func:`boxed_answer_vocab` (the tokens of
``\\boxed{0123456789}`` and the stop token), i.e. ``MultiDiscrete([len(vocab)] * K)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from pettingzoo import AECEnv

import drmas_envs
from drmas_envs.wrappers import (
    ROUTER_CHOICES,
    VERIFIER_CHOICES,
    DiscreteChoices,
    NumericInfos,
    TokenSpaces,
    action_vocab_of,
)

__all__ = ["DEFAULT_CHOICES", "boxed_answer_vocab", "numeric_aec_env", "token_feature_space", "token_features"]

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
    return action_vocab_of(tokenizer, text, pad_id)


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


def token_feature_space(space: gymnasium.spaces.Space) -> gymnasium.spaces.Space:
    """Float feature space of one agent's token observation space (what a stock MLP policy takes).

    A ``Dict`` with ``input_ids`` and ``attention_mask`` (``O`` each) and other keys of flat size ``n``
    becomes ``Box(0, 1, (2*O + n,), float32)``; any other space is returned unchanged.

    Raises:
        ValueError: a token ``Dict`` whose extra keys are not all ``Box(0, 1)`` / ``Discrete`` /
            ``MultiBinary`` (``action_mask`` and other flags), which would not fit in ``[0, 1]``.
    """
    if not (isinstance(space, gymnasium.spaces.Dict) and {"input_ids", "attention_mask"} <= set(space.spaces)):
        return space
    extra = {k: s for k, s in space.spaces.items() if k not in ("input_ids", "attention_mask")}
    size = 2 * int(space["input_ids"].shape[0])
    for key, sub in extra.items():
        flat = gymnasium.spaces.flatten_space(sub)
        if not (isinstance(flat, gymnasium.spaces.Box) and np.all(flat.low >= 0) and np.all(flat.high <= 1)):
            raise ValueError(f"observation key {key!r} ({sub}) does not flatten into [0, 1]; drop or rescale it")
        size += int(flat.shape[0])
    return gymnasium.spaces.Box(0.0, 1.0, (size,), dtype=np.float32)


def token_features(observation: Mapping[str, Any], space: gymnasium.spaces.Dict) -> np.ndarray:
    """``(2*O + n,)`` float32 features of a token observation: ``input_ids / (V - 1)`` (0 on padding), the
    attention mask, then the other keys flattened (``gymnasium.spaces.flatten``, sorted key order).

    ``space`` is the agent's token ``Dict`` space (see :func:`token_feature_space`).
    """
    ids = np.asarray(observation["input_ids"], dtype=np.float64)
    mask = np.asarray(observation["attention_mask"], dtype=np.float32)
    high = float(space["input_ids"].high.max()) or 1.0
    parts = [(ids / high).astype(np.float32) * mask, mask]
    for key, sub in space.spaces.items():
        if key not in ("input_ids", "attention_mask"):
            parts.append(gymnasium.spaces.flatten(sub, observation[key]).astype(np.float32))
    return np.concatenate(parts)
