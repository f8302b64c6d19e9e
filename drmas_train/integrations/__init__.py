"""Recipes that train drmas envs with third-party RL libraries (RLlib, Tianshou, Stable-Baselines3).

Floor 10 of drmas_train (over floors 0-9).

One module per library; each imports its library lazily (inside functions), so importing this package, or
``drmas_envs``, never pulls in Ray, Tianshou or SB3. Install them with the ``marl`` extra
(``pip install -e ".[marl]"``). See ``docs/plugging-in.md`` for which adapter each library needs and why.

- :mod:`.rllib_ppo` (``ray[rllib]`` 2.60): multi-agent PPO on the new API stack through
  ``ParallelPettingZooEnv`` over ``to_parallel(..., acting_only=True)``, with the ``TokenObservations``
  env-to-module connector.
- :mod:`.tianshou_marl` (``tianshou`` 2.0): a Tianshou ``PettingZooEnv`` over
  :class:`~drmas_envs.wrappers.MaskedSpaces` (identical spaces, ``{"observation", "action_mask"}``) and a
  multi-agent algorithm (a learner such as DQN for chosen agents, random legal choices for the others).
- :mod:`.sb3_ppo` (``stable-baselines3`` 2.9): SB3 PPO on one agent of ``gymnasium.make("drmas/<id>")``.

The shared piece is :func:`numeric_aec_env`: the adapter stack every numeric library gets (choices for
categorical agents, token ids over a small action vocabulary for the writers).
"""

from drmas_train.integrations.numeric_env import boxed_answer_vocab, numeric_aec_env

__all__ = ["numeric_aec_env", "boxed_answer_vocab"]
