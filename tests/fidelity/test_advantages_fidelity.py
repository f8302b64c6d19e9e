"""Advantage estimators against the Dr. MAS reference's GRPO (``langfengQ/DrMAS verl/trainer/ppo/core_algos.py:497-569``).

``reference_grpo`` below is that function transcribed line by line in plain Python (no torch): trajectory
averaging unless ``group_by_agent_id`` (:538-550), a group of one gets mean 0 and std 1 (:553-555), otherwise the
mean and the unbiased std (``torch.std``, :557-559), then ``(s - mean) / (std + eps)`` or ``s - mean``
(:562-566). With ``group_by_agent_id`` the group key is ``f"{uid}_{agent_id}"`` (``verl/trainer/ppo/ray_trainer.py:269-271``).
"""

import statistics
from collections import defaultdict

import numpy as np
import pytest

from drmas_train.algorithm.advantages import drmas, grpo, grpo_step

EPS = 1e-6

# Search episodes of two prompts. "q1": G = 3 rollouts, the Verifier said "no" in one of them only, so the
# (q1, search) group holds one call (the lone Search call of the worked example in drmas_train/algorithm/advantages.py).
# "q2": G = 1 (a whole prompt group of one trajectory). Columns: uid, traj_uid, agent_id, score.
TABLE = [
    ("q1", "t1", "verifier", 1.0),
    ("q1", "t1", "search", 1.0),
    ("q1", "t1", "verifier", 1.0),
    ("q1", "t1", "answer", 1.0),
    ("q1", "t2", "verifier", 0.0),
    ("q1", "t2", "answer", 0.0),
    ("q1", "t3", "verifier", 1.0),
    ("q1", "t3", "answer", 0.99),  # invalid call (no <think>): R - 0.01
    ("q2", "t4", "verifier", 0.0),
    ("q2", "t4", "answer", -0.01),
]


def reference_grpo(scores, index, traj_index, *, group_by_agent_id, norm=True, epsilon=EPS):
    """core_algos.py:529-569, transcribed (``index`` is already the uid or ``uid_agent`` key)."""
    scores = list(scores)
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    traj_accumulator, traj2avg = defaultdict(list), {}
    for i in range(len(scores)):
        traj_accumulator[(index[i], traj_index[i])].append(scores[i])
    for (idx, t_idx), reward_list in traj_accumulator.items():
        if group_by_agent_id:
            id2score[idx].extend(reward_list)
        else:
            traj2avg[(idx, t_idx)] = statistics.fmean(reward_list)
            id2score[idx].append(traj2avg[(idx, t_idx)])
    if not group_by_agent_id:
        scores = [traj2avg[(index[i], traj_index[i])] for i in range(len(scores))]
    for idx, values in id2score.items():
        if len(values) == 1:
            id2mean[idx], id2std[idx] = 0.0, 1.0
        else:
            id2mean[idx], id2std[idx] = statistics.fmean(values), statistics.stdev(values)
    return np.array([
        (s - id2mean[index[i]]) / (id2std[index[i]] + epsilon) if norm else s - id2mean[index[i]]
        for i, s in enumerate(scores)
    ])


def columns():
    uid, traj, agent, score = (list(c) for c in zip(*TABLE, strict=True))
    return np.array(score), uid, traj, agent


@pytest.mark.parametrize("norm", [True, False])
def test_drmas_equals_the_reference_exactly(norm):
    scores, uid, traj, agent = columns()
    ours = drmas(scores, uid=uid, agent_id=agent, traj_uid=traj, norm_by_std=norm)  # default singleton rule
    index = [f"{u}_{a}" for u, a in zip(uid, agent, strict=True)]
    np.testing.assert_allclose(ours, reference_grpo(scores, index, traj, group_by_agent_id=True, norm=norm),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_equals_the_reference_exactly(norm):
    scores, uid, traj, agent = columns()
    ours = grpo(scores, uid=uid, agent_id=agent, traj_uid=traj, norm_by_std=norm)
    np.testing.assert_allclose(ours, reference_grpo(scores, uid, traj, group_by_agent_id=False, norm=norm),
                               rtol=1e-12, atol=1e-12)


def test_the_lone_search_call_gets_the_reference_value_by_default():
    """The worked example of drmas_train/algorithm/advantages.py: the only Search call of group q1 (score 1.0).

    The reference gives a group of one mean 0 and std 1 (``verl/trainer/ppo/core_algos.py:553-555``), so the call's
    advantage is ``(1.0 - 0) / (1 + 1e-6)`` (:562-563); drmas's default does the same, ``singleton="zero"`` gives 0.
    """
    scores, uid, traj, agent = columns()
    lone = 1  # row of the Search call
    default = drmas(scores, uid=uid, agent_id=agent, traj_uid=traj)
    index = [f"{u}_{a}" for u, a in zip(uid, agent, strict=True)]
    reference = reference_grpo(scores, index, traj, group_by_agent_id=True)
    assert default[lone] == reference[lone] == pytest.approx(0.999999000001, abs=0, rel=1e-15)
    zero = drmas(scores, uid=uid, agent_id=agent, traj_uid=traj, singleton="zero")
    assert zero[lone] == 0.0
    # every other row of q1 has a group of >= 2 and is identical under both conventions
    others = [i for i in range(len(TABLE)) if i != lone and TABLE[i][0] == "q1"]
    np.testing.assert_array_equal(zero[others], default[others])
    # q2 is one trajectory: its Verifier (0.0) and Answer (-0.01) calls are singletons of their agent groups
    assert list(zero[8:]) == [0.0, 0.0] and list(default[8:]) == pytest.approx([0.0, -0.01 / (1.0 + EPS)], rel=1e-15)


def test_singleton_mode_is_validated_and_applies_to_every_group_estimator():
    scores, uid, traj, agent = columns()
    with pytest.raises(ValueError, match=r"singleton must be one of \('raw', 'zero'\), got 'one'"):
        drmas(scores, uid=uid, agent_id=agent, singleton="one")
    step = grpo_step(scores, uid=uid, agent_id=agent)
    np.testing.assert_allclose(step, reference_grpo(scores, uid, list(range(len(TABLE))), group_by_agent_id=True))
