"""The shared constructor of the search envs (drmas_envs.search.base): one set of data arguments, checked once."""

from __future__ import annotations

import inspect

import pytest

import drmas_envs
from drmas_envs.registration import UnknownKwargError
from drmas_envs.search.orchestrator import SearchOrchestratorEnv
from drmas_envs.search.search_r1 import SearchR1Env

SHARED = ["corpus", "retriever", "retriever_kwargs", "synthetic", "topk", "max_action_chars", "prompts", "render_mode"]


def test_signatures_list_own_then_shared_arguments_with_own_defaults():
    orch = inspect.signature(SearchOrchestratorEnv).parameters
    r1 = inspect.signature(SearchR1Env).parameters
    fidelity_options = ["missing_verdict", "last_step_no", "answer_without_tag", "require_think", "reject_cjk",
                        "information_format", "termination", "retrieval_failure"]  # fmt: skip
    assert list(orch) == ["tasks", "max_steps", "history_length", "format_penalty", *fidelity_options, "worked_examples",
                          *SHARED]  # fmt: skip
    assert orch["worked_examples"].default is None  # no example turns: the reference's context
    assert list(r1) == ["tasks", "max_turns", "format_penalty", *SHARED]
    assert (orch["format_penalty"].default, r1["format_penalty"].default, r1["topk"].default) == (0.01, 0.0, 3)


def test_registry_names_an_argument_of_the_other_search_env():
    with pytest.raises(UnknownKwargError, match="env 'search-r1-v0' got an unknown keyword argument 'history_length'"):
        drmas_envs.make("search-r1-v0", history_length=2)


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (SearchR1Env, {"topk": 0}, "topk must be an int >= 1, got 0"),
        (SearchOrchestratorEnv, {"max_action_chars": True}, "max_action_chars must be an int >= 1, got True"),
        (SearchOrchestratorEnv, {"history_length": -1}, "history_length must be an int >= 0, got -1"),
        (SearchR1Env, {"prompts": {"nope": "x"}}, r"unknown prompt keys \['nope'\]"),
    ],
)
def test_shared_and_own_arguments_are_checked(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)
