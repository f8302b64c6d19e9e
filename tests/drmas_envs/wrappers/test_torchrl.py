"""Real third-party consumer: TorchRL's PettingZooWrapper collects random-policy rollouts through our adapters.

TorchRL needs array spaces (TokenSpaces), categorical actions with a mask (DiscreteChoices) and tensorisable
infos with fixed keys (NumericInfos). AEC envs use ``use_mask=True``: ``(group, "mask")`` says who acts.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from pettingzoo.utils.wrappers import BaseWrapper

import drmas_envs
from drmas_envs.wrappers import (
    ROUTER_CHOICES,
    VERIFIER_CHOICES,
    DiscreteChoices,
    NumericInfos,
    TokenSpaces,
    to_parallel,
)
from helpers.toy_envs import EchoEnv, VerifyLoopEnv

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
from torchrl.envs.libs.pettingzoo import PettingZooWrapper  # noqa: E402
from torchrl.envs.utils import MarlGroupMapType  # noqa: E402

QWEN_PAD = 151643  # "<|endoftext|>" in the Qwen3 tokenizer


class _Recorder(BaseWrapper):
    """Records every (agent, text action) that reaches the text env, and the step rewards it produced."""

    def __init__(self, env):
        super().__init__(env)
        self.actions: list[tuple[str, str]] = []
        self.step_rewards: list[dict[str, float]] = []

    def step(self, action):
        agent = self.env.agent_selection
        self.env.step(action)
        if action is not None:
            self.actions.append((agent, action))
            self.step_rewards.append(dict(self.env.rewards))


def _aec_rollout(text_env, choices, tokenizer, steps=100):
    recorder = _Recorder(text_env)
    aec = NumericInfos(TokenSpaces(DiscreteChoices(recorder, choices), tokenizer, 96, 8, pad_id=QWEN_PAD))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL warns that it is tested with pettingzoo 1.24.3
        env = PettingZooWrapper(
            aec,
            use_mask=True,
            group_map=MarlGroupMapType.ONE_GROUP_PER_AGENT,
            categorical_actions=True,
            seed=0,
        )
    torch.manual_seed(0)
    td = env.rollout(steps, break_when_any_done=False)  # random policy: env.rand_action, auto-reset
    env.close()
    return td, recorder


def _check_turns_and_actions(td, recorder, agents, choice_agent, choices, tokenizer, steps=100):
    actions = recorder.actions
    assert td.batch_size == torch.Size([steps])
    masks = torch.stack([td[a, "mask"].reshape(steps) for a in agents], dim=1)  # (steps, A)
    assert masks.sum(dim=1).eq(1).all()  # turn-based: exactly one agent acts per step
    acting = [agents[int(i)] for i in masks.int().argmax(dim=1)]
    assert [a for a, _ in actions] == acting  # every step reached the text env, in order
    for step, (agent, text) in enumerate(actions):
        action = td[agent, "action"][step].reshape(-1)
        if agent == choice_agent:
            assert text == choices[int(action)]
        else:
            ids = action.numpy()
            stop = np.flatnonzero(ids == QWEN_PAD)
            assert text == tokenizer.decode(ids[: stop[0]] if stop.size else ids)
    for agent in agents:  # TorchRL's rewards are exactly the env's step rewards
        expected = torch.tensor([r[agent] for r in recorder.step_rewards], dtype=torch.float32)
        assert torch.equal(td["next", agent, "reward"].reshape(steps), expected), agent
    assert td["next", "done"].sum() >= 1  # episodes ended and were auto-reset
    return acting


def test_torchrl_collects_100_steps_on_toy_verify_loop(qwen_tokenizer):
    agents = ["solver", "verifier"]
    td, recorder = _aec_rollout(
        VerifyLoopEnv(format_penalty=0.1), {"verifier": VERIFIER_CHOICES}, qwen_tokenizer
    )
    acting = _check_turns_and_actions(td, recorder, agents, "verifier", VERIFIER_CHOICES, qwen_tokenizer)
    # Random tokens never contain "answer:": each solver call costs 0.1, nobody wins, verifier choices are valid.
    solver_reward = td["next", "solver", "reward"].sum().item()
    assert solver_reward == pytest.approx(-0.1 * acting.count("solver"))
    assert td["next", "verifier", "reward"].abs().sum().item() == 0.0
    assert td["next", "verifier", "info", "is_action_valid"].all()
    assert td["verifier", "action_mask"].all() and td["verifier", "observation", "input_ids"].shape == (
        100,
        1,
        96,
    )


@pytest.mark.parametrize(
    ("env_id", "kwargs", "choice_agent", "choices", "penalty"),
    [
        ("math-solver-verifier-v0", {"size": 8}, "verifier", VERIFIER_CHOICES, 0.1),
        ("search-orchestrator-v0", {}, "verifier", ROUTER_CHOICES, 0.01),
    ],
    ids=["math-solver-verifier", "search-orchestrator"],
)
def test_torchrl_collects_100_steps_on_real_envs(
    qwen_tokenizer, env_id, kwargs, choice_agent, choices, penalty
):
    if env_id not in drmas_envs.registry:
        pytest.skip(f"{env_id} is not registered in this checkout")
    text_env = drmas_envs.make(env_id, **kwargs)
    agents = list(text_env.possible_agents)
    td, recorder = _aec_rollout(text_env, {choice_agent: choices}, qwen_tokenizer)
    acting = _check_turns_and_actions(td, recorder, agents, choice_agent, choices, qwen_tokenizer)
    # Random text never follows the free-text agents' protocols (\boxed{}, <search>, <answer>): each such call
    # costs `penalty`, no episode is won; the choice agent is always valid and so only gets R = 0.
    for agent in agents:
        total = td["next", agent, "reward"].sum().item()
        expected = 0.0 if agent == choice_agent else -penalty * acting.count(agent)
        assert total == pytest.approx(expected, abs=1e-5), agent
    assert not td["next", choice_agent, "info", "won"].any()


def test_torchrl_parallel_view_with_identical_spaces_in_one_group(qwen_tokenizer):
    recorder = _Recorder(EchoEnv(format_penalty=0.5))
    par = to_parallel(NumericInfos(TokenSpaces(recorder, qwen_tokenizer, 32, 4, pad_id=QWEN_PAD)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = PettingZooWrapper(par, group_map=MarlGroupMapType.ALL_IN_ONE_GROUP, seed=0)
    torch.manual_seed(0)
    td = env.rollout(100, break_when_any_done=False)
    assert td["agents", "observation", "input_ids"].shape == (100, 2, 32)  # both agents stacked: same spaces
    assert td["agents", "action"].shape == (100, 2, 4)
    is_acting = td["agents", "info", "is_acting"].reshape(100, 2).bool()
    assert is_acting.sum(dim=1).eq(1).all()
    acting = ["ab"[int(i)] for i in is_acting.int().argmax(dim=1)]
    # echo: a then b, so 100 steps are 50 episodes
    assert acting == ["a", "b"] * 50 and [a for a, _ in recorder.actions] == acting
    assert td["next", "done"].reshape(100).tolist() == [False, True] * 50
    # Step rewards are the env's: the acting agent's penalty (-0.5 unless its text has "ok"), plus R at the end.
    expected = torch.tensor([[r["a"], r["b"]] for r in recorder.step_rewards], dtype=torch.float32)
    assert torch.equal(td["next", "agents", "reward"].reshape(100, 2), expected)
    for (_, text), r in zip(recorder.actions[::2], recorder.step_rewards[::2], strict=True):
        assert r == {"a": 0.0 if "ok" in text else -0.5, "b": 0.0}
