"""The normalisation matrix (grouping x units x scale, drmas_train/algorithm/grouping.py): golden values computed by
hand from the definitions on one hand-built batch, the properties that tie the cells together, and the config's
checks.

The batch: 2 prompt groups (``p`` with 3 trajectories, ``q`` with 2), 2 agents whose rewards differ (``a`` scores
high, ``b`` low), 1 or 2 calls per agent per trajectory. ``eps=0`` so that the arithmetic is exact; every std is
the n-1 sample std (``unbiased=True``, the default).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from drmas_train.algorithm.advantages import (
    ESTIMATORS,
    drmas,
    gigpo,
    grpo,
    grpo_passk,
    grpo_step,
    per_turn,
    rloo,
    takes_scale,
)
from drmas_train.algorithm.grouping import CELLS, DEFAULT_UNITS, cell, resolve_scale, resolve_units
from drmas_train.algorithm.sample_advantages import sample_advantages
from drmas_train.collect.samples import Sample
from drmas_train.errors import ConfigError
from drmas_train.run.config import load_config

#: row: (uid, traj_uid, agent_id, score)
ROWS = [
    ("p", "t1", "a", 4.0),  # 0
    ("p", "t1", "a", 2.0),  # 1
    ("p", "t1", "b", 0.0),  # 2
    ("p", "t2", "a", 6.0),  # 3
    ("p", "t2", "b", 2.0),  # 4
    ("p", "t2", "b", 0.0),  # 5
    ("p", "t3", "a", 3.0),  # 6
    ("p", "t3", "b", 1.0),  # 7
    ("q", "t4", "a", 1.0),  # 8
    ("q", "t4", "b", 0.0),  # 9
    ("q", "t5", "a", 5.0),  # 10
    ("q", "t5", "b", 4.0),  # 11
    ("q", "t5", "b", 0.0),  # 12
]
UID, TRAJ, AGENT, SCORES = (list(c) for c in zip(*ROWS, strict=True))
SCORES = np.array(SCORES)
KW = dict(uid=UID, agent_id=AGENT, traj_uid=TRAJ, eps=0.0)
R2, R3 = np.sqrt(2.0), np.sqrt(3.0)


def _sd(values: list[float]) -> float:
    """The n-1 sample std of hand-listed values (the batch std's definition)."""
    return float(np.std(values, ddof=1))


# ---- cell (prompt, trajectory) = grpo: a unit is a trajectory, valued at the mean of all its calls.
#   p: t1 = (4+2+0)/3 = 2, t2 = (6+2+0)/3 = 8/3, t3 = (3+1)/2 = 2; mean 20/9; devs -2/9, 4/9, -2/9;
#      var = (4+16+4)/81 / 2 = 4/27, std = 2/(3 sqrt 3).
#   q: t4 = (1+0)/2 = 1/2, t5 = (5+4+0)/3 = 3; mean 7/4; devs -5/4, 5/4; std = (5/2)/sqrt 2.
GLOBAL_TRAJ_DEV = [-2 / 9] * 3 + [4 / 9] * 3 + [-2 / 9] * 2 + [-5 / 4] * 2 + [5 / 4] * 3
GLOBAL_TRAJ_STD = [2 / (3 * R3)] * 8 + [2.5 / R2] * 5
GLOBAL_TRAJ_UNITS = [2, 8 / 3, 2, 1 / 2, 3]
# ---- cell (prompt, call) = grpo_step: a unit is a call, all agents pooled.
#   p: [4,2,0,6,2,0,3,1], mean 18/8 = 2.25; squared devs 3.0625 .0625 5.0625 14.0625 .0625 5.0625 .5625 1.5625
#      = 29.5, var 29.5/7.   q: [1,0,5,4,0], mean 2; squared devs 1 4 9 4 4 = 22, var 22/4.
GLOBAL_CALL_DEV = [4 - 2.25, 2 - 2.25, 0 - 2.25, 6 - 2.25, 2 - 2.25, 0 - 2.25, 3 - 2.25, 1 - 2.25,
                   1 - 2, 0 - 2, 5 - 2, 4 - 2, 0 - 2]  # fmt: skip
GLOBAL_CALL_STD = [np.sqrt(29.5 / 7)] * 8 + [np.sqrt(22 / 4)] * 5
# ---- cell (prompt_agent, call) = drmas: a unit is a call, one group per (prompt, agent).
#   (p,a): [4,2,6,3], mean 3.75, squared devs .0625 3.0625 5.0625 .5625 = 8.75, var 8.75/3.
#   (p,b): [0,2,0,1], mean .75, squared devs .5625 1.5625 .5625 .0625 = 2.75, var 2.75/3.
#   (q,a): [1,5], mean 3, std 4/sqrt 2.   (q,b): [0,4,0], mean 4/3, var (16+64+16)/9 / 2 = 16/3, std 4/sqrt 3.
AGENT_CALL_DEV = [4 - 3.75, 2 - 3.75, 0 - 0.75, 6 - 3.75, 2 - 0.75, 0 - 0.75, 3 - 3.75, 1 - 0.75,
                  1 - 3, 0 - 4 / 3, 5 - 3, 4 - 4 / 3, 0 - 4 / 3]  # fmt: skip
PA, PB = np.sqrt(8.75 / 3), np.sqrt(2.75 / 3)
AGENT_CALL_STD = [PA, PA, PB, PA, PB, PB, PA, PB, 4 / R2, 4 / R3, 4 / R2, 4 / R3, 4 / R3]
# ---- cell (prompt_agent, trajectory), the new one: a unit is one agent's calls in one trajectory, averaged.
#   (p,a): t1 (4+2)/2 = 3, t2 6, t3 3; mean 4; devs -1, 2, -1; var (1+4+1)/2 = 3, std sqrt 3.
#   (p,b): t1 0, t2 (2+0)/2 = 1, t3 1; mean 2/3; devs -2/3, 1/3, 1/3; var (4+1+1)/9 / 2 = 1/3, std 1/sqrt 3.
#   (q,a): t4 1, t5 5; mean 3; devs -2, 2; std 4/sqrt 2.   (q,b): t4 0, t5 (4+0)/2 = 2; mean 1; std 2/sqrt 2.
AGENT_TRAJ_DEV = [-1, -1, -2 / 3, 2, 1 / 3, 1 / 3, -1, 1 / 3, -2, -1, 2, 1, 1]
AGENT_TRAJ_STD = [R3, R3, 1 / R3, R3, 1 / R3, 1 / R3, R3, 1 / R3, 4 / R2, 2 / R2, 4 / R2, 2 / R2, 2 / R2]
AGENT_TRAJ_UNITS = [3, 6, 3, 0, 1, 1, 1, 5, 0, 2]

#: (grouping, units) -> (deviation from the group mean, group std, the batch's unit values) per row
CELL_TABLES = {
    ("prompt", "trajectory"): (GLOBAL_TRAJ_DEV, GLOBAL_TRAJ_STD, GLOBAL_TRAJ_UNITS),
    ("prompt", "call"): (GLOBAL_CALL_DEV, GLOBAL_CALL_STD, list(SCORES)),
    ("prompt_agent", "call"): (AGENT_CALL_DEV, AGENT_CALL_STD, list(SCORES)),
    ("prompt_agent", "trajectory"): (AGENT_TRAJ_DEV, AGENT_TRAJ_STD, AGENT_TRAJ_UNITS),
}


def _expected(grouping: str, units: str, scale: str) -> np.ndarray:
    dev, std, unit_values = (np.asarray(x, dtype=np.float64) for x in CELL_TABLES[(grouping, units)])
    if scale == "std":
        return dev / std
    if scale == "mean":
        return dev
    return dev / _sd(list(unit_values))  # batch_std: every unit of the batch, both prompts and both agents


@pytest.mark.parametrize("scale", ["std", "mean", "batch_std"])
@pytest.mark.parametrize(("grouping", "units"), list(CELL_TABLES))
def test_each_cell_and_scale_gives_the_hand_computed_advantages(grouping, units, scale):
    adv = grpo(SCORES, **KW, grouping=grouping, units=units, scale=scale)
    np.testing.assert_allclose(adv, _expected(grouping, units, scale), rtol=1e-12, atol=1e-12)


def test_closed_forms_of_the_new_cell_and_the_batch_std():
    adv = grpo(SCORES, **KW, grouping="prompt_agent", units="trajectory")
    # (p,a): -1/sqrt3 for t1's two calls of a, 2/sqrt3 for t2's; (p,b): (-2/3) sqrt3 for t1's call of b
    np.testing.assert_allclose(adv[[0, 1, 3, 2]], [-1 / R3, -1 / R3, 2 / R3, -2 / R3], rtol=1e-12)
    np.testing.assert_allclose(adv[[8, 10, 9, 11, 12]], [-1 / R2, 1 / R2, -1 / R2, 1 / R2, 1 / R2], rtol=1e-12)
    # the batch std of the 10 (trajectory, agent) units: sum 22, mean 2.2, sum of squares 86, var (86 - 48.4) / 9
    batch = grpo(SCORES, **KW, grouping="prompt_agent", units="trajectory", scale="batch_std")
    np.testing.assert_allclose(batch[3], 2 / np.sqrt(37.6 / 9), rtol=1e-12)
    # drmas's batch std over the 13 calls: sum 28, sum of squares 112, var (112 - 28**2/13) / 12 = 56/13
    np.testing.assert_allclose(drmas(SCORES, **KW, scale="batch_std")[3], 2.25 / np.sqrt(56 / 13), rtol=1e-12)


def test_the_existing_estimators_are_points_of_the_matrix():
    for scale in ("std", "mean", "batch_std"):
        same = dict(KW, scale=scale)
        np.testing.assert_array_equal(grpo(SCORES, **same), grpo(SCORES, **same, grouping="prompt", units="trajectory"))
        np.testing.assert_array_equal(grpo_step(SCORES, **same), grpo(SCORES, **same, grouping="prompt", units="call"))
        np.testing.assert_array_equal(grpo_step(SCORES, **same), grpo(SCORES, **same, grouping="prompt_call"))
        np.testing.assert_array_equal(drmas(SCORES, **same), grpo(SCORES, **same, grouping="prompt_agent", units="call"))
    # scale=None keeps each estimator's old default: std, or mean under norm_by_std=False (Dr. GRPO's advantage)
    for fn in (grpo, drmas, grpo_step):
        np.testing.assert_array_equal(fn(SCORES, **KW), fn(SCORES, **KW, scale="std"))
        np.testing.assert_array_equal(fn(SCORES, **KW, norm_by_std=False), fn(SCORES, **KW, scale="mean"))
        np.testing.assert_array_equal(fn(SCORES, **KW, norm_by_std=False, scale="mean"), fn(SCORES, **KW, scale="mean"))
    assert {name for name in ESTIMATORS if takes_scale(name)} == {"grpo", "drmas", "grpo_step", "per_turn",
                                                                   "grpo_passk", "gigpo"}  # fmt: skip


def _random_batch(rng, *, agents, calls_per_agent, n_prompts=3, g=4):
    uid, traj, agent, turn = [], [], [], []
    for p in range(n_prompts):
        for t in range(g):
            for a in agents:
                for c in range(int(rng.integers(1, calls_per_agent + 1))):
                    uid.append(f"p{p}"), traj.append(f"p{p}t{t}"), agent.append(a), turn.append(c)
    scores = rng.normal(size=len(uid)) + np.array([3.0 * agents.index(a) for a in agent])
    return scores, dict(uid=uid, agent_id=agent, traj_uid=traj, turn=turn)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("scale", ["std", "mean", "batch_std"])
def test_with_one_agent_per_agent_grouping_is_global_grouping(seed, scale):
    scores, cols = _random_batch(np.random.default_rng(seed), agents=["solo"], calls_per_agent=3)
    for units in ("trajectory", "call"):
        np.testing.assert_allclose(grpo(scores, **cols, grouping="prompt_agent", units=units, scale=scale),
                                   grpo(scores, **cols, grouping="prompt", units=units, scale=scale), rtol=1e-12)  # fmt: skip


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("scale", ["std", "mean", "batch_std"])
def test_with_one_call_per_agent_per_trajectory_the_new_cell_is_drmas(seed, scale):
    scores, cols = _random_batch(np.random.default_rng(seed), agents=["solver", "verifier"], calls_per_agent=1)
    np.testing.assert_allclose(grpo(scores, **cols, grouping="prompt_agent", units="trajectory", scale=scale),
                               drmas(scores, **cols, scale=scale), rtol=1e-12)  # fmt: skip
    # ... and the new cell differs from drmas as soon as one agent calls twice in a trajectory (the hand-built batch)
    assert not np.allclose(grpo(SCORES, **KW, grouping="prompt_agent", units="trajectory"), drmas(SCORES, **KW))


@pytest.mark.parametrize("unbiased", [True, False])
def test_batch_std_on_one_group_is_the_group_std(unbiased):
    """One prompt group under a global grouping: the batch is the group, so ``batch_std`` equals ``std`` exactly,
    both stds taking the same n-1 (or n) convention from ``unbiased`` (ROLL's ``torch.std`` is n-1 for both)."""
    scores, cols = _random_batch(np.random.default_rng(3), agents=["a", "b"], calls_per_agent=2, n_prompts=1)
    for units in ("trajectory", "call"):
        same = dict(cols, grouping="prompt", units=units, unbiased=unbiased)
        np.testing.assert_allclose(grpo(scores, **same, scale="batch_std"), grpo(scores, **same, scale="std"), rtol=1e-12)
    # per agent, the batch std pools both agents, so it is not either agent's std: b's rewards sit 3 higher
    per_agent = dict(cols, grouping="prompt_agent", unbiased=unbiased)
    assert not np.allclose(grpo(scores, **per_agent, scale="batch_std"), grpo(scores, **per_agent, scale="std"))


def test_batch_std_singletons_and_constant_batches():
    # a group of one unit keeps the reference's mean 0 (singleton="raw"), divided by the batch std
    adv = grpo([1.0, 3.0, 5.0], uid=["x", "y", "y"], agent_id=["a"] * 3, traj_uid=["1", "2", "3"], eps=0.0,
               scale="batch_std")  # fmt: skip
    np.testing.assert_allclose(adv, [1 / 2, -1 / 2, 1 / 2])  # batch [1, 3, 5]: std 2
    # a constant batch: every group constant, 0; a raw singleton keeps v / (1 + eps) (its std 1)
    np.testing.assert_array_equal(grpo([2.0, 2.0, 2.0], uid=["x", "y", "y"], agent_id=["a"] * 3,
                                       traj_uid=["1", "2", "3"], scale="batch_std"), [2.0 / (1 + 1e-6), 0.0, 0.0])  # fmt: skip


def test_other_estimators_take_the_units_and_scales():
    # RLOO per agent over trajectory units: (p,a) units 3, 6, 3 -> (v - 4) * 3/2
    np.testing.assert_allclose(rloo(SCORES, **KW, grouping="prompt_agent", units="trajectory")[[0, 3, 6]],
                               [-1.5, 3.0, -1.5])  # fmt: skip
    # pass@k: only the best unit moves, by (best - second) / scale's divisor; (p,a) trajectory units 3, 6, 3
    passk = grpo_passk(SCORES, **KW, grouping="prompt_agent", units="trajectory", scale="batch_std")
    np.testing.assert_allclose(passk[3], (6 - 3) / _sd(AGENT_TRAJ_UNITS), rtol=1e-12)
    assert passk[[0, 1, 6]].tolist() == [0.0, 0.0, 0.0]
    # GiGPO's episode term is grpo under the same cell and scale (all anchors distinct: the step term is 0)
    anchor = [str(i) for i in range(len(SCORES))]
    np.testing.assert_allclose(
        gigpo(SCORES, **KW, grouping="prompt_agent", units="trajectory", scale="mean", anchor=anchor),
        _expected("prompt_agent", "trajectory", "mean"), rtol=1e-12)  # fmt: skip


def test_the_axes_tables():
    assert CELLS == {(False, "trajectory"): ("prompt", "trajectory"), (False, "call"): ("prompt", "call"),
                     (True, "trajectory"): ("prompt_agent", "trajectory"), (True, "call"): ("prompt_agent", "call")}  # fmt: skip
    assert all(cell(*CELLS[key]) == key for key in CELLS)
    assert DEFAULT_UNITS == {"prompt": "trajectory", "prompt_call": "call", "prompt_agent": "call",
                             "prompt_agent_turn": "call"}  # fmt: skip
    assert cell("prompt_call") == (False, "call") and cell("prompt_agent_turn") == (True, "call")
    assert [resolve_scale(None, True), resolve_scale(None, False), resolve_scale("batch_std", True)] == [
        "std", "mean", "batch_std"]  # fmt: skip


def test_bad_units_and_scales_are_errors_that_list_the_accepted_values():
    with pytest.raises(ValueError, match=re.escape("units must be one of ['call'] or None (the grouping's own, 'call') "
                                                   "under grouping 'prompt_call', got 'trajectory'")):  # fmt: skip
        grpo_step(SCORES, **KW, units="trajectory")
    with pytest.raises(ValueError, match=re.escape("units must be one of ['trajectory', 'call'] or None (the "
                                                   "grouping's own, 'call') under grouping 'prompt_agent', got 'turn'")):  # fmt: skip
        resolve_units("prompt_agent", "turn")
    with pytest.raises(ValueError, match=re.escape("scale must be one of ['std', 'mean', 'batch_std'], got 'none'")):
        drmas(SCORES, **KW, scale="none")
    with pytest.raises(ValueError, match=re.escape("norm_by_std=False means scale='mean', but scale='batch_std'; set "
                                                   "only the scale")):  # fmt: skip
        drmas(SCORES, **KW, norm_by_std=False, scale="batch_std")
    with pytest.raises(ValueError, match=re.escape("grouping 'prompt_agent' with units 'trajectory' needs 'traj_uid' "
                                                   "(a (B,) column), got None")):  # fmt: skip
        drmas(SCORES, uid=UID, agent_id=AGENT, units="trajectory")
    with pytest.raises(ValueError, match=re.escape("under grouping 'prompt_agent_turn', got 'trajectory'")):
        per_turn(SCORES, **KW, turn=[0] * len(SCORES), units="trajectory")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.units=traj"], "algorithm.units='traj'; accepted: null (the grouping's own), trajectory, call"),
        (["algorithm.estimator=grpo_step", "algorithm.units=trajectory"],
         "algorithm.units='trajectory' with grouping 'prompt_call': a trajectory holds one call per unit of that "
         "grouping; accepted: null, call"),
        (["algorithm.estimator=reinforce_pp", "algorithm.units=call"],
         "algorithm.units='call': reinforce_pp has no group baseline; accepted: null"),
        (["algorithm.scale=batch"],
         "algorithm.scale='batch'; accepted: null (std, or mean with norm_by_std: false), std, mean, batch_std"),
        (["algorithm.estimator=rloo", "algorithm.scale=mean"],
         "algorithm.scale='mean': rloo divides by no std; accepted: null"),
        (["algorithm.norm_by_std=false", "algorithm.scale=std"],
         "algorithm.scale='std' with algorithm.norm_by_std=false (the older spelling of scale=mean): they contradict "
         "each other; drop norm_by_std, or set scale: mean"),
    ],
)  # fmt: skip
def test_config_rejects_bad_matrix_settings_naming_the_path(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("quickstart_math", overrides)


def test_the_config_reaches_the_estimator_through_the_sample_adapter():
    samples = [Sample(uid, traj, agent, "m", k, 0, [1], [2], [0.0], [1], reward=r, score=r)
               for k, (uid, traj, agent, r) in enumerate(ROWS)]  # fmt: skip
    cfg = load_config("quickstart_math_cell_agent_traj_batchstd", ["algorithm.eps=0"])
    np.testing.assert_allclose(sample_advantages(samples, cfg.algorithm),
                               _expected("prompt_agent", "trajectory", "batch_std"), rtol=1e-12)  # fmt: skip
    cfg = load_config("quickstart_math_cell_agent_call_mean")
    np.testing.assert_allclose(sample_advantages(samples, cfg.algorithm), AGENT_CALL_DEV, rtol=1e-12)


def test_config_accepts_every_arm_of_the_study():
    for grouping in ("prompt", "prompt_agent"):
        for units in ("trajectory", "call"):
            for scale in ("std", "mean", "batch_std"):
                a = load_config("quickstart_math", [f"algorithm.grouping={grouping}", f"algorithm.units={units}",
                                                    f"algorithm.scale={scale}"]).algorithm  # fmt: skip
                assert (a.grouping, a.units, a.scale) == (grouping, units, scale)
    legacy = load_config("quickstart_math_dr_grpo").algorithm  # norm_by_std: false, the older spelling of scale=mean
    assert (legacy.norm_by_std, legacy.scale, resolve_scale(legacy.scale, legacy.norm_by_std)) == (False, None, "mean")
