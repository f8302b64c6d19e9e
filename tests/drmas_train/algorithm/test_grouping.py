"""The grouping axis: group keys of each grouping, the identities that make the old estimator names groupings of
GRPO, the sample adapter (columns built from Samples) and ReMax's greedy rollout."""

from __future__ import annotations

import numpy as np
import pytest

from drmas_train.algorithm.advantages import (
    DEFAULT_GROUPING,
    ESTIMATORS,
    drmas,
    get_estimator,
    gigpo,
    grpo,
    grpo_step,
    needs_greedy_baseline,
    per_turn,
    reinforce_pp,
    reinforce_pp_baseline,
    remax,
    rloo,
)
from drmas_train.algorithm.grouping import GROUPINGS, units
from drmas_train.algorithm.sample_advantages import sample_advantages
from drmas_train.backends.base import SamplingParams
from drmas_train.collect.greedy_rollout import greedy_rollout
from drmas_train.collect.rollout import rollout
from drmas_train.collect.samples import Sample, observation_key
from drmas_train.model.assignment import ModelPool
from drmas_train.run.config import load_config
from helpers.backend_fakes import ScriptedBackend
from helpers.tiny_rl import ENV_ID

# Two agents, two turns each: prompt "q" with two rollouts (t0: four calls; t1: solver and verifier once) and prompt
# "p" with one rollout (solver twice, verifier once). Columns: uid, traj_uid, agent_id, agent_turn.
BATCH = [
    ("q", "t0", "solver", 0),
    ("q", "t0", "verifier", 0),
    ("q", "t0", "solver", 1),
    ("q", "t0", "verifier", 1),
    ("q", "t1", "solver", 0),
    ("q", "t1", "verifier", 0),
    ("p", "t2", "solver", 0),
    ("p", "t2", "verifier", 0),
    ("p", "t2", "solver", 1),
]
UID, TRAJ, AGENT, TURN = (list(c) for c in zip(*BATCH, strict=True))
KW = dict(uid=UID, agent_id=AGENT, traj_uid=TRAJ, turn=TURN)


def partition(labels) -> set[frozenset[int]]:
    """Rows grouped by equal label."""
    out: dict = {}
    for i, label in enumerate(labels):
        out.setdefault(label, set()).add(i)
    return {frozenset(v) for v in out.values()}


@pytest.mark.parametrize(
    ("grouping", "groups", "unit_rows"),
    [
        ("prompt", [{0, 1, 2, 3, 4, 5}, {6, 7, 8}], [{0, 1, 2, 3}, {4, 5}, {6, 7, 8}]),
        ("prompt_call", [{0, 1, 2, 3, 4, 5}, {6, 7, 8}], [{i} for i in range(9)]),
        ("prompt_agent", [{0, 2, 4}, {1, 3, 5}, {6, 8}, {7}], [{i} for i in range(9)]),
        ("prompt_agent_turn", [{0, 4}, {2}, {1, 5}, {3}, {6}, {8}, {7}], [{i} for i in range(9)]),
    ],
)  # fmt: skip
def test_each_grouping_gives_the_expected_group_keys(grouping, groups, unit_rows):
    u = units(grouping, np.arange(9.0), np.ones(9, dtype=bool), **KW)
    assert partition(u.row_unit) == {frozenset(r) for r in unit_rows}
    assert partition(u.group[u.row_unit]) == {frozenset(g) for g in groups}
    if grouping == "prompt":  # a trajectory's value is the mean of its calls' scores
        np.testing.assert_allclose(sorted(u.value), [1.5, 4.5, 7.0])


def test_unknown_grouping_and_missing_columns_are_errors():
    with pytest.raises(ValueError, match=r"grouping must be one of \['prompt', 'prompt_call', 'prompt_agent', "
                                         r"'prompt_agent_turn'\] or None \(the estimator's default\), got 'agent'"):  # fmt: skip
        rloo(np.zeros(9), **KW | {"grouping": "agent"})
    with pytest.raises(ValueError, match=r"grouping 'prompt_agent_turn' needs 'turn'"):
        grpo(np.zeros(9), uid=UID, agent_id=AGENT, traj_uid=TRAJ, grouping="prompt_agent_turn")
    with pytest.raises(
        ValueError, match=r"reinforce_pp has no group baseline: grouping must be None, got 'prompt'"
    ):
        reinforce_pp(np.zeros(9), **KW, grouping="prompt")


