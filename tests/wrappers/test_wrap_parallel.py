"""to_parallel: the turn-based Parallel view passes parallel_api_test and applies only the acting agent."""

from __future__ import annotations

import warnings

import pytest
from pettingzoo.test import parallel_api_test
from wrappers_toy_envs import EchoEnv, VerifyLoopEnv

from drmas_envs.wrappers import TurnBasedParallelEnv, to_parallel


@pytest.mark.parametrize("make_env", [EchoEnv, VerifyLoopEnv], ids=["echo", "verify_loop"])
def test_parallel_api_test_passes(make_env):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pettingzoo's style advice (agent names, text spaces)
        parallel_api_test(to_parallel(make_env()), num_cycles=300)


def test_only_the_acting_agents_action_takes_effect():
    par = to_parallel(VerifyLoopEnv(format_penalty=0.1))
    obs, infos = par.reset(seed=0, options={"task_index": 1})  # "What is 1 + 1?" -> "2"
    assert par.agents == ["solver", "verifier"] and set(obs) == {"solver", "verifier"}
    assert infos["solver"]["is_acting"] is True and infos["verifier"]["is_acting"] is False
    assert "What is 1 + 1?" in obs["verifier"]["prompt"]

    # The verifier's action is a no-op on the solver's turn, so even a malformed one is ignored.
    obs, rewards, terms, truncs, infos = par.step({"solver": "answer: 2", "verifier": 12345})
    assert par.agent_selection == "verifier"
    assert rewards == {"solver": 0.0, "verifier": 0.0}
    assert infos["verifier"]["is_acting"] is True and infos["solver"]["is_acting"] is False
    assert "proposed: answer: 2" in obs["verifier"]["prompt"]
    assert par.aec_env.history[-1].text == "answer: 2"

    obs, rewards, terms, truncs, infos = par.step({"verifier": "looks right <verify>approve</verify>"})
    assert rewards == {"solver": 1.0, "verifier": 1.0}  # R = 1, both calls valid
    assert terms == {"solver": True, "verifier": True} and truncs == {"solver": False, "verifier": False}
    assert infos["solver"]["won"] is True and infos["verifier"]["score"] == 1.0
    assert par.agents == []  # dead steps were played
    assert par.step({}) == ({}, {}, {}, {}, {})


def test_penalties_and_rejection_loop():
    par = to_parallel(VerifyLoopEnv(format_penalty=0.25, max_loops=2))
    par.reset(seed=0, options={"task_index": 2})
    total = dict.fromkeys(par.possible_agents, 0.0)
    for actions in (
        {"solver": "no idea"},  # invalid: -0.25
        {"verifier": "<verify>reject</verify>"},
        {"solver": "answer: 4"},
        {"verifier": "hmm"},  # invalid verdict: -0.25, counts as the second reject -> episode ends
    ):
        _, rewards, *_ = par.step(actions)
        for agent, r in rewards.items():
            total[agent] += r
    assert par.agents == []
    assert total == {"solver": -0.25, "verifier": -0.25}  # R = 0 (never approved)


def test_infos_are_copies_of_the_aec_infos():
    par = to_parallel(EchoEnv())
    _, infos = par.reset(seed=0)
    infos["a"]["role"] = "changed"
    assert par.aec_env.infos["a"]["role"] == "a"
    assert "is_acting" not in par.aec_env.infos["a"]


def test_errors_name_the_problem():
    with pytest.raises(
        TypeError, match=r"to_parallel expects a PettingZoo AECEnv \(e.g. a drmas env\), got str"
    ):
        to_parallel("echo")
    par = to_parallel(EchoEnv())
    par.reset(seed=0)
    with pytest.raises(
        KeyError, match=r"no action for agent 'a', whose turn it is .* got actions for \['b'\]"
    ):
        par.step({"b": "ok"})
    with pytest.raises(TypeError, match=r"actions must be a dict \{agent: action\}, got list"):
        par.step(["ok"])


def test_spaces_and_unwrapped_are_the_aec_ones():
    aec = EchoEnv()
    par = to_parallel(aec)
    assert isinstance(par, TurnBasedParallelEnv)
    assert par.observation_space("a") is aec.observation_space("a")
    assert par.action_space("b") is aec.action_space("b")
    assert par.possible_agents == ["a", "b"]
