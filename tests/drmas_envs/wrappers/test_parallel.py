"""to_parallel: the turn-based Parallel view passes parallel_api_test and applies only the acting agent."""

from __future__ import annotations

import warnings

import pytest
from pettingzoo.test import parallel_api_test

from drmas_envs.wrappers import TurnBasedParallelEnv, to_parallel
from helpers.toy_envs import EchoEnv, VerifyLoopEnv


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


# ---- acting_only: the RLlib MultiAgentEnv contract (observed agents are the ones that act) ----


def test_acting_only_observes_and_accepts_only_the_acting_agent():
    par = to_parallel(VerifyLoopEnv(format_penalty=0.1), acting_only=True)
    obs, infos = par.reset(seed=0, options={"task_index": 1})  # "What is 1 + 1?" -> "2"
    assert list(obs) == ["solver"] and list(infos) == ["solver"] and par.acting_agents == ["solver"]
    assert par.agents == ["solver", "verifier"]  # both stay live: only the observation dict is narrowed

    with pytest.raises(ValueError, match=r"acting_only=True: only agent 'solver' acts this step"):
        par.step({"solver": "answer: 2", "verifier": "<verify>approve</verify>"})
    assert par.aec_env.history == []  # the rejected step was not applied

    obs, rewards, terms, truncs, infos = par.step({"solver": "no answer"})  # invalid: -0.1 to the solver
    assert list(obs) == ["verifier"] and list(infos) == ["verifier"] and infos["verifier"]["is_acting"] is True
    assert rewards == {"solver": -0.1, "verifier": 0.0}  # rewards reach every live agent, observed or not
    assert terms == truncs == {"solver": False, "verifier": False}

    obs, rewards, terms, truncs, infos = par.step({"verifier": "<verify>reject</verify>"})
    assert list(obs) == ["solver"]
    obs, rewards, terms, truncs, infos = par.step({"solver": "answer: 2"})
    obs, rewards, terms, truncs, infos = par.step({"verifier": "<verify>approve</verify>"})
    # The last step observes every agent (their final observations) and ends everyone.
    assert set(obs) == {"solver", "verifier"} and rewards == {"solver": 1.0, "verifier": 1.0}
    assert terms == {"solver": True, "verifier": True} and par.agents == [] and par.acting_agents == []


def test_acting_only_episode_returns_equal_the_aec_returns():
    """Summing the acting-only view's step rewards gives each agent's drmas return R - penalty * invalid."""
    par = to_parallel(VerifyLoopEnv(format_penalty=0.25, max_loops=2), acting_only=True)
    obs, _ = par.reset(seed=0, options={"task_index": 2})
    script = iter(["no idea", "<verify>reject</verify>", "answer: 4", "hmm"])
    total = dict.fromkeys(par.possible_agents, 0.0)
    decisions = []
    while par.agents:
        (agent,) = obs
        decisions.append(agent)
        obs, rewards, *_ = par.step({agent: next(script)})
        for a, r in rewards.items():
            total[a] += r
    assert decisions == ["solver", "verifier", "solver", "verifier"]  # one decision per AEC call, no no-ops
    assert total == {"solver": -0.25, "verifier": -0.25}


def test_acting_only_must_be_a_bool():
    with pytest.raises(TypeError, match=r"acting_only must be a bool, got 'yes'"):
        to_parallel(EchoEnv(), acting_only="yes")


@pytest.mark.parametrize("env_id", ["search-orchestrator-v0", "math-generator-verifier-refiner-v0"])
def test_pettingzoo_aec_to_parallel_points_to_to_parallel(env_id):
    from pettingzoo.utils.conversions import aec_to_parallel

    import drmas_envs

    if env_id not in drmas_envs.registry:
        pytest.skip(f"{env_id} is not registered in this checkout")
    env = drmas_envs.make(env_id)
    with pytest.raises(TypeError, match=r"drmas envs are turn-based.*Use drmas_envs\.wrappers\.to_parallel\(env\)"):
        aec_to_parallel(env)
    # The drmas view of the same env passes PettingZoo's Parallel API test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(to_parallel(env), num_cycles=50)


def test_not_parallelizable_flag_copies_and_pickles():
    import copy
    import pickle

    from drmas_envs.core.parallelizable import NOT_PARALLELIZABLE

    assert pickle.loads(pickle.dumps(NOT_PARALLELIZABLE)) is NOT_PARALLELIZABLE
    assert copy.deepcopy({"f": NOT_PARALLELIZABLE})["f"] == False  # noqa: E712 - equality with False is the API
    assert EchoEnv.metadata["is_parallelizable"] is NOT_PARALLELIZABLE
