"""MaskedSpaces: identical spaces, {"observation", "action_mask"}; real Tianshou collects on a drmas env."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo.test import api_test
from pettingzoo.utils.wrappers import BaseWrapper

import drmas_envs
from drmas_envs.wrappers import VERIFIER_CHOICES, DiscreteChoices, MaskedSpaces, TokenSpaces
from helpers.toy_envs import VerifyLoopEnv

QWEN_PAD = 151643
SOLVER_CHOICES = ("answer: 2", "answer: 4", "no idea")


def _toy(tiny_tokenizer, env=None):
    env = VerifyLoopEnv(format_penalty=0.1) if env is None else env
    env = DiscreteChoices(env, {"solver": SOLVER_CHOICES, "verifier": VERIFIER_CHOICES})
    return MaskedSpaces(TokenSpaces(env, tiny_tokenizer, 6, 1, pad_id=0, action_vocab=[0]))


def test_spaces_are_identical_and_masks_pad_the_shorter_choice_lists(tiny_tokenizer):
    env = _toy(tiny_tokenizer)
    assert env.observation_space("solver") is env.observation_space("verifier")
    assert env.action_space("solver") is env.action_space("verifier") == spaces.Discrete(3)
    assert env.observation_space("solver") == spaces.Dict(
        {
            # gymnasium's Dict sorts keys: attention_mask (6) then input_ids (6)
            "observation": spaces.Box(0, np.array([1] * 6 + [13] * 6), (12,), dtype=np.int64),
            "action_mask": spaces.Box(0, 1, (3,), dtype=np.int8),
        }
    )
    env.reset(seed=0, options={"task_index": 1})  # "What is 1 + 1?"
    obs = env.observe("solver")
    assert obs["action_mask"].tolist() == [1, 1, 1] and env.observe("verifier")["action_mask"].tolist() == [1, 1, 0]
    # the prompt's last 6 words ("... 'answer: N'. What is 1 + 1?") are unknown but "1": [UNK] = 1, "1" = 8
    assert obs["observation"].tolist() == [1] * 6 + [1, 1, 1, 8, 1, 1] and obs in env.observation_space("solver")
    env.step(0)  # solver: "answer: 2"
    with pytest.raises(ValueError, match=r"action 2 of agent 'verifier' is masked out: its legal choices are \[0, 1\]"):
        env.step(2)
    env.step(np.int64(0))  # approve
    assert env.unwrapped.history[-2].text == "answer: 2" and env.rewards == {"solver": 1.0, "verifier": 1.0}


def test_api_test_passes(tiny_tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(_toy(tiny_tokenizer), num_cycles=200)


def test_errors_name_the_problem(tiny_tokenizer):
    text_agent = TokenSpaces(
        DiscreteChoices(VerifyLoopEnv(), {"verifier": VERIFIER_CHOICES}), tiny_tokenizer, 6, 2, pad_id=0
    )
    with pytest.raises(ValueError, match=r"agent 'solver' has MultiDiscrete\(\[14 14\]\).*DiscreteChoices\(env, \{'solver'"):
        MaskedSpaces(text_agent)
    different = DiscreteChoices(VerifyLoopEnv(), {"solver": SOLVER_CHOICES, "verifier": VERIFIER_CHOICES})

    class _ShortVerifierObs(BaseWrapper):
        def observation_space(self, agent):
            base = spaces.Box(0, 1, (3 if agent == "solver" else 2,), dtype=np.int8)
            return spaces.Dict({"x": base, "action_mask": self.env.observation_space(agent)["action_mask"]})

    with pytest.raises(ValueError, match=r"agents 'solver' and 'verifier' observe different spaces once flattened"):
        MaskedSpaces(_ShortVerifierObs(different))


class _Recorder(BaseWrapper):
    """Records (agent, text) of every call that reaches the text env, and the step rewards."""

    def __init__(self, env):
        super().__init__(env)
        self.calls: list[tuple[str, str]] = []
        self.step_rewards: list[dict[str, float]] = []

    def step(self, action):
        agent = self.env.agent_selection
        self.env.step(action)
        if action is not None:
            self.calls.append((agent, action))
            self.step_rewards.append(dict(self.env.rewards))


@pytest.mark.slow  # imports tianshou (torch, h5py, tensorboard): ~20 s on 2 busy cores
def test_tianshou_dqn_verifier_on_math_solver_verifier_only_acting_agents_steps(qwen_tokenizer, monkeypatch):
    numba = pytest.importorskip("numba")
    # Tianshou numba-compiles its buffer helpers on first use (~25 s of CPU); 60 steps run faster interpreted.
    monkeypatch.setattr(numba.config, "DISABLE_JIT", True)
    pytest.importorskip("tianshou")
    torch = pytest.importorskip("torch")
    from tianshou.algorithm.modelfree.dqn import DQN, DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv, PettingZooEnv
    from tianshou.utils.net.common import Net
    from tianshou.utils.torch_utils import policy_within_training_step

    from drmas_train.integrations.tianshou_marl import random_marl_algorithm, tianshou_env

    boxed = [rf"\boxed{{{d}}}" for d in range(10)]
    recorder = _Recorder(drmas_envs.make("math-solver-verifier-v0", size=8))
    stack = DiscreteChoices(recorder, {"solver": boxed, "verifier": VERIFIER_CHOICES})
    stack = MaskedSpaces(TokenSpaces(stack, qwen_tokenizer, 32, 1, pad_id=QWEN_PAD, action_vocab=[QWEN_PAD]))
    env = PettingZooEnv(stack)  # Tianshou asserts identical spaces here
    assert env.action_space == spaces.Discrete(10)
    torch.manual_seed(0)
    q_net = Net(state_shape=env.observation_space["observation"].shape[0], action_shape=10, hidden_sizes=[16])
    dqn = DQN(
        policy=DiscreteQLearningPolicy(model=q_net, action_space=env.action_space, eps_training=0.2),
        optim=AdamOptimizerFactory(lr=1e-3),
    )
    algorithm = random_marl_algorithm(env, learners={"verifier": dqn})  # DQN Verifier, random Solver
    np.random.seed(0)
    collector = Collector(algorithm, DummyVectorEnv([lambda: env]), VectorReplayBuffer(200, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tianshou's stats warning about 2-D (per-agent) rewards
        stats = collector.collect(n_step=60, reset_before_collect=True)
    batch = collector.buffer[: len(collector.buffer)]
    assert len(batch) == 60 and stats.n_collected_episodes >= 10
    # Each transition is one call of the acting agent, in the env's order: no non-acting agent's step exists.
    assert batch.obs.agent_id.tolist() == [agent for agent, _ in recorder.calls]
    for agent, action, (_, text) in zip(batch.obs.agent_id, batch.act, recorder.calls, strict=True):
        assert text == (boxed[int(action)] if agent == "solver" else VERIFIER_CHOICES[int(action)])
    verifier = batch.obs.agent_id == "verifier"
    assert set(batch.act[verifier].tolist()) <= {0, 1}  # the padded choices 2..9 are masked out
    assert np.asarray(batch.obs.mask)[verifier].sum(axis=1).tolist() == [2] * int(verifier.sum())
    # Rewards: one column per agent (env.agents order), exactly the env's step rewards.
    expected = np.array([[r["solver"], r["verifier"]] for r in recorder.step_rewards])
    np.testing.assert_array_equal(batch.rew, expected)
    # One DQN update on the Verifier's transitions changes its Q-network.
    before = [p.detach().clone() for p in q_net.parameters()]
    with policy_within_training_step(algorithm.policy):
        algorithm.update(buffer=collector.buffer, sample_size=32)
    assert any(not torch.equal(a, b) for a, b in zip(before, q_net.parameters(), strict=True))

    with pytest.raises(ValueError, match=r"learners for \['critic'\], which are not agents of the env"):
        random_marl_algorithm(env, learners={"critic": dqn})
    # The recipe builds the same stack.
    recipe = tianshou_env(
        "math-solver-verifier-v0", qwen_tokenizer, pad_id=QWEN_PAD,
        choices={"solver": boxed, "verifier": VERIFIER_CHOICES}, max_obs_tokens=32, size=8,
    )
    assert recipe.observation_space == env.observation_space and recipe.agents == ["solver", "verifier"]
