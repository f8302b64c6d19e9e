"""DiscreteChoices: Discrete(n) actions rendered into the env's text protocol; NumericInfos: fixed numeric infos."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo.test import api_test, parallel_api_test

from drmas_envs.wrappers import (
    DEFAULT_NUMERIC_INFO_FIELDS,
    ROUTER_CHOICES,
    VERIFIER_CHOICES,
    DiscreteChoices,
    NumericInfos,
    TokenSpaces,
    to_parallel,
)
from helpers.toy_envs import EchoEnv, VerifyLoopEnv


def test_choice_index_renders_the_protocol_text():
    env = DiscreteChoices(VerifyLoopEnv(format_penalty=0.1), {"verifier": VERIFIER_CHOICES})
    env.reset(seed=0, options={"task_index": 3})  # 3 + 3 -> "6"
    env.step("answer: 6")  # the solver still speaks text
    obs = env.observe("verifier")
    assert obs["action_mask"].tolist() == [1, 1] and obs["action_mask"].dtype == np.int8
    assert "proposed: answer: 6" in obs["prompt"]
    env.step(np.int64(0))  # approve
    assert env.unwrapped.history[-1].text == "<verify>approve</verify>"
    assert env.terminations == {"solver": True, "verifier": True}
    assert env.infos["verifier"]["won"] is True and env.unwrapped.episode_returns == {
        "solver": 1.0,
        "verifier": 1.0,
    }


def test_reject_loops_back_to_the_solver():
    env = DiscreteChoices(VerifyLoopEnv(max_loops=3), {"verifier": VERIFIER_CHOICES})
    env.reset(seed=0, options={"task_index": 1})
    env.step("answer: 3")
    env.step(1)  # reject
    assert env.unwrapped.history[-1].text == "<verify>reject</verify>" and env.agent_selection == "solver"
    assert env.infos["verifier"]["is_action_valid"] is True


def test_spaces():
    env = DiscreteChoices(VerifyLoopEnv(), {"verifier": VERIFIER_CHOICES})
    assert env.action_space("verifier") == spaces.Discrete(2)
    assert env.action_space("verifier") is env.action_space("verifier")
    assert env.action_space("solver") is env.unwrapped.action_space("solver")
    obs_space = env.observation_space("verifier")
    assert set(obs_space.spaces) == {"prompt", "messages", "action_mask"}
    assert obs_space["action_mask"] == spaces.Box(0, 1, (2,), np.int8)
    assert ROUTER_CHOICES == ("<verify>yes</verify>", "<verify>no</verify>")


def test_pettingzoo_checkers_pass(qwen_tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(DiscreteChoices(VerifyLoopEnv(), {"verifier": VERIFIER_CHOICES}), num_cycles=200)
        stacked = NumericInfos(
            TokenSpaces(
                DiscreteChoices(VerifyLoopEnv(), {"verifier": VERIFIER_CHOICES}),
                qwen_tokenizer,
                48,
                6,
                pad_id=0,
            )
        )
        api_test(stacked, num_cycles=200)
        parallel_api_test(to_parallel(stacked), num_cycles=200)


def test_token_spaces_keep_the_choice_and_pass_the_mask_through(qwen_tokenizer):
    env = TokenSpaces(
        DiscreteChoices(VerifyLoopEnv(), {"verifier": VERIFIER_CHOICES}), qwen_tokenizer, 32, 4, pad_id=0
    )
    assert env.action_space("verifier") == spaces.Discrete(2)
    assert set(env.observation_space("verifier").spaces) == {"input_ids", "attention_mask", "action_mask"}
    assert set(env.observation_space("solver").spaces) == {"input_ids", "attention_mask"}
    env.reset(seed=0, options={"task_index": 0})
    env.step(env.encode_action("answer: 0"))
    assert env.unwrapped.history[-1].text == "answer: 0"
    assert env.observe("verifier")["action_mask"].tolist() == [1, 1]
    env.step(0)
    assert env.unwrapped.history[-1].text == "<verify>approve</verify>" and env.infos["solver"]["won"] is True


def test_errors_name_the_problem(qwen_tokenizer):
    with pytest.raises(
        ValueError, match=r"unknown agent 'judge' in choices; the env's agents are \['solver', 'verifier'\]"
    ):
        DiscreteChoices(VerifyLoopEnv(), {"judge": VERIFIER_CHOICES})
    with pytest.raises(ValueError, match=r"choices\['verifier'\] must be a non-empty list of str, got 'yes'"):
        DiscreteChoices(VerifyLoopEnv(), {"verifier": "yes"})
    with pytest.raises(ValueError, match=r"choices\['verifier'\] has duplicates: \['a', 'a'\]"):
        DiscreteChoices(VerifyLoopEnv(), {"verifier": ["a", "a"]})
    with pytest.raises(
        TypeError, match=r"agent 'verifier' does not take text actions here .* TokenSpaces\(DiscreteChoices"
    ):
        DiscreteChoices(
            TokenSpaces(VerifyLoopEnv(), qwen_tokenizer, 8, 2, pad_id=0), {"verifier": VERIFIER_CHOICES}
        )
    env = DiscreteChoices(VerifyLoopEnv(), {"verifier": VERIFIER_CHOICES})
    env.reset(seed=0)
    env.step("answer: 1")
    with pytest.raises(ValueError, match=r"action of agent 'verifier' must be in \[0, 2\) .*, got 2"):
        env.step(2)
    with pytest.raises(ValueError, match=r"must be an integer choice index in \[0, 2\), got 'approve'"):
        env.step("approve")


def test_numeric_infos_have_fixed_numeric_fields():
    env = NumericInfos(VerifyLoopEnv(format_penalty=0.5))
    env.reset(seed=0, options={"task_index": 1})
    assert env.infos["solver"] == {
        "is_action_valid": True,
        "penalty": 0.0,
        "turn": 0,
        "won": False,
        "score": 0.0,
    }
    env.step("no answer")
    assert env.infos["solver"] == {
        "is_action_valid": False,
        "penalty": 0.5,
        "turn": 0,
        "won": False,
        "score": 0.0,
    }
    env.step("<verify>approve</verify>")
    assert env.infos["verifier"] == {
        "is_action_valid": True,
        "penalty": 0.0,
        "turn": 1,
        "won": False,
        "score": 0.0,
    }
    for info in env.infos.values():
        assert set(info) == set(DEFAULT_NUMERIC_INFO_FIELDS)
        assert all(isinstance(v, (bool, int, float)) for v in info.values())
    assert env.unwrapped.infos["solver"]["role"] == "solver"  # the text infos are still there


def test_numeric_infos_errors():
    with pytest.raises(ValueError, match=r"fields is empty"):
        NumericInfos(EchoEnv(), {})
    with pytest.raises(
        TypeError, match=r"default of info field 'role' must be a bool, int or float, got str"
    ):
        NumericInfos(EchoEnv(), {"role": "a"})
    env = NumericInfos(EchoEnv(), {"data_source": 0.0})
    env.reset(seed=0)
    with pytest.raises(
        TypeError, match=r"info field 'data_source' of agent 'a' is 'echo', which cannot be cast to float"
    ):
        _ = env.infos
