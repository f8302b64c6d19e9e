"""Recipes that train drmas envs with third-party RL libraries (RLlib, Tianshou, Stable-Baselines3).

One module per library; each imports its library lazily (inside functions), so importing this package, or
``drmas_envs``, never pulls in Ray, Tianshou or SB3. Install them with the ``marl`` extra
(``pip install -e ".[marl]"``). See ``docs/plugging-in.md`` for which adapter each library needs and why.

==========================  ==============================================================  ==================
module                      what it builds                                                  library
==========================  ==============================================================  ==================
:mod:`.rllib`               multi-agent PPO (new API stack) through ``ParallelPettingZooEnv``  ray[rllib] 2.60
                            over ``to_parallel(..., acting_only=True)``, plus the token
                            observation connector
:mod:`.tianshou`            a Tianshou ``PettingZooEnv`` over :class:`~drmas_envs.wrappers.   tianshou 2.0
                            TianshouSpaces` and a random multi-agent collector
:mod:`.sb3`                 a Stable-Baselines3 PPO on ``gymnasium.make("drmas/<id>")``     stable-baselines3 2.9
==========================  ==============================================================  ==================

The shared piece is :func:`numeric_aec_env`: the adapter stack every numeric library gets (choices for
categorical agents, token ids over a small action vocabulary for the writers).
"""

from drmas_train.integrations.numeric_env import boxed_answer_vocab, numeric_aec_env

__all__ = ["numeric_aec_env", "boxed_answer_vocab"]
