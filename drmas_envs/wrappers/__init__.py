"""Adapters that let third-party algorithms use drmas envs without editing them.

Floor 5 of drmas_envs (over ``core`` and ``registration``).

==============================  ===========================================  ======================================
adapter                         for                                          checked by
==============================  ===========================================  ======================================
:func:`to_parallel`             Parallel-API libraries (turn-based view;      ``pettingzoo.test.parallel_api_test``;
                                ``acting_only=True`` for RLlib)               RLlib ``ParallelPettingZooEnv``
:class:`TokenSpaces`            numeric MARL (token-id arrays + mask;         ``api_test``; TorchRL PettingZooWrapper
                                few action ids: :func:`action_vocab_of`)
:class:`DiscreteChoices`        categorical agents (approve/reject, yes/no)   ``api_test``; TorchRL PettingZooWrapper
:class:`NumericInfos`           libraries that tensorise infos (TorchRL)      ``api_test``
:class:`MaskedSpaces`           same spaces + ``action_mask`` (Tianshou)      ``api_test``; Tianshou PettingZooEnv
:class:`SingleAgentEnv`         ``gymnasium.Env`` consumers, ``drmas/<id>``   ``gymnasium.utils.env_checker.check_env``
:mod:`.dataset_export`          LLM-RL trainers (TRL prompt/completion)       TRL dataset formats
==============================  ===========================================  ======================================

Importing this package mirrors every registered drmas id into Gymnasium's registry as ``drmas/<id>``
(see :func:`register_gymnasium_envs`). Nothing here imports torch. See ``docs/plugging-in.md``.
"""

from drmas_envs.wrappers.dataset_export import (
    episodes_to_rows,
    record_episode,
    samples_to_rows,
    to_hf_datasets,
    write_jsonl,
)
from drmas_envs.wrappers.discrete_choices import ROUTER_CHOICES, VERIFIER_CHOICES, DiscreteChoices
from drmas_envs.wrappers.masked_spaces import MaskedSpaces
from drmas_envs.wrappers.numeric_infos import DEFAULT_NUMERIC_INFO_FIELDS, NumericInfos
from drmas_envs.wrappers.parallel import TurnBasedParallelEnv, to_parallel
from drmas_envs.wrappers.single_agent import (
    GYMNASIUM_NAMESPACE,
    RandomPolicy,
    SingleAgentEnv,
    gymnasium_id,
    make_single_agent_env,
    register_gymnasium_envs,
)
from drmas_envs.wrappers.token_spaces import TokenSpaces, action_vocab_of, encode_ids, vocab_size_of

__all__ = [
    "to_parallel",
    "TurnBasedParallelEnv",
    "TokenSpaces",
    "encode_ids",
    "action_vocab_of",
    "vocab_size_of",
    "DiscreteChoices",
    "VERIFIER_CHOICES",
    "ROUTER_CHOICES",
    "NumericInfos",
    "MaskedSpaces",
    "DEFAULT_NUMERIC_INFO_FIELDS",
    "SingleAgentEnv",
    "RandomPolicy",
    "make_single_agent_env",
    "register_gymnasium_envs",
    "gymnasium_id",
    "GYMNASIUM_NAMESPACE",
    "record_episode",
    "episodes_to_rows",
    "samples_to_rows",
    "write_jsonl",
    "to_hf_datasets",
]

register_gymnasium_envs()
