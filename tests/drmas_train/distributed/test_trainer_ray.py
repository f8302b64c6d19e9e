"""The trainer's pieces through Ray, on one worker group of 2 training ranks + 2 generation workers:
(b) greedy samples and the update match the single-process path; (d) a generation worker killed during a
rollout is restarted and the iteration completes with every ``traj_uid`` exactly once."""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from collections import Counter

import numpy as np
import pytest

from drmas_train.backends.base import SamplingParams
from drmas_train.collect.rollout import rollout
from drmas_train.run.trainer import build_run, compute_advantages
from helpers.tiny_rl import tiny_config, tiny_loader

pytestmark = pytest.mark.slow  # Ray actors start in ~10-30 s on 2 cores (still run in CI)

GREEDY = SamplingParams(temperature=0, max_new_tokens=4)


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    """(single-process run, Ray run with world_size 2) built from the same tiny config."""
    tmp = tmp_path_factory.mktemp("runs")
    local = build_run(tiny_config(tmp / "local"), loader=tiny_loader)
    dist = build_run(tiny_config(tmp / "ray", "distributed.enabled=true", "distributed.world_size.m=2"), loader=tiny_loader)
    yield local, dist
    dist.updater.close()


def _greedy(run, seed=3, pool=None):
    tasks = [run.tasks[i] for i in range(2)]
    return rollout(run.env_fn, tasks, 4, pool or run.pool, GREEDY, seed=seed, max_prompt_tokens=32).samples


def _key(s):
    return (s.uid, s.traj_uid, s.agent_id, s.model_id, s.turn, s.prompt_ids, s.response_ids, s.reward, s.is_action_valid)


def _assert_same(got, want):
    assert [_key(s) for s in got] == [_key(s) for s in want]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.old_logprobs, b.old_logprobs, atol=1e-5)


def test_ray_iteration_matches_single_process(runs):
    from drmas_train.distributed.backend import RayBackend

    local, dist = runs
    backend = dist.pool.backends["m"]
    assert isinstance(backend, RayBackend) and len(backend.group.engines.actors) == 2 and backend.group.world_size == 2
    for it in range(2):  # rollout -> advantages -> update, twice: the 2nd rollout samples the pushed weights
        want, got = _greedy(local, seed=it), _greedy(dist, seed=it)
        assert len(got) == 16
        _assert_same(got, want)
        assert not np.any(compute_advantages(local.cfg, got))  # greedy: a group's rollouts are all equal
        adv = np.random.default_rng(it).normal(size=len(want))  # so update on fixed non-zero advantages
        m_local = local.updater.update(want, adv, it)
        start = time.perf_counter()
        m_dist = dist.updater.update(got, adv, it)
        waited = time.perf_counter() - start
        # the ranks' own seconds: the update inside the slowest rank, then its memory release, both within the wait
        assert 0 < m_dist["dist/m/rank_update_s"] and 0 <= m_dist["dist/m/rank_release_s"]
        assert m_dist["dist/m/rank_update_s"] + m_dist["dist/m/rank_release_s"] < waited
        assert m_dist["loss/m/grad_norm"] == pytest.approx(m_local["loss/m/grad_norm"], rel=1e-4)
        assert m_dist["loss/m/pg_loss"] == pytest.approx(m_local["loss/m/pg_loss"], rel=1e-4, abs=1e-7)
        assert m_dist["loss/m/steps"] == m_local["loss/m/steps"] == 1.0
        for agent in ("a", "b"):  # per-agent health through the ranks: the same numbers as in one process
            for metric in ("grad_norm", "grad_share", "loss_share", "logprob_gap_mean"):
                key = f"agent/{agent}/{metric}"
                assert m_dist[key] == pytest.approx(m_local[key], rel=1e-4, abs=1e-7), key
    assert backend.group.engines.restarts == 0


class _KillOnCall:
    """A pool stand-in whose backend SIGKILLs generation worker ``victim`` just before batched call ``call``."""

    def __init__(self, pool, victim: int, call: int):
        self.pool, self.victim, self.call, self.calls = pool, victim, call, 0
        self.killed_pid = None

    def __getattr__(self, name):
        return getattr(self.pool, name)

    @property
    def backends(self):
        return {mid: self if mid == "m" else b for mid, b in self.pool.backends.items()}

    def generate(self, prompts, sampling, **kwargs):
        backend = self.pool.backends["m"]
        self.calls += 1
        if self.calls == self.call:
            self.killed_pid = backend.group.engines.pids()[self.victim]
            os.kill(self.killed_pid, signal.SIGKILL)
        return backend.generate(prompts, sampling, **kwargs)

    @property
    def tokenizer(self):
        return self.pool.backends["m"].tokenizer


def test_killed_generation_worker_is_restarted_and_calls_reissued(runs, caplog):
    local, dist = runs
    group = dist.pool.backends["m"].group
    restarts, version = group.engines.restarts, group.version
    killer = _KillOnCall(dist.pool, victim=1, call=2)  # the 2nd lock-step call: agent "b" of every episode
    dist.updater.start_iteration(3)
    with caplog.at_level(logging.WARNING, logger="drmas_train.distributed"):
        got = _greedy(dist, seed=11, pool=killer)
    assert killer.killed_pid is not None and group.engines.restarts == restarts + 1 and group.version == version
    # what happened, said once: which worker, when, how many calls it owed (8 calls of agent b over 2 workers)
    said = [r.getMessage() for r in caplog.records if "re-issuing" in r.getMessage()]
    assert len(said) == 1 and re.fullmatch(  # killed mid-call, or restarted before the call reached it: both said
        r"generation worker 1 of model 'm' (died|came back with stale weights) during iteration 3; re-issuing its 4 "
        rf"call\(s\) with the same seed \(restart {restarts + 1} of at most 2\)", said[0]), said
    per_traj = Counter(s.traj_uid for s in got)
    assert len(per_traj) == 8 and set(per_traj.values()) == {2}  # every episode once, each with its a and b call
    assert sorted((s.traj_uid, s.agent_id) for s in got) == sorted({(s.traj_uid, s.agent_id) for s in got})
    _assert_same(got, _greedy(local, seed=11))  # re-issued with the same seed and the current weights
    assert killer.killed_pid not in group.engines.pids()  # worker 1 is a new process
    # the restart and the re-issued calls are in the iteration's metrics
    m = dist.updater.update(got, np.ones(len(got)), 0)
    assert m["dist/m/generation_restarts"] == restarts + 1 and m["dist/m/reissued_calls"] == 4
    assert dist.updater.update(got, np.ones(len(got)), 1)["dist/m/reissued_calls"] == 0  # counted once


def test_dead_training_rank_stops_with_a_clear_error(runs):
    """Runs last in this module: it leaves the group without rank 1 (the fixture then closes it)."""

    from drmas_train.distributed.errors import DistributedError

    local, dist = runs
    group = dist.pool.backends["m"].group
    os.kill(group.rank_pids()[1], signal.SIGKILL)
    samples = _greedy(dist, seed=5)  # generation workers are separate actors: still fine
    with pytest.raises(DistributedError, match=r"(?s)a training rank of model 'm' died during the update; the step is lost\. "
                       r"Resume from the latest complete checkpoint with `drmas train --resume`") as lost:  # fmt: skip
        dist.updater.update(samples, np.ones(len(samples)), 0)
    with pytest.raises(DistributedError, match=r"(?s)died during the update.*; no checkpoint was written yet "
                       r"\(set run.save_every"):  # fmt: skip
        dist.updater.recover(lost.value, None)  # the trainer asks; without a checkpoint there is nothing to rebuild from
