"""(c) Two non-sharing models on one shared (colocated) pool train in the same iteration, through ``train``;
the run's checkpoint holds each model's sharded state and HF weights, ``--resume`` continues from it, and a
training rank killed in the resumed run's update is rebuilt from that checkpoint and the iteration replayed."""

from __future__ import annotations

import pytest
import torch

import drmas_train.run.trainer as trainer_module
from drmas_train.model.models import ModelSpec, load_model
from drmas_train.model.weights import load_weights
from drmas_train.run.trainer import train
from helpers.tiny_rl import tiny_config, tiny_loader

pytestmark = pytest.mark.slow  # Ray actors start in ~10-30 s on 2 cores (still run in CI)

TWO_MODELS = ("models.m2.name_or_path=tiny", "agents.b=m2", "distributed.enabled=true", "distributed.colocate=true",
              "distributed.world_size.m=1", "distributed.world_size.m2=1", "run.iterations=2", "rollout.group_size=4")  # fmt: skip


def test_two_models_train_on_one_shared_pool(ray_cluster, tmp_path, monkeypatch):
    import os
    import signal

    import ray

    run_dir = tmp_path / "run"
    summary = train(tiny_config(run_dir, *TWO_MODELS), loader=tiny_loader)
    last = summary["metrics"]
    for mid in ("m", "m2"):  # both models stepped in the same (last) iteration
        assert last[f"loss/{mid}/steps"] == 1.0 and last[f"loss/{mid}/grad_norm"] > 0
    ckpt = run_dir / "checkpoints" / "iter_000002"
    assert summary["checkpoint"] == str(ckpt)
    initial = tiny_loader(ModelSpec("tiny"), "m").model.state_dict()
    for mid in ("m", "m2"):
        assert (ckpt / "sharded" / mid / ".metadata").is_file()  # a complete DCP checkpoint
        model = tiny_loader(ModelSpec("tiny"), mid).model
        load_weights(model, ckpt / "models" / mid)  # the HF copy gathered from the ranks
        moved = max(float((v - initial[k]).abs().max()) for k, v in model.state_dict().items())
        assert moved > 1e-4, f"{mid} did not train"
        exported = load_model(str(ckpt / "models" / mid))  # what `drmas eval --model <dir>` loads
        assert exported.tokenizer.chat_template and all(
            torch.equal(v, model.state_dict()[k]) for k, v in exported.model.state_dict().items())
    # the pool and the actors are gone; Ray itself (the fixture's) stays up
    assert ray.is_initialized()
    assert all(pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())

    update, seen = trainer_module._update_models, []

    def kill_then_update(run, samples, adv, seed):  # the 1st update after the resume loses m2's rank 0
        seen.append((seed, run.updater))
        if len(seen) == 1:
            os.kill(run.updater.groups["m2"].rank_pids()[0], signal.SIGKILL)
        return update(run, samples, adv, seed)

    monkeypatch.setattr(trainer_module, "_update_models", kill_then_update)
    resumed = train(tiny_config(run_dir, *TWO_MODELS, "run.iterations=3"), resume=True, loader=tiny_loader)
    assert resumed["checkpoint"].endswith("iter_000003")
    assert [s for s, _ in seen] == [seen[0][0]] * 2  # iteration 3 ran again, with the same seed
    assert seen[0][1].training_restarts == 1
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 3  # iterations 1, 2 and the resumed 3rd
    sd = torch.load(run_dir / "checkpoints" / "iter_000003" / "trainer_state.pt", weights_only=False)
    assert sd["iteration"] == 3
