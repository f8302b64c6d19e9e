"""Checkpoints: atomic writes, pruning, RNG round trip, and SIGKILL + --resume reproducing an uninterrupted run."""

from __future__ import annotations

import random
import re
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
    restore_trainer_state,
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


def _enospc(*_args, **_kwargs):
    import errno
    import os

    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _save(root, it, write_state):
    return save_checkpoint(root, it, write_state=write_state, sampler_state={}, config_yaml="", keep=1)


def test_disk_full_during_a_save_names_the_cause_and_what_survived(tmp_path, monkeypatch):
    """An injected ENOSPC from the weights' write: the error says so, the partial folder is gone, the last
    checkpoint is intact; the first save failing that way says that nothing survived."""
    import errno
    import shutil

    from drmas_train.run.checkpoint import CheckpointSpaceError

    loaded = tiny_loader(ModelSpec("tiny"), "m")
    ok = _models({"m": (loaded.model, None)}, {})
    first = _save(tmp_path, 1, ok)
    before = {p.relative_to(first): p.read_bytes() for p in first.rglob("*") if p.is_file()}
    monkeypatch.setattr(loaded.model, "save_pretrained", _enospc)
    with pytest.raises(CheckpointSpaceError) as err:
        _save(tmp_path, 2, ok)
    message = str(err.value)
    assert err.value.errno == errno.ENOSPC and message.startswith(
        f"checkpoint iter_000002 not saved: no space left on device under {tmp_path} (it needs about ")
    assert message.endswith("; the last complete checkpoint iter_000001 survived intact; free space (a save needs "
                            "room for one more checkpoint beside the kept ones, even with run.keep_checkpoints=1) "
                            "and continue with --resume")  # fmt: skip
    assert [p.name for p in tmp_path.iterdir()] == ["iter_000001"]
    assert {p.relative_to(first): p.read_bytes() for p in first.rglob("*") if p.is_file()} == before

    shutil.rmtree(first)
    with pytest.raises(CheckpointSpaceError, match=re.escape(
            "no checkpoint of this run survived; free space and start it again with --overwrite")):  # fmt: skip
        _save(tmp_path, 1, ok)
    assert list(tmp_path.iterdir()) == []


def test_torch_zip_writer_on_a_full_disk_is_reported_as_disk_full(tmp_path, monkeypatch):
    """torch.save's zip writer loses the errno (``RuntimeError: [enforce fail at inline_container.cc] ... unexpected
    pos``): with under 1 MiB free it is still reported as a full disk; with room left it stays what it was."""
    import collections
    import shutil

    from drmas_train.run.checkpoint import CheckpointSpaceError

    def zip_failure(*_args, **_kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 960 vs 854")

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(torch, "save", zip_failure)
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(CheckpointSpaceError, match=re.escape("checkpoint iter_000001 not saved: no space left on "
                                                             "device under")):  # fmt: skip
        _save(tmp_path, 1, lambda folder: None)
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(10**9, 0, 10**9))
    with pytest.raises(RuntimeError, match="unexpected pos") as err:
        _save(tmp_path, 1, lambda folder: None)
    assert not isinstance(err.value, CheckpointSpaceError)
    assert list(tmp_path.iterdir()) == []


def test_a_save_is_refused_before_writing_when_the_last_checkpoint_does_not_fit(tmp_path, monkeypatch):
    """The previous checkpoint's size is the estimate: less free space than that refuses the save before any byte."""
    import collections
    import shutil

    from drmas_train.run.checkpoint import CheckpointSpaceError, tree_bytes

    loaded = tiny_loader(ModelSpec("tiny"), "m")
    ok = _models({"m": (loaded.model, None)}, {})
    first = _save(tmp_path, 1, ok)
    size = tree_bytes(first)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(10**9, 10**9, size - 1))
    written = []
    with pytest.raises(CheckpointSpaceError, match=re.escape(
            f"checkpoint iter_000002 not written: no space left on device for it under {tmp_path} (it needs about ")):
        _save(tmp_path, 2, written.append)  # fmt: skip
    assert written == [] and [p.name for p in tmp_path.iterdir()] == ["iter_000001"]


def test_a_checkpoint_is_fsynced_before_its_rename(tmp_path, monkeypatch):
    """Every file and folder of the new checkpoint is fsynced before ``os.rename`` publishes it, the root after."""
    import os

    events, real_fsync, real_rename = [], os.fsync, os.rename
    names: dict[int, str] = {}
    real_open = os.open

    def track_open(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)
        names[fd] = os.fspath(path)
        return fd

    monkeypatch.setattr(os, "open", track_open)
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", names[fd])), real_fsync(fd))[1])
    monkeypatch.setattr(os, "rename", lambda a, b: (events.append(("rename", os.fspath(b))), real_rename(a, b))[1])
    final = _save(tmp_path, 1, lambda folder: (folder / "w.bin").write_bytes(b"x" * 10))
    rename = events.index(("rename", str(final)))
    synced = {Path(p).name for kind, p in events[:rename] if kind == "fsync"}
    assert {"w.bin", "trainer_state.pt", "config.yaml"} <= synced
    assert any(Path(p).name.startswith(".tmp-iter_000001") for kind, p in events[:rename] if kind == "fsync")
    assert ("fsync", str(tmp_path)) in events[rename:]


def test_restore_trainer_state_puts_back_the_sampler_the_kl_coefficient_and_the_versions(tmp_path, caplog):
    from drmas_train.algorithm.reward_shaping import make_kl_controller
    from drmas_train.collect.task_sampler import TaskSampler

    sampler, kl = TaskSampler(10, 3, seed=1), make_kl_controller("adaptive", coef=0.1, target=6.0, horizon=100)
    sampler.next_batch()
    kl.update(12.0, 50)  # beta moves away from 0.1
    root = tmp_path / "ckpt"
    path = save_checkpoint(root, 4, write_state=lambda folder: None, sampler_state=sampler.state_dict(), config_yaml="",
                           extra={"reward_kl_control": kl.state_dict(), "policy_versions": {"m": 3}})  # fmt: skip
    expected = sampler.next_batch()
    fresh, fresh_kl = TaskSampler(10, 3, seed=1), make_kl_controller("adaptive", coef=0.1, target=6.0, horizon=100)
    iteration, versions = restore_trainer_state(load_checkpoint(path), sampler=fresh, kl_control=fresh_kl,
                                                model_ids=["m"], policy_warmup=0)  # fmt: skip
    assert (iteration, versions.state_dict(), fresh_kl.value) == (4, {"m": 3}, kl.value) and kl.value != 0.1
    assert list(fresh.next_batch()) == list(expected)  # the sampler continues where the checkpointed one did
    state = load_checkpoint(path)
    del state["extra"]["policy_versions"], state["extra"]["reward_kl_control"]  # an older checkpoint
    with caplog.at_level("INFO", logger="drmas_train.run.checkpoint"):
        iteration, versions = restore_trainer_state(state, sampler=TaskSampler(10, 3, seed=1), kl_control=fresh_kl,
                                                    model_ids=["m", "n"], policy_warmup=1)  # fmt: skip
    assert versions.state_dict() == {"m": 3, "n": 3}  # 4 iterations, the first critic-only
    assert "derived from its iteration 4" in caplog.text
    assert restore_trainer_state(state, sampler=TaskSampler(10, 3), kl_control=None, model_ids=["m"],
                                 policy_warmup=0)[1].state_dict() == {"m": 4}  # fmt: skip
