"""Registry: lookups, errors (pinned messages), unversioned ids, kwargs, pettingzoo mirror, pprint."""

from __future__ import annotations

import re

import pytest

import drmas_envs
from drmas_envs.registration import (
    AlreadyRegisteredError,
    InvalidEnvIdError,
    NameNotFoundError,
    UnknownKwargError,
    VersionNotFoundError,
    get_env_id,
    parse_env_id,
)


def test_builtin_math_envs_are_registered():
    for env_id in ("math-solver-v0", "math-solver-verifier-v0", "math-generator-verifier-refiner-v0"):
        assert env_id in drmas_envs.registry


@pytest.mark.parametrize(
    ("env_id", "parts"),
    [
        ("math-solver-v0", (None, "math-solver", 0)),
        ("drmas/search-r1-v12", ("drmas", "search-r1", 12)),
        ("x", (None, "x", None)),
    ],
)
def test_parse_env_id_round_trips(env_id, parts):
    assert parse_env_id(env_id) == parts
    assert get_env_id(*parts) == env_id


def test_unknown_id_names_closest():
    with pytest.raises(
        NameNotFoundError,
        match=re.escape(
            "no env named 'math-solver-verifer' is registered. Did you mean: math-solver-verifier-v0"
        ),
    ):
        drmas_envs.make("math-solver-verifer-v0")


def test_malformed_id():
    with pytest.raises(
        InvalidEnvIdError, match=re.escape("malformed env id 'Math Solver': expected '[namespace/]name-vN'")
    ):
        drmas_envs.make("Math Solver")


def test_unknown_version_lists_known():
    with pytest.raises(
        VersionNotFoundError,
        match=re.escape("env 'math-solver-v7' has no version v7; registered versions: math-solver-v0"),
    ):
        drmas_envs.make("math-solver-v7")


def test_unknown_kwarg_suggests():
    with pytest.raises(
        UnknownKwargError,
        match=re.escape(
            "env 'math-solver-verifier-v0' got an unknown keyword argument 'max_loop'. Did you mean 'max_loops'?"
        ),
    ):
        drmas_envs.make("math-solver-verifier-v0", max_loop=3)


def test_unversioned_resolves_to_latest_and_kwargs_override():
    spec = drmas_envs.spec("math-solver-verifier")
    assert spec.id == "math-solver-verifier-v0"
    drmas_envs.register("math-solver-verifier-v9", "drmas_envs.math.solver_verifier:env", max_loops=4)
    try:
        assert drmas_envs.spec("math-solver-verifier").id == "math-solver-verifier-v9"
        env = drmas_envs.make("math-solver-verifier", size=3)
        assert (env.unwrapped.max_loops, len(env.unwrapped.tasks), env.spec.id) == (
            4,
            3,
            "math-solver-verifier-v9",
        )
        assert drmas_envs.make("math-solver-verifier-v9", max_loops=1, size=3).unwrapped.max_loops == 1
        with pytest.raises(
            AlreadyRegisteredError, match="env id 'math-solver-verifier-v9' is already registered"
        ):
            drmas_envs.register("math-solver-verifier-v9", "drmas_envs.math.solver_verifier:env")
    finally:
        del drmas_envs.registry["math-solver-verifier-v9"]


def test_bad_constructor_value_is_a_clear_error():
    with pytest.raises(ValueError, match="max_loops must be an int >= 1, got 0"):
        drmas_envs.make("math-solver-verifier-v0", max_loops=0)


def test_pettingzoo_mirror_under_drmas_namespace():
    registration = pytest.importorskip("pettingzoo.env_registry.registration")
    for env_id, env_spec in drmas_envs.registry.items():
        # an id with its own namespace keeps it (PettingZoo's ids have one namespace at most)
        assert (env_id if env_spec.namespace else f"drmas/{env_id}") in registration.aec_registry
    assert "openspiel/kuhn_poker-v0" in registration.aec_registry
    env = registration.make("aec", "drmas/math-solver-v0", size=2)
    env.reset(seed=0)
    assert env.agents == ["solver"]


def test_pprint_registry_lists_every_id():
    text = drmas_envs.pprint_registry(print_output=False)
    assert all(env_id in text for env_id in drmas_envs.registry)


def test_drmas_envs_command_prints_the_registry(capsys):
    from drmas_train.cli import main

    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("===== (default) =====\n") and "math-solver-verifier-v0\n" in out
    assert main(["envs", "--verbose"]) == 0
    assert "entry_point=drmas_envs.math.solver_verifier:env" in capsys.readouterr().out
