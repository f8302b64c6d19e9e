"""Token-id observation and action spaces over a drmas text env, for numeric MARL libraries.

Numeric libraries (TorchRL, Tianshou, SuperSuit, AgileRL, BenchMARL) need array spaces, and several
need the *same* spaces for every agent. :class:`TokenSpaces` tokenizes each agent's prompt into a
fixed-length id array plus an attention mask, and decodes a fixed-length id array back into the text
action the env expects. Spaces (``B`` = 1 agent, ``O`` = ``max_obs_tokens``, ``K`` = ``max_act_tokens``,
``V`` = vocabulary size):

=====================  ============================================  =========  =========================
key                    space                                          dtype      meaning
=====================  ============================================  =========  =========================
``input_ids``          ``Box(0, V-1, (O,))``                          int64      prompt tokens, right-padded
``attention_mask``     ``Box(0, 1, (O,))``                            int8       1 = real token, 0 = padding
action                 ``MultiDiscrete([V] * K)``                     int64      completion tokens
=====================  ============================================  =========  =========================

Encoding the observation: ``tokenizer.encode(obs["prompt"])`` (or ``obs_text(obs)``); prompts longer than
``O`` keep their *last* ``O`` tokens (``truncation_side="left"``, the recent context) or their first
(``"right"``). Decoding an action: ids up to (not including) the first ``pad_id`` are decoded with
``tokenizer.decode``; so ``pad_id`` doubles as the stop token and a random policy emits ``K`` tokens.

Action sizes a stock policy can hold: a categorical head over ``MultiDiscrete([V] * K)`` has ``V * K`` logits
(a Qwen3 vocabulary, ``V = 151,669``, times ``K = 256`` is 38.8 M logits per step, more than a stock MLP
policy of RLlib, Tianshou or SB3 can hold). Give ``action_vocab`` (the token ids the agent may write, e.g.
the ids of ``\\boxed{0123456789}`` plus ``pad_id``) and keep ``K`` small: action value ``i`` is then token
``action_vocab[i]``, so the space is ``MultiDiscrete([len(action_vocab)] * K)``; 16 ids x 16 tokens is 256
logits. Choice-like agents should use :class:`~drmas_envs.wrappers.DiscreteChoices` instead.

Any other array-valued key of the wrapped observation (e.g. ``action_mask`` from
:class:`~drmas_envs.wrappers.DiscreteChoices`) is passed through unchanged, and agents whose wrapped
action space is not text (e.g. a ``Discrete`` choice) keep it. Agents with the same wrapped spaces share
one space object, so a plain drmas env gets identical spaces for every agent.

The tokenizer is any object with ``encode(str)`` and ``decode(list[int])``: a ``tokenizers.Tokenizer``
(``encode`` returns an ``Encoding`` with ``.ids``) or a Hugging Face tokenizer (returns a list).
No torch is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils.wrappers import BaseWrapper

__all__ = ["TextTokenizer", "TokenSpaces", "action_vocab_of", "encode_ids", "vocab_size_of"]

_ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiBinary, spaces.MultiDiscrete)


class TextTokenizer(Protocol):
    """What :class:`TokenSpaces` needs of a tokenizer."""

    def encode(self, text: str) -> Any: ...  # noqa: D102 - list[int] or an object with ``.ids``

    def decode(self, ids: list[int]) -> str: ...  # noqa: D102


def encode_ids(tokenizer: TextTokenizer, text: str) -> list[int]:
    """Token ids of ``text``: ``tokenizer.encode(text)`` as a list, unwrapping a ``tokenizers`` ``Encoding``.

    Raises:
        TypeError: the tokenizer returned neither a sequence of ints nor an object with ``.ids``.
    """
    encoded = tokenizer.encode(text)
    ids = getattr(encoded, "ids", encoded)
    if not isinstance(ids, Sequence) or not all(isinstance(i, (int, np.integer)) for i in ids):
        raise TypeError(
            f"tokenizer.encode must return a list of ints or an object with .ids, got {type(encoded).__name__}"
        )
    return [int(i) for i in ids]


def action_vocab_of(tokenizer: TextTokenizer, text: str, pad_id: int) -> list[int]:
    """Sorted distinct token ids of ``text`` plus ``pad_id``: an ``action_vocab`` for :class:`TokenSpaces`.

    E.g. ``action_vocab_of(qwen, r"\\boxed{0123456789}", pad)`` is 15 ids (the Qwen3 tokens of ``\\``,
    ``boxed``, ``{``, ``}``, ten digits, and the pad), enough to write any boxed integer.
    """
    return sorted({*encode_ids(tokenizer, text), int(pad_id)})


def vocab_size_of(tokenizer: Any) -> int:
    """Number of token ids of ``tokenizer`` (added tokens included).

    Tries ``get_vocab_size(with_added_tokens=True)`` (``tokenizers.Tokenizer``), then ``len(tokenizer)``
    (Hugging Face tokenizers), then ``vocab_size``.

    Raises:
        ValueError: none of these is available; pass ``vocab_size=`` to :class:`TokenSpaces`.
    """
    if hasattr(tokenizer, "get_vocab_size"):
        return int(tokenizer.get_vocab_size(with_added_tokens=True))
    try:
        return int(len(tokenizer))
    except TypeError:
        pass
    if isinstance(getattr(tokenizer, "vocab_size", None), int):
        return int(tokenizer.vocab_size)
    raise ValueError(
        f"cannot tell the vocabulary size of {type(tokenizer).__name__}: it has no get_vocab_size(), len() or "
        "vocab_size; pass vocab_size=... to TokenSpaces"
    )


def _default_pad_id(tokenizer: Any) -> int | None:
    pad = getattr(tokenizer, "pad_token_id", None)  # Hugging Face tokenizers
    if isinstance(pad, int):
        return pad
    padding = getattr(tokenizer, "padding", None)  # tokenizers.Tokenizer with enable_padding()
    if isinstance(padding, dict) and isinstance(padding.get("pad_id"), int):
        return int(padding["pad_id"])
    return None


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


class TokenSpaces(BaseWrapper):
    """AEC wrapper: token-id observations (``Dict`` with attention mask) and token-id actions.

    Args:
        env: a drmas env (possibly wrapped, e.g. by DiscreteChoices); its observations must be dicts with
            a ``"prompt"`` string unless ``obs_text`` is given.
        tokenizer: any object with ``encode``/``decode`` (see the module docstring).
        max_obs_tokens: ``O``, length of ``input_ids`` and ``attention_mask``.
        max_act_tokens: ``K``, length of a token action.
        pad_id: padding id, also the stop token of actions; defaults to the tokenizer's pad id.
        vocab_size: ``V``; defaults to :func:`vocab_size_of`.
        truncation_side: ``"left"`` keeps the last ``O`` prompt tokens, ``"right"`` the first ``O``.
        obs_text: maps a wrapped observation to the text to tokenize (default ``obs["prompt"]``).
        action_vocab: token ids a token action may use (distinct, in ``[0, V)``, including ``pad_id``);
            action value ``i`` is token ``action_vocab[i]``. ``None`` (default): the whole vocabulary.

    Raises:
        ValueError: a non-positive length, an unknown ``truncation_side``, no pad id, a ``pad_id``
            outside ``[0, V)``, or an ``action_vocab`` that is empty, repeats an id, has an id outside
            ``[0, V)`` or lacks ``pad_id``.
    """

    def __init__(
        self,
        env: AECEnv,
        tokenizer: TextTokenizer,
        max_obs_tokens: int,
        max_act_tokens: int,
        *,
        pad_id: int | None = None,
        vocab_size: int | None = None,
        truncation_side: str = "left",
        obs_text: Callable[[Any], str] | None = None,
        action_vocab: Sequence[int] | None = None,
    ) -> None:
        super().__init__(env)
        self.tokenizer = tokenizer
        self.max_obs_tokens = _positive_int("max_obs_tokens", max_obs_tokens)
        self.max_act_tokens = _positive_int("max_act_tokens", max_act_tokens)
        self.vocab_size = (
            _positive_int("vocab_size", vocab_size) if vocab_size is not None else vocab_size_of(tokenizer)
        )
        if truncation_side not in ("left", "right"):
            raise ValueError(f"truncation_side must be 'left' or 'right', got {truncation_side!r}")
        self.truncation_side = truncation_side
        pad_id = _default_pad_id(tokenizer) if pad_id is None else pad_id
        if pad_id is None:
            raise ValueError(
                f"{type(tokenizer).__name__} has no pad token id; pass pad_id=... (e.g. the id of '<|endoftext|>' "
                "or of the EOS token): it pads observations and ends token actions"
            )
        if (
            isinstance(pad_id, bool)
            or not isinstance(pad_id, (int, np.integer))
            or not 0 <= pad_id < self.vocab_size
        ):
            raise ValueError(f"pad_id must be an int in [0, {self.vocab_size}), got {pad_id!r}")
        self.pad_id = int(pad_id)
        self.obs_text = obs_text if obs_text is not None else _prompt_of
        self.action_vocab: np.ndarray | None = (
            None if action_vocab is None else _check_action_vocab(action_vocab, self.vocab_size, self.pad_id)
        )
        action_n = self.vocab_size if self.action_vocab is None else len(self.action_vocab)

        token_obs = {
            "input_ids": spaces.Box(0, self.vocab_size - 1, (self.max_obs_tokens,), dtype=np.int64),
            "attention_mask": spaces.Box(0, 1, (self.max_obs_tokens,), dtype=np.int8),
        }
        self._token_action_space = spaces.MultiDiscrete(
            np.full(self.max_act_tokens, action_n), dtype=np.int64
        )
        self._passthrough: dict[str, tuple[str, ...]] = {}
        self._observation_spaces: dict[str, spaces.Dict] = {}
        self._action_spaces: dict[str, spaces.Space] = {}
        shared_obs: dict[tuple[str, ...], spaces.Dict] = {}
        for agent in env.possible_agents:
            inner_obs = env.observation_space(agent)
            extra = (
                tuple(k for k, s in inner_obs.spaces.items() if isinstance(s, _ARRAY_SPACES))
                if isinstance(inner_obs, spaces.Dict)
                else ()
            )
            self._passthrough[agent] = extra
            # Agents with the same pass-through keys share one space object (identical spaces).
            if extra not in shared_obs:
                shared_obs[extra] = spaces.Dict({**token_obs, **{k: inner_obs.spaces[k] for k in extra}})
            self._observation_spaces[agent] = shared_obs[extra]
            inner_act = env.action_space(agent)
            self._action_spaces[agent] = (
                self._token_action_space if isinstance(inner_act, spaces.Text) else inner_act
            )

    # ---- spaces ----
    def observation_space(self, agent: str) -> spaces.Dict:
        """``Dict(input_ids, attention_mask[, pass-through keys])``; the same object for every call."""
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        """``MultiDiscrete([V] * K)`` for text agents (one shared object), else the wrapped space."""
        return self._action_spaces[agent]

    # ---- encoding / decoding ----
    def encode_observation(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids (O,) int64, attention_mask (O,) int8)`` of ``text``, truncated and right-padded."""
        ids = encode_ids(self.tokenizer, text)
        if len(ids) > self.max_obs_tokens:
            ids = (
                ids[-self.max_obs_tokens :] if self.truncation_side == "left" else ids[: self.max_obs_tokens]
            )
        input_ids = np.full(self.max_obs_tokens, self.pad_id, dtype=np.int64)
        input_ids[: len(ids)] = ids
        attention_mask = np.zeros(self.max_obs_tokens, dtype=np.int8)
        attention_mask[: len(ids)] = 1
        return input_ids, attention_mask

    def decode_action(self, action: Any) -> str:
        """Text of a token action: ids before the first ``pad_id``, decoded.

        With ``action_vocab``, action values are first mapped to ids (``action_vocab[value]``).

        Raises:
            ValueError: ``action`` is not a 1-D integer array of length 1..K with values in ``[0, n)``
                (``n`` = V, or ``len(action_vocab)``).
        """
        ids = np.asarray(action)
        if (
            ids.ndim != 1
            or not 1 <= ids.shape[0] <= self.max_act_tokens
            or not np.issubdtype(ids.dtype, np.integer)
        ):
            raise ValueError(
                f"token action must be a 1-D integer array of length 1..{self.max_act_tokens}, got "
                f"shape {ids.shape} dtype {ids.dtype}"
            )
        n = self.vocab_size if self.action_vocab is None else len(self.action_vocab)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            what = "token ids" if self.action_vocab is None else "action values (indices into action_vocab)"
            raise ValueError(f"{what} must be in [0, {n}), got min {ids.min()} max {ids.max()}")
        if self.action_vocab is not None:
            ids = self.action_vocab[ids]
        stops = np.flatnonzero(ids == self.pad_id)
        kept = ids[: stops[0]] if stops.size else ids
        return self.tokenizer.decode([int(i) for i in kept])

    def encode_action(self, text: str) -> np.ndarray:
        """Inverse of :meth:`decode_action` (up to tokenization): ``(K,)`` int64 action, padded with ``pad_id``.

        With ``action_vocab`` the values are indices into it.

        Raises:
            ValueError: ``text`` needs more than K tokens (the message gives the count), or a token of it
                is not in ``action_vocab``.
        """
        ids = encode_ids(self.tokenizer, text)
        if len(ids) > self.max_act_tokens:
            raise ValueError(f"text needs {len(ids)} tokens but max_act_tokens is {self.max_act_tokens}")
        out = np.full(self.max_act_tokens, self.pad_id, dtype=np.int64)
        out[: len(ids)] = ids
        if self.action_vocab is None:
            return out
        index = {int(t): i for i, t in enumerate(self.action_vocab)}
        missing = sorted({int(t) for t in out} - set(index))
        if missing:
            raise ValueError(f"text {text!r} uses token ids {missing} that are not in action_vocab")
        return np.array([index[int(t)] for t in out], dtype=np.int64)

    # ---- AEC API ----
    def observe(self, agent: str) -> dict[str, np.ndarray]:
        """Token observation of ``agent``; pass-through keys are copied from the wrapped observation."""
        inner = self.env.observe(agent)
        input_ids, attention_mask = self.encode_observation(self.obs_text(inner))
        obs: dict[str, np.ndarray] = {"input_ids": input_ids, "attention_mask": attention_mask}
        for key in self._passthrough[agent]:
            obs[key] = np.array(inner[key], copy=True)
        return obs

    def step(self, action: Any) -> None:
        """Decode a token action of a text agent, pass any other action (and dead-step ``None``) through."""
        agent = self.env.agent_selection
        if action is not None and self._action_spaces[agent] is self._token_action_space:
            action = self.decode_action(action)
        self.env.step(action)


