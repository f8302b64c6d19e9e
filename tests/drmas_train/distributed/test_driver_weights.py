"""On the Ray path the driver holds no weights of a trainable model: its pool entry is a ``meta``-device skeleton
(tokenizer, config, spec), rank 0 writes the checkpoint's Hugging Face export, ``drmas eval`` loads that export,
and a checkpoint restores the group's weights. Weights are compared bit for bit (the export and the DCP
checkpoint copy bytes)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from drmas_train.backends.base import SamplingParams
from drmas_train.collect.rollout import rollout
from drmas_train.model.models import load_model
from drmas_train.run.checkpoint import load_checkpoint, save_checkpoint
from drmas_train.run.trainer import build_run
from helpers.tiny_rl import tiny_config, tiny_loader

pytestmark = pytest.mark.slow  # Ray actors start in ~10-30 s on 2 cores (still run in CI)


def _update(run, seed: int) -> None:
    tasks = [run.tasks[i] for i in range(2)]
    samples = rollout(run.env_fn, tasks, 4, run.pool, SamplingParams(temperature=1.0, max_new_tokens=4), seed=seed,
                      max_prompt_tokens=32).samples  # fmt: skip
    run.updater.update(samples, np.random.default_rng(seed).normal(size=len(samples)), seed)


def _same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_driver_holds_no_weights_and_checkpoints_come_from_the_ranks(ray_cluster, tmp_path, capsys):
    from drmas_train.cli import main
    from drmas_train.distributed.updater import driver_parameter_count

    run = build_run(tiny_config(tmp_path / "run", "distributed.enabled=true", "distributed.world_size.m=2"),
                    loader=tiny_loader)  # fmt: skip
    try:
        loaded = run.pool.models["m"]
        assert driver_parameter_count(run.pool, ["m"]) == 0
        assert all(p.is_meta for p in loaded.model.parameters())
        assert loaded.tokenizer is not None and loaded.model.config.vocab_size == len(loaded.tokenizer)
        group = run.pool.backends["m"].group
        initial = group.full_state_dict()
        _update(run, 0)
        trained = group.full_state_dict()
        assert not _same(trained, initial)
        path = save_checkpoint(tmp_path / "ckpt", 1, write_state=run.updater.write_state,
                               sampler_state=run.sampler.state_dict(), config_yaml="")  # fmt: skip
        exported = load_model(str(path / "models" / "m")).model.state_dict()
        assert _same(exported, trained)  # rank 0's export is the group's weights
        _update(run, 1)
        assert not _same(group.full_state_dict(), trained)
        run.updater.read_state(path)  # resume: the groups go back to the checkpoint's weights
        assert load_checkpoint(path)["iteration"] == 1 and _same(group.full_state_dict(), trained)
        assert driver_parameter_count(run.pool, ["m"]) == 0  # still nothing in the driver
    finally:
        run.updater.close()
    out = tmp_path / "eval"
    argv = ["eval", "--env", "math-solver-v0", "--policy", "llm", "--model", str(path / "models" / "m"), "--limit", "2",
            "--k", "1", "--max-new-tokens", "4", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["num_episodes"] == 2
