"""DAPO's dynamic sampling: never fewer than the configured groups with a reward spread unless it stopped at its
retry bound (with a warning), the batch cut to exactly that many, and the trainer's metrics of it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pytest

from drmas_train.collect.dynamic_sampling import dynamic_sampling, groups_with_spread
from drmas_train.collect.rollout import RolloutResult
from drmas_train.collect.samples import Sample
from drmas_train.run.config import ConfigError
from drmas_train.run.metrics_log import read_metrics
from drmas_train.run.trainer import train
from helpers.tiny_rl import tiny_config, tiny_loader


@dataclass
class Traj:
    uid: str
    traj_uid: str
    score: float
    won: bool


def fake_draws(seed: int, n_tasks: int, group_size: int, p_spread: float):
    """``draw(k)``: ``n_tasks`` groups of ``group_size`` trajectories; each group has a reward spread with probability
    ``p_spread``, else all its rollouts score the same. Also returns the record of what was drawn."""
    rng = np.random.default_rng(seed)
    drawn: list[list[tuple[str, bool]]] = []

    def draw(k: int):
        tasks, samples, trajectories, record = [], [], [], []
        for i in range(n_tasks):
            uid = f"d{k}-t{i}"
            spread = bool(rng.random() < p_spread)
            scores = (
                rng.permutation([1.0] + [0.0] * (group_size - 1))
                if spread
                else [float(rng.integers(0, 2))] * group_size
            )
            for g, sc in enumerate(scores):
                trajectories.append(Traj(uid, f"{uid}/{g}", float(sc), bool(sc)))
                samples.append(
                    Sample(uid, f"{uid}/{g}", "a", "m", 0, 0, [1], [2], [0.0], [1], reward=float(sc))
                )
            tasks.append(f"task-{k}-{i}")
            record.append((uid, spread))
        drawn.append(record)
        return tasks, RolloutResult(samples, trajectories, {"total": 1.0, "generate": 0.5})

    return draw, drawn


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("p_spread", [0.0, 0.15, 0.5, 1.0])
def test_never_fewer_groups_than_asked_unless_at_the_bound(seed, p_spread, caplog):
    target, bound = 4, 3
    draw, drawn = fake_draws(seed, n_tasks=4, group_size=3, p_spread=p_spread)
    with caplog.at_level(logging.WARNING, logger="drmas_train.collect.dynamic_sampling"):
        batch = dynamic_sampling(draw, target_groups=target, metric="score", max_batches=bound)
    spread = [uid for record in drawn for uid, s in record if s]
    uids = list(dict.fromkeys(t.uid for t in batch.result.trajectories))
    warned = [r for r in caplog.records if "prompt groups with a reward spread" in r.getMessage()]
    if len(uids) < target:  # only at the bound, and said so
        assert len(drawn) == bound and len(spread) < target and len(warned) == 1
        assert (
            f"{len(spread)} of {target} prompt groups with a reward spread after {bound} rollouts"
            in warned[0].getMessage()
        )
    else:
        assert not warned and len(uids) == target  # cut to exactly the target
        assert len(drawn) == min(bound, next(k + 1 for k in range(len(drawn))
                                             if sum(s for rec in drawn[: k + 1] for _, s in rec) >= target))  # fmt: skip
    assert uids == spread[:target]  # the first groups with a spread, in draw order, and no other
    assert set(groups_with_spread(batch.result.trajectories, "score")) == set(uids)
    assert {s.uid for s in batch.result.samples} == set(uids) and len(batch.result.samples) == 3 * len(uids)
    assert [t.split("-")[1:] for t in batch.tasks] == [
        u[1:].split("-t") for u in uids
    ]  # each group's own task
    assert batch.metrics == {"rollout/gen_batches": float(len(drawn)), "rollout/groups_drawn": 4.0 * len(drawn),
                             "rollout/groups_with_spread": float(len(spread)), "rollout/groups_kept": float(len(uids))}  # fmt: skip
    assert batch.result.timing == {"total": float(len(drawn)), "generate": 0.5 * len(drawn)}


def test_a_group_of_one_is_kept_and_the_metric_is_checked():
    one = [Traj("u1", "u1/0", 0.0, False), Traj("u2", "u2/0", 1.0, True), Traj("u2", "u2/1", 1.0, True)]
    assert groups_with_spread(one, "score") == [
        "u1"
    ]  # as the reference: a lone rollout is kept, a tie is not
    assert groups_with_spread([Traj("u", "u/0", 0.5, False), Traj("u", "u/1", 0.0, False)], "won") == []
    with pytest.raises(ValueError, match=r"filter metric must be one of \['score', 'won'\], got 'acc'"):
        groups_with_spread(one, "acc")
    with pytest.raises(ValueError, match="target_groups and max_batches must be >= 1"):
        dynamic_sampling(lambda k: ([], None), target_groups=2, metric="score", max_batches=0)


def test_trainer_with_dynamic_sampling(tmp_path):
    run_dir = tmp_path / "dapo"
    cfg = tiny_config(run_dir, "run.iterations=2", "rollout.filter_groups=true", "rollout.filter_groups_max_batches=4",
                      "rollout.batch_size=2")  # fmt: skip
    train(cfg, loader=tiny_loader)
    for row in read_metrics(run_dir / "metrics.jsonl"):
        assert (
            1 <= row["rollout/gen_batches"] <= 4
            and row["rollout/groups_drawn"] == 2 * row["rollout/gen_batches"]
        )
        assert row["rollout/groups"] == row["rollout/groups_kept"] <= 2
        assert row["rollout/groups_kept"] == min(2, row["rollout/groups_with_spread"])


def test_dynamic_sampling_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout.filter_groups_metric='acc'; accepted: score, won"):
        tiny_config(tmp_path / "r", "rollout.filter_groups_metric=acc")
    with pytest.raises(ConfigError, match=r"rollout.filter_groups_max_batches must be >= 1"):
        tiny_config(tmp_path / "r", "rollout.filter_groups_max_batches=0")
