"""Real Stable-Baselines3: PPO trains the math Verifier (Discrete choices) and the Solver (token actions)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo.utils.wrappers import BaseWrapper

from drmas_envs.wrappers import VERIFIER_CHOICES

QWEN_PAD = 151643


class _Recorder(BaseWrapper):
    def __init__(self, env):
        super().__init__(env)
        self.calls: list[tuple[str, str]] = []

    def step(self, action):
        agent = self.env.agent_selection
        self.env.step(action)
        if action is not None:
            self.calls.append((agent, action))


# SB3 + torch import and two 16-64 step PPO runs: ~5 s on 2 busy cores
def test_sb3_ppo_trains_one_agent_each_step_is_its_decision(qwen_tokenizer):
    sb3 = pytest.importorskip("stable_baselines3")
    torch = pytest.importorskip("torch")
    from stable_baselines3.common.env_checker import check_env

    from drmas_train.integrations.sb3_ppo import sb3_env

    torch.set_num_threads(1)
    recorders = []

    def record(env):
        recorders.append(_Recorder(env))
        return recorders[-1]

    env = sb3_env(
        "math-solver-verifier-v0", "verifier", qwen_tokenizer, pad_id=QWEN_PAD, size=8, text_wrappers=[record]
    )
    assert env.observation_space == spaces.Box(0.0, 1.0, (2 * 64 + 2,), dtype=np.float32)
    assert env.action_space == spaces.Discrete(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env)
    model = sb3.PPO(
        "MlpPolicy", env, n_steps=32, batch_size=16, n_epochs=1, policy_kwargs={"net_arch": [16]}, seed=0,
        device="cpu",
    )
    before = [p.detach().clone() for p in model.policy.parameters()]
    recorder = recorders[-1]
    recorder.calls.clear()  # check_env's own steps
    model.learn(total_timesteps=64)
    assert model.num_timesteps == 64
    assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters(), strict=True))
    # Each SB3 step is one Verifier decision; the Solver's calls are played by its fixed (random) policy.
    verifier_calls = [text for agent, text in recorder.calls if agent == "verifier"]
    assert len(verifier_calls) == 64 and set(verifier_calls) <= set(VERIFIER_CHOICES)

    # A writer: the Solver's token actions over the boxed-digit vocabulary fit a stock MLP head.
    solver_env = sb3_env("math-solver-verifier-v0", "solver", qwen_tokenizer, pad_id=QWEN_PAD, size=8)
    assert solver_env.action_space == spaces.MultiDiscrete([15] * 8)  # 120 logits, not 151,669 x 8
    solver = sb3.PPO(
        "MlpPolicy", solver_env, n_steps=16, batch_size=16, n_epochs=1, policy_kwargs={"net_arch": [16]}, seed=0,
        device="cpu",
    )
    solver.learn(total_timesteps=16)
    assert solver.num_timesteps == 16
