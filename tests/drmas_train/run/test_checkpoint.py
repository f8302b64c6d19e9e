"""Checkpoints: atomic writes, pruning, RNG round trip, and SIGKILL + --resume reproducing an uninterrupted run."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from drmas_train.algorithm.optim import build_optimizer
from drmas_train.model.models import ModelSpec
from drmas_train.run.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_model_states,
    rng_state,
    save_checkpoint,
    save_model_states,
    set_rng_state,
)
from drmas_train.run.metrics_log import read_metrics
from drmas_train.run.trainer import train
from helpers.tiny_rl import tiny_config, tiny_loader


def _models(models, optimizers):
    """The single-process updater's part of a checkpoint (``write_state``) for these models and optimizers."""
    return lambda folder: save_model_states(folder, models, optimizers)


def _load(path, models, optimizers):
    """A checkpoint read back as the trainer does: its trainer state (and RNG states), then the models' part."""
    state = load_checkpoint(path)
    load_model_states(path, models, optimizers)
    return state


def _weights(run_dir: Path, iteration: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"iter_{iteration:06d}" / "models" / "m" / "model.safetensors")


def test_save_load_round_trip_prune_and_rng(tmp_path):
    loaded = tiny_loader(ModelSpec("tiny"), "m")
    opt = build_optimizer("m", loaded.model, lr=1e-2)
    for p in loaded.model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = rng_state()
    for it in (1, 2, 3):
        save_checkpoint(tmp_path, it, write_state=_models({"m": (loaded.model, loaded.tokenizer)}, {"m": opt}),
                        sampler_state={"epoch": 0, "cursor": it}, config_yaml="seed: 0\n", keep=2)  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_000002", "iter_000003"]
    assert latest_checkpoint(tmp_path).name == "iter_000003"
    draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    fresh = tiny_loader(ModelSpec("tiny", seed=5), "m")
    fresh_opt = build_optimizer("m", fresh.model, lr=1e-2)
    restored = _load(latest_checkpoint(tmp_path), {"m": fresh.model}, {"m": fresh_opt})
    assert restored["iteration"] == 3 and restored["sampler"]["cursor"] == 3
    for a, b in zip(loaded.model.state_dict().values(), fresh.model.state_dict().values(), strict=False):
        assert torch.equal(a, b)
    assert fresh_opt.optimizer.state_dict()["state"][0]["step"] == 1
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == draws  # RNG restored to `state`
    set_rng_state(state)


def test_failed_save_leaves_no_partial_checkpoint(tmp_path):
    loaded = tiny_loader(ModelSpec("tiny"), "m")

    class Boom:
        def save_pretrained(self, path):
            Path(path).mkdir(parents=True)
            (Path(path) / "half.bin").write_bytes(b"x")
            raise OSError("disk full")

    save_checkpoint(tmp_path, 1, write_state=_models({"m": (loaded.model, None)}, {}), sampler_state={}, config_yaml="")
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, write_state=_models({"m": (Boom(), None)}, {}), sampler_state={}, config_yaml="")
    assert [p.name for p in tmp_path.iterdir()] == ["iter_000001"]
    assert latest_checkpoint(tmp_path).name == "iter_000001"
    assert latest_checkpoint(tmp_path / "nothing") is None


_KILLED_RUN = """
import os, signal, sys
from helpers.tiny_rl import tiny_config, tiny_loader
import drmas_train.run.trainer as T
orig = T._save
def save_then_die(run, it):
    path = orig(run, it)
    if it == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # killed right after the 2nd checkpoint, as `kill -9` would
    return path
T._save = save_then_die
T.train(tiny_config({run_dir!r}, *{overrides!r}), loader=tiny_loader)
"""


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted(tmp_path):
    overrides = ["run.iterations=4", "run.save_every=1", "run.keep_checkpoints=5", "rollout.group_size=4"]
    killed = tmp_path / "killed"
    code = _KILLED_RUN.format(run_dir=str(killed), overrides=overrides)
    assert subprocess.run([sys.executable, "-c", code], timeout=600).returncode == -signal.SIGKILL
    assert latest_checkpoint(killed / "checkpoints").name == "iter_000002"
    train(tiny_config(killed, *overrides), resume=True, loader=tiny_loader)

    straight = tmp_path / "straight"
    train(tiny_config(straight, *overrides), loader=tiny_loader)
    w_resumed, w_straight = _weights(killed, 4), _weights(straight, 4)
    assert w_resumed.keys() == w_straight.keys()
    for k in w_straight:
        assert torch.equal(w_resumed[k], w_straight[k]), k
    assert not all(torch.equal(_weights(straight, 1)[k], w_straight[k]) for k in w_straight)  # it did train
    assert [r["iteration"] for r in read_metrics(killed / "metrics.jsonl")] == [1, 2, 3, 4]
    a, b = read_metrics(killed / "metrics.jsonl"), read_metrics(straight / "metrics.jsonl")
    assert [r["loss/m/grad_norm"] for r in a] == pytest.approx([r["loss/m/grad_norm"] for r in b], rel=1e-6)


def test_lora_adapter_checkpoint_round_trip(tmp_path):
    from peft import LoraConfig, get_peft_model

    def lora_model(seed):
        base = tiny_loader(ModelSpec("tiny"), "m").model
        torch.manual_seed(seed)
        return get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))

    model = lora_model(0)
    opt = build_optimizer("m", model, lr=1e-2)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)  # only adapters are optimised
    save_checkpoint(tmp_path, 1, write_state=_models({"m": (model, None)}, {"m": opt}), sampler_state={}, config_yaml="")
    assert (tmp_path / "iter_000001" / "models" / "m" / "adapter_model.safetensors").is_file()
    other = lora_model(1)
    _load(tmp_path / "iter_000001", {"m": other}, {"m": build_optimizer("m", other, lr=1e-2)})
    for (n, a), (_, b) in zip(model.named_parameters(), other.named_parameters(), strict=True):
        assert torch.equal(a, b), n
