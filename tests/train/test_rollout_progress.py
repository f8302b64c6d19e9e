"""The rollout's token bar moves during each lock-step generate call (issue 13 item 4): it counts every decoded
token as it is sampled, not finished trajectories."""

from __future__ import annotations

import inspect

import pytest
from backend_fakes import ScriptedBackend
from tiny_rl import ENV_ID, tiny_loader

pytest.importorskip("transformers")

from drmas_train.backends.base import SamplingParams, reports_tokens  # noqa: E402
from drmas_train.backends.hf import HFBackend  # noqa: E402
from drmas_train.collect.rollout import rollout  # noqa: E402
from drmas_train.model.assignment import ModelPool  # noqa: E402


def test_token_bar_moves_within_each_generate_call(monkeypatch):
    import tqdm.auto

    bars = []

    class Recorder:
        def __init__(self, total=None, disable=False, **kwargs):
            self.total, self.disable, self.n, self.updates, self.kwargs = total, disable, 0, 0, kwargs
            bars.append(self)

        def update(self, k):
            self.n, self.updates = self.n + k, self.updates + 1

        def close(self):
            pass

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    from drmas_train.model.models import ModelSpec

    loaded = tiny_loader(ModelSpec("tiny"), "m")
    backend = HFBackend.from_loaded(loaded)
    assert reports_tokens(backend) and not reports_tokens(ScriptedBackend())
    calls = []
    original = backend.generate

    def counting_generate(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    counting_generate.__signature__ = inspect.signature(original)  # still reports tokens
    monkeypatch.setattr(backend, "generate", counting_generate)
    pool = ModelPool({"m": loaded}, {"m": backend}, {"*": "m"})
    result = rollout(ENV_ID, [0, 1], 2, pool, SamplingParams(max_new_tokens=4), seed=0, progress=True)

    traj_bar, token_bar = bars
    assert (traj_bar.kwargs["unit"], token_bar.kwargs["unit"]) == ("traj", "tok")
    assert traj_bar.n == 4 and len(calls) == 2  # one batched call per agent turn (a, then b)
    assert token_bar.n == sum(len(s.response_ids) for s in result.samples)  # every sampled token, EOS included
    assert token_bar.updates > len(calls)  # updated inside the calls, once per decode step
