"""Every registered env passes drmas_envs.testing.check_env (PettingZoo API/seed/render/parallel tests,
same-seed determinism, and cross-process determinism under two PYTHONHASHSEED values)."""

from __future__ import annotations

import warnings

import pytest

import drmas_envs
from drmas_envs.testing import check_env, compare_transcripts, cross_process_transcripts, transcript_json


def _shipped(spec: drmas_envs.EnvSpec) -> bool:
    """Registered by drmas itself: test modules also register toy envs (tests/helpers/tiny_rl.py) when they are
    imported, which a fresh interpreter (the cross-process check) never does."""
    ep = spec.entry_point
    module = ep.split(":")[0] if isinstance(ep, str) else getattr(ep, "__module__", "")
    return module.startswith("drmas_envs.")


ENV_IDS = sorted(env_id for env_id, spec in drmas_envs.registry.items() if _shipped(spec))


@pytest.fixture(scope="module")
def other_processes():
    """Transcripts of every env, computed once in two fresh interpreters (PYTHONHASHSEED 1 and 2)."""
    return cross_process_transcripts(ENV_IDS, (1, 2))


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_check_env(env_id, other_processes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # api_test's advice on numpy observations / agent names
        timings = check_env(env_id, cross_process=False)
    assert set(timings) == {"api_test", "seed_test", "render_test", "parallel_api_test", "determinism"}
    compare_transcripts(env_id, transcript_json(env_id), other_processes)


def test_check_env_catches_nondeterminism(monkeypatch):
    from drmas_envs.testing import ConformanceError

    calls = iter(range(100))
    monkeypatch.setattr("drmas_envs.testing.transcript_json", lambda env_id, **kw: f'[["x", {next(calls)}]]')
    with pytest.raises(
        ConformanceError, match=r"math-solver-v0: two envs with the same seeds and actions differ: step 0"
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_env("math-solver-v0", cross_process=False)
    with pytest.raises(ConformanceError, match=r"differs from this process: step 0"):
        compare_transcripts("e", '[["x", 1]]', {1: {"e": '[["x", 2]]'}})