def test_old_names_are_grpo_under_a_grouping():
    rng = np.random.default_rng(7)
    n = 200
    s = rng.choice([0.0, 1.0, 0.9, -0.1, 0.5], n)
    kw = dict(uid=rng.integers(0, 8, n), agent_id=rng.choice(["a", "b", "c"], n), traj_uid=rng.integers(0, 30, n),
              turn=rng.integers(0, 3, n))  # fmt: skip
    for name, grouping in (
        ("drmas", "prompt_agent"),
        ("grpo_step", "prompt_call"),
        ("per_turn", "prompt_agent_turn"),
    ):
        assert DEFAULT_GROUPING[name] == grouping
        for singleton in ("raw", "zero"):
            np.testing.assert_array_equal(get_estimator(name)(s, **kw, singleton=singleton),
                                          grpo(s, **kw, grouping=grouping, singleton=singleton))  # fmt: skip
    np.testing.assert_array_equal(drmas(s, **kw, grouping="prompt"), grpo(s, **kw))
    np.testing.assert_array_equal(grpo_step(s, **kw, grouping="prompt_agent"), drmas(s, **kw))
    np.testing.assert_array_equal(per_turn(s, **kw, grouping="prompt_agent"), drmas(s, **kw))
    # one setting away: RLOO and REINFORCE++-baseline per agent differ from their per-prompt defaults
    assert not np.allclose(rloo(s, **kw, grouping="prompt_agent"), rloo(s, **kw))
    assert not np.allclose(
        reinforce_pp_baseline(s, **kw, grouping="prompt_agent"), reinforce_pp_baseline(s, **kw)
    )


def test_rloo_per_agent_golden():
    # prompt "q", solver calls (rows 0, 2, 4) score 1, 0, 0; verifier calls (1, 3, 5) 1, 1, 0; prompt "p" 0.5 each
    s = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5])
    a = rloo(s, **KW, grouping="prompt_agent")
    # leave-one-out: solver row 0: 1 - (0 + 0) / 2 = 1; row 2: 0 - (1 + 0) / 2 = -0.5; verifier row 5: 0 - 1 = -1;
    # p: solver pair (0.5, 0.5) constant -> 0; the lone verifier call keeps its score (raw rule)
    np.testing.assert_allclose(a, [1.0, 0.5, -0.5, 0.5, -0.5, -1.0, 0.0, 0.5, 0.0], atol=1e-12)
    np.testing.assert_allclose(rloo(s, **KW, grouping="prompt_agent", singleton="zero")[7], 0.0)


def _samples(rows, rewards, *, lengths=None, anchors=None):
    out = []
    for k, ((uid, traj, agent, agent_turn), r) in enumerate(zip(rows, rewards, strict=True)):
        n = 1 if lengths is None else lengths[k]
        s = Sample(uid, traj, agent, "m", k, agent_turn, [1], [2] * n, [0.0] * n, [1] * n, reward=r, score=r)
        s.anchor_key = "" if anchors is None else anchors[k]
        out.append(s)
    return out


def test_sample_adapter_builds_each_estimators_columns():
    s = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5]
    lengths = [1, 3, 2, 5, 1, 1, 4, 2, 2]
    samples = _samples(BATCH, s, lengths=lengths, anchors=[f"o{i % 2}" for i in range(9)])
    cfg = load_config(
        "quickstart_math", ["algorithm.estimator=reinforce_pp_baseline", "algorithm.grouping=prompt_agent"]
    )
    np.testing.assert_array_equal(sample_advantages(samples, cfg.algorithm),
                                  reinforce_pp_baseline(s, **KW, grouping="prompt_agent", token_count=lengths))  # fmt: skip
    cfg = load_config("quickstart_math", ["algorithm.estimator=gigpo", "algorithm.gigpo_step_weight=0.5"])
    np.testing.assert_array_equal(sample_advantages(samples, cfg.algorithm),
                                  gigpo(s, **KW, anchor=[f"o{i % 2}" for i in range(9)], step_weight=0.5))  # fmt: skip
    with pytest.raises(
        ValueError, match=r"gigpo needs each call's anchor state, but 9 sample\(s\) have no anchor_key"
    ):
        sample_advantages(_samples(BATCH, s), cfg.algorithm)
    cfg = load_config("quickstart_math", ["algorithm.estimator=remax"])
    with pytest.raises(ValueError, match="remax needs the greedy rollout's samples"):
        sample_advantages(samples, cfg.algorithm)
    assert needs_greedy_baseline("remax") and not any(
        needs_greedy_baseline(n) for n in set(ESTIMATORS) - {"remax"}
    )


