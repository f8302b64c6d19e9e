"""LLM policies: play any env with ``policy(observation) -> text``."""

from __future__ import annotations

import pytest

from drmas_train.backends.base import SamplingParams
from drmas_train.eval.policies import LLMPolicy
from helpers.backend_fakes import ScriptedBackend
from helpers.echo_env import EchoEnv


def test_policy_plays_an_aec_env_in_the_readme_loop():
    backend = ScriptedBackend(
        lambda messages, call, row: "ok 3" if "You are b." in messages[0]["content"] else "ok"
    )
    policy = LLMPolicy(backend, SamplingParams(max_new_tokens=8, n=5))
    env = EchoEnv(render_mode="ansi")
    env.reset(seed=0, options={"task_index": 3})
    for _agent in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        env.step(None if terminated or truncated else policy(obs))
    assert env.episode_returns == {"a": 1.0, "b": 1.0}
    assert backend.calls == [1, 1] and policy.sampling.n == 1
    assert backend.prompts[1][0][0] == {"role": "system", "content": "You are b."}
    assert len(policy.last_generations) == 1 and policy.last_generations[0].text == "ok 3"


def test_policy_accepts_strings_message_lists_and_batches():
    backend = ScriptedBackend(lambda messages, call, row: messages[-1]["content"].upper())
    policy = LLMPolicy(backend)
    assert policy("hi") == "HI"
    assert policy([{"role": "user", "content": "yo"}]) == "YO"
    assert policy.batch(["a", {"messages": [{"role": "user", "content": "b"}]}]) == ["A", "B"]
    assert backend.calls == [1, 1, 2]
    with pytest.raises(
        TypeError, match=r"an observation must be a drmas observation dict with 'messages'.*got int"
    ):
        policy(3)


def test_policy_from_a_named_model_returns_text():
    policy = LLMPolicy.from_model("tiny-llama", max_new_tokens=4, seed=0)
    out = policy.batch(["What is 2 + 3?", "Say ok."])
    assert len(out) == 2 and all(isinstance(t, str) for t in out)
    assert all(1 <= len(g.response_ids) <= 4 for g in policy.last_generations)
