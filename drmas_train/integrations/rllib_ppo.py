"""RLlib recipe: multi-agent PPO (new API stack) on a drmas env, one RLModule per agent.

Data path. The reference splits each batch by worker group so every agent's model trains on its own turns
(``langfengQ/DrMAS verl/trainer/ppo/ray_trainer.py:1225``, ``split_batch_by_wg_ids``); this is the numeric analogue,
one RLModule per agent::

    drmas env ──numeric_aec_env──► token ids / choices ──to_parallel(acting_only=True)──►
    ParallelPettingZooEnv ──TokenObservations (env-to-module connector)──► float vectors ──► PPO, module per agent

Why these pieces:

- ``to_parallel(..., acting_only=True)``: RLlib's ``MultiAgentEnv`` contract is that the agents in a step's
  observation dict are the ones that act next. The drmas view observes only the agent whose turn it is, so
  RLlib logs exactly one agent step per env step and never trains a non-acting agent's no-op as a decision
  (rewards of the others are accumulated by RLlib until their next turn).
- :class:`TokenObservations`: RLlib's default PPO module takes a flat float ``Box``; drmas token observations
  are ``Dict(input_ids int64 (O,), attention_mask int8 (O,)[, action_mask])``. The connector maps them to
  ``float32 (2*O [+ n],)``: ``input_ids / (V - 1)`` (0 on padding), the attention mask, then the other keys
  flattened (``gymnasium.spaces.flatten``). RLlib's own ``FlattenObservations`` would feed raw ids (up to
  ``V - 1``, e.g. 151,668) to the MLP.
- small actions: writers emit ``K`` tokens from a ~15-id vocabulary (``MultiDiscrete([15] * K)``), choice
  agents ``Discrete(2)``; the default head sizes are then a few hundred logits (see ``docs/plugging-in.md``).

Example (``ray[rllib]==2.60.0``; CPU)::

    config = ppo_config("math-solver-verifier-v0", tokenizer_file="path/to/tokenizer.json",
                        pad_id=151643, env_kwargs={"size": 64})
    algo = config.build_algo()
    for _ in range(10):
        result = algo.train()
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium

from drmas_train.integrations.numeric_env import token_feature_space, token_features

if TYPE_CHECKING:  # pragma: no cover - typing only; ray is imported lazily
    from ray.rllib.algorithms.ppo import PPOConfig

__all__ = ["ENV_NAME", "TokenObservations", "make_rllib_env", "ppo_config"]  # noqa: F822 (lazy)

#: Name under which :func:`ppo_config` registers :func:`make_rllib_env` with ``ray.tune``.
ENV_NAME = "drmas-parallel"


def _make_token_observations_class() -> type:
    from ray.rllib.connectors.connector_v2 import ConnectorV2

    class TokenObservations(ConnectorV2):
        """Env-to-module connector: drmas token ``Dict`` observations -> ``float32`` vectors (multi-agent).

        For every agent that stepped, the last observation of its episode is replaced by
        ``concat(input_ids / (V - 1) * attention_mask, attention_mask, flatten(other keys))``, shape
        ``(2*O + n,)`` float32 (see :func:`~drmas_train.integrations.numeric_env.token_feature_space`). Agents whose space is not a token
        ``Dict`` pass through unchanged.
        """

        def recompute_output_observation_space(self, input_observation_space, input_action_space):
            self._input_spaces = dict(input_observation_space.spaces)
            return gymnasium.spaces.Dict(
                {agent: token_feature_space(s) for agent, s in self._input_spaces.items()}
            )

        def __call__(self, *, rl_module, batch, episodes, explore=None, shared_data=None, **kwargs):
            for sa_episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=True):
                space = self._input_spaces[sa_episode.agent_id]
                if token_feature_space(space) is space:
                    continue
                observation = sa_episode.get_observations(-1)
                sa_episode.set_observations(at_indices=-1, new_data=token_features(observation, space))
                sa_episode.observation_space = self.observation_space[sa_episode.agent_id]
            return batch

    TokenObservations.__module__ = __name__
    TokenObservations.__qualname__ = "TokenObservations"
    return TokenObservations


_CLASSES: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    # ``TokenObservations`` subclasses RLlib's ConnectorV2, so it is built on first access (imports ray).
    if name == "TokenObservations":
        if name not in _CLASSES:
            _CLASSES[name] = _make_token_observations_class()
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_rllib_env(env_config: Mapping[str, Any]) -> Any:
    """``ParallelPettingZooEnv(to_parallel(numeric_aec_env(...), acting_only=True))`` from an RLlib env config.

    ``env_config`` keys: ``env_id`` (required), ``tokenizer_file`` (a ``tokenizer.json``, required),
    ``pad_id`` (required), ``max_obs_tokens``, ``max_act_tokens``, ``action_vocab``, ``choices``,
    ``env_kwargs`` (passed to ``drmas_envs.make``). Plain values only (no tokenizer object), so the config
    pickles cheaply to remote env runners.

    Raises:
        KeyError: a required key is missing (the message lists the accepted keys).
    """
    missing = [k for k in ("env_id", "tokenizer_file", "pad_id") if k not in env_config]
    if missing:
        raise KeyError(
            f"env_config lacks {missing}; accepted keys: env_id, tokenizer_file, pad_id (required), "
            "max_obs_tokens, max_act_tokens, action_vocab, choices, env_kwargs"
        )
    import tokenizers
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv

    from drmas_envs.wrappers import to_parallel
    from drmas_train.integrations.numeric_env import numeric_aec_env

    tokenizer = tokenizers.Tokenizer.from_file(str(env_config["tokenizer_file"]))
    aec = numeric_aec_env(
        env_config["env_id"],
        tokenizer,
        pad_id=int(env_config["pad_id"]),
        max_obs_tokens=int(env_config.get("max_obs_tokens", 64)),
        max_act_tokens=int(env_config.get("max_act_tokens", 8)),
        action_vocab=env_config.get("action_vocab"),
        choices=env_config.get("choices"),
        numeric_infos=False,  # RLlib keeps infos as Python objects
        **dict(env_config.get("env_kwargs", {})),
    )
    return ParallelPettingZooEnv(to_parallel(aec, acting_only=True))


def ppo_config(
    env_id: str,
    *,
    tokenizer_file: str,
    pad_id: int,
    env_kwargs: Mapping[str, Any] | None = None,
    max_obs_tokens: int = 64,
    max_act_tokens: int = 8,
    hidden: Collection[int] = (64,),
    train_batch_size: int = 128,
    minibatch_size: int = 64,
    num_epochs: int = 1,
    num_env_runners: int = 0,
    seed: int = 0,
) -> PPOConfig:
    """RLlib ``PPOConfig`` (new API stack): one PPO RLModule per drmas agent, trained on its own turns.

    Args:
        env_id: drmas registry id (its agents become RLlib agents and module ids).
        tokenizer_file: path of a ``tokenizers`` ``tokenizer.json`` (e.g. the Qwen3 one).
        pad_id: pad / stop token id of that tokenizer.
        env_kwargs: passed to ``drmas_envs.make``.
        max_obs_tokens: ``O``; max_act_tokens: ``K`` (see :func:`~drmas_train.integrations.numeric_aec_env`).
        hidden: MLP hidden sizes of each module (``fcnet_hiddens``).
        train_batch_size: env steps per training iteration (``train_batch_size_per_learner``).
        minibatch_size: SGD minibatch (agent steps); num_epochs: passes over each batch.
        num_env_runners: 0 samples in the driver (fastest on few cores).
        seed: RLlib's ``debugging(seed=...)``.

    Returns:
        a ``PPOConfig``; ``config.build_algo().train()`` runs one iteration.

    Raises:
        the registry's lookup errors for an unknown ``env_id``.
    """
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.tune.registry import register_env

    import drmas_envs

    agents = list(drmas_envs.make(env_id, **dict(env_kwargs or {})).possible_agents)
    register_env(ENV_NAME, make_rllib_env)
    token_observations = __getattr__("TokenObservations")
    model = DefaultModelConfig(fcnet_hiddens=list(hidden), head_fcnet_hiddens=[])
    return (
        PPOConfig()
        .environment(
            ENV_NAME,
            env_config={
                "env_id": env_id,
                "tokenizer_file": str(tokenizer_file),
                "pad_id": int(pad_id),
                "max_obs_tokens": max_obs_tokens,
                "max_act_tokens": max_act_tokens,
                "env_kwargs": dict(env_kwargs or {}),
            },
        )
        .env_runners(
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=1,
            env_to_module_connector=lambda env, spaces=None, device=None: token_observations(),
        )
        .multi_agent(
            policies=set(agents),
            policy_mapping_fn=lambda agent_id, episode, **kwargs: agent_id,
        )
        .rl_module(
            rl_module_spec=MultiRLModuleSpec(
                rl_module_specs={agent: RLModuleSpec(model_config=model) for agent in agents}
            )
        )
        .training(
            train_batch_size_per_learner=train_batch_size,
            minibatch_size=minibatch_size,
            num_epochs=num_epochs,
            lr=3e-4,
        )
        .debugging(seed=seed)
    )