class _TemperatureBackend(ScriptedBackend):
    """Greedy (temperature 0) calls say the target letter "k"; sampled calls say "a b"."""

    def __init__(self):
        super().__init__(lambda messages, call, row: "a b")
        self.temperatures: list[float] = []

    def generate(self, prompts, sampling, **kwargs):
        self.temperatures.append(sampling.temperature)
        if sampling.temperature == 0:
            self.reply = lambda messages, call, row: "k k"
        else:
            self.reply = lambda messages, call, row: "a b"
        return super().generate(prompts, sampling, **kwargs)


def test_remax_greedy_rollout_from_the_rollout_engine():
    backend = _TemperatureBackend()
    pool = ModelPool({"m": None}, {"m": backend}, {"*": "m"})  # type: ignore[arg-type]
    sampling = SamplingParams(temperature=0.7, max_new_tokens=4)
    sampled = rollout(ENV_ID, [0, 1, 2], 3, pool, sampling, seed=4, progress=False)
    greedy = greedy_rollout(ENV_ID, [0, 1, 2], pool, sampling, sampled, seed=4, progress=False)
    assert set(backend.temperatures) == {0.7, 0.0}
    assert [t.uid for t in greedy.trajectories] == list(dict.fromkeys(t.uid for t in sampled.trajectories))
    assert {s.traj_uid for s in greedy.samples} == {f"{t.uid}/greedy" for t in greedy.trajectories}
    assert len(greedy.samples) == 3 * 2  # one episode per task, agents a and b
    # each greedy episode: 4 "k" of 8 reply tokens (valid); each sampled one: none (both calls invalid, -0.05)
    assert {s.reward for s in greedy.samples} == {0.5} and {s.reward for s in sampled.samples} == {-0.05}
    cfg = load_config("quickstart_math", ["algorithm.estimator=remax"])
    adv = sample_advantages(sampled.samples, cfg.algorithm, greedy=greedy.samples)
    np.testing.assert_allclose(adv, -0.55)  # A = v - b = -0.05 - 0.5
    np.testing.assert_allclose(remax([1.0, 0.0], uid=["u", "u"], agent_id=["a", "a"], traj_uid=["t", "s"],
                                     baseline=[0.25, 0.25]), [0.75, -0.25])  # fmt: skip


def test_rollout_records_the_anchor_state_of_each_call():
    pool = ModelPool(
        {"m": None}, {"m": ScriptedBackend(lambda messages, call, row: f"r{row % 2}")}, {"*": "m"}
    )  # type: ignore[arg-type]
    result = rollout(ENV_ID, [0, 1], 3, pool, SamplingParams(max_new_tokens=4), seed=1, progress=False)
    for s in result.samples:
        assert len(s.anchor_key) == 32
    first = {}
    for s in result.samples:
        if (
            s.agent_id == "a"
        ):  # the first call of every rollout sees the task only: one anchor per prompt group
            first.setdefault(s.uid, set()).add(s.anchor_key)
    assert all(len(keys) == 1 for keys in first.values()) and len({k for v in first.values() for k in v}) == 2
    assert observation_key("a b") == observation_key("a b") != observation_key("a c")


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_estimator_has_a_default_grouping_entry(name):
    assert DEFAULT_GROUPING[name] in (*GROUPINGS, None)
    assert (DEFAULT_GROUPING[name] is None) == (name in ("reinforce_pp", "gae"))