def _check_action_vocab(action_vocab: Sequence[int], vocab_size: int, pad_id: int) -> np.ndarray:
    if isinstance(action_vocab, (str, bytes)) or not isinstance(action_vocab, Sequence):
        raise ValueError(f"action_vocab must be a sequence of token ids, got {type(action_vocab).__name__}")
    if not action_vocab or not all(
        isinstance(t, (int, np.integer)) and not isinstance(t, bool) and 0 <= t < vocab_size for t in action_vocab
    ):
        raise ValueError(f"action_vocab must be a non-empty sequence of ints in [0, {vocab_size}), got {action_vocab!r}")
    ids = np.asarray([int(t) for t in action_vocab], dtype=np.int64)
    if len(np.unique(ids)) != len(ids):
        raise ValueError(f"action_vocab repeats token ids: {sorted({int(t) for t in ids if (ids == t).sum() > 1})}")
    if pad_id not in ids:
        raise ValueError(f"action_vocab must contain pad_id {pad_id} (it ends a token action)")
    return ids


def _prompt_of(obs: Any) -> str:
    if not isinstance(obs, dict) or not isinstance(obs.get("prompt"), str):
        raise TypeError(
            "TokenSpaces tokenizes obs['prompt'] by default, but the observation has no 'prompt' string "
            f"(got {type(obs).__name__}); pass obs_text=callable(observation) -> str"
        )
    return obs["prompt"]
