"""Sharded checkpoints (``drmas_train.distributed.checkpoint``): 2 gloo ranks with FSDP2 on CPU, plus
single-process checks of atomicity, error messages and the Hugging Face round trip.

Tolerances: weights, optimizer state and LR schedule after load / exact resume are compared bit for bit
(``torch.equal``): DCP copies bytes and the resumed step runs the same reductions in the same order. Logits of
the exported single-process model versus the FSDP2 model: ``atol=1e-5`` (float32; same weights, the unsharded
forward may fuse differently).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import drmas_train.distributed.checkpoint as ckpt_mod
from drmas_train.algorithm.optim import build_optimizer
from drmas_train.distributed.checkpoint import (
    export_hf,
    import_hf,
    is_sharded_checkpoint,
    load_sharded,
    save_sharded,
)
from drmas_train.model.models import load_model

WORLD = 2


def assert_same(a, b, where: str = "") -> None:
    """Recursive exact equality of nested dicts/lists of tensors and scalars."""
    if isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys differ: {sorted(set(a) ^ set(b))[:4]}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where}: tensors differ (max abs diff {(a.float() - b.float()).abs().max()})"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _hf_config_dir(path: Path) -> Path:
    """A Hugging Face folder with tiny-llama's config and tokenizer (what a worker group loads from)."""
    lm = load_model("tiny-llama")
    lm.model.config.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The scenario of ``ckpt_workers.run`` on 2 gloo ranks: ``(tmp dir, [rank 0 record, rank 1 record])``."""
    from helpers.ckpt_workers import run
    from helpers.spawn_ranks import spawn_ranks

    tmp = tmp_path_factory.mktemp("dcp")
    _hf_config_dir(tmp / "config")
    spawn_ranks(run, WORLD, tmp)
    return tmp, [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.mark.slow
def test_layout_of_a_two_rank_fsdp2_checkpoint(two_ranks):
    tmp, _ = two_ranks
    info = json.loads((tmp / "ckpt" / "drmas_sharded.json").read_text())
    assert info["format"] == "drmas-dcp/1" and info["world_size"] == 2 and info["wrapping"] == "fsdp2"
    assert info["model_class"] == "LlamaForCausalLM" and info["has_optimizer"] and info["has_schedule"]
    assert sorted(p.name for p in (tmp / "ckpt").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not list(tmp.glob(".*partial*")), "no temporary folder may remain after a save"


@pytest.mark.slow
def test_load_into_fresh_ranks_restores_weights_optimizer_and_schedule(two_ranks):
    _, res = two_ranks
    for r in range(WORLD):
        saved, loaded, fresh = res[r]["saved"], res[r]["loaded"], res[r]["fresh"]
        assert any(not torch.equal(fresh["model"][k], saved["model"][k]) for k in saved["model"]), "seed 1 != seed 0"
        assert_same(loaded, saved, f"rank{r}")
        assert loaded["optim"]["state"], "the optimizer state must be non-empty (one AdamW step was taken)"
        assert loaded["schedule"]["last_epoch"] == 1


@pytest.mark.slow
def test_resume_after_one_step_equals_the_uninterrupted_run(two_ranks):
    _, res = two_ranks
    for r in range(WORLD):
        assert_same(res[r]["resumed"], res[r]["uninterrupted"], f"rank{r}")
    # and the step did something: resumed weights differ from the saved ones
    saved, resumed = res[0]["saved"]["model"], res[0]["resumed"]["model"]
    assert any(not torch.equal(saved[k], resumed[k]) for k in saved)


@pytest.mark.slow
def test_a_ddp_model_loads_the_fsdp2_checkpoint(two_ranks):
    _, res = two_ranks
    for r in range(WORLD):
        assert_same(res[r]["ddp_loaded"]["model"], res[r]["saved"]["model"], f"rank{r}")


@pytest.mark.slow
def test_a_ddp_checkpoint_loads_into_one_plain_process(two_ranks):
    tmp, res = two_ranks
    info = json.loads((tmp / "ckpt_ddp" / "drmas_sharded.json").read_text())
    assert (info["wrapping"], info["world_size"], info["has_optimizer"]) == ("ddp", 2, False)
    plain = load_model({"name_or_path": "tiny-llama", "seed": 7}).model
    load_sharded(plain, None, tmp / "ckpt_ddp")
    assert_same(plain.state_dict(), res[0]["saved"]["model"])


@pytest.mark.slow
def test_export_hf_loads_with_load_model_and_gives_the_same_logits(two_ranks):
    tmp, res = two_ranks
    assert sorted(p.name for p in (tmp / "hf").iterdir() if p.suffix in (".json", ".safetensors", ".jinja")) == [
        "chat_template.jinja", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    lm = load_model(str(tmp / "hf"))
    with torch.no_grad():
        got = lm.model(input_ids=torch.arange(10).remainder(lm.model.config.vocab_size - 5).add(5)[None]).logits
    assert torch.allclose(got, res[0]["logits"], atol=1e-5, rtol=0)
    assert_same(
        {k: v for k, v in lm.model.state_dict().items() if k != "lm_head.weight"},
        {k: v for k, v in res[0]["saved"]["model"].items() if k != "lm_head.weight"},
    )


@pytest.mark.slow
def test_import_hf_fills_a_sharded_model(two_ranks):
    _, res = two_ranks
    for r in range(WORLD):
        assert_same(res[r]["imported"]["model"], res[r]["saved"]["model"], f"rank{r}")
        assert torch.allclose(res[r]["imported_logits"], res[r]["logits"], atol=1e-6, rtol=0)


@pytest.mark.slow
def test_a_failure_on_rank_0_raises_on_every_rank(two_ranks):
    tmp, res = two_ranks
    assert res[0]["publish_error"].startswith("OSError: cannot rename") and "(simulated)" in res[0]["publish_error"]
    assert res[1]["publish_error"].startswith("RuntimeError: rank 0 failed publishing the sharded checkpoint: OSError")
    assert not (tmp / "refused").exists() and not (tmp / ".refused.partial").exists()


@pytest.mark.slow
def test_the_exported_folder_evaluates_through_drmas_eval(two_ranks, capsys):
    from drmas_train.cli import main

    tmp, _ = two_ranks
    out = tmp / "eval"
    argv = ["eval", "--env", "math-solver-v0", "--policy", "llm", "--model", str(tmp / "hf"), "--limit", "2",
            "--k", "1", "--max-new-tokens", "8", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_episodes"] == 2


# ---------------------------------------------------------------- single process (no process group): fast


def _tiny(seed: int = 0):
    model = load_model({"name_or_path": "tiny-llama", "seed": seed}).model
    return model, build_optimizer("m", model, lr=1e-2, warmup_steps=2)


def _step(model, opt, k: int) -> None:
    x = torch.randint(5, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(k))
    model.train()
    model(input_ids=x, labels=x).loss.backward()
    opt.step()


@pytest.fixture
def saved(tmp_path):
    model, opt = _tiny()
    _step(model, opt, 0)
    save_sharded(model, opt, tmp_path / "ck")
    return tmp_path / "ck", model, opt


def test_single_process_exact_resume_with_schedule(saved):
    path, model, opt = saved
    _step(model, opt, 1)
    model2, opt2 = _tiny(seed=1)
    load_sharded(model2, opt2, path)
    assert opt2.scheduler.last_epoch == 1 and opt2.lr == pytest.approx(1e-2)  # warm-up 2: step 1 -> full lr
    _step(model2, opt2, 1)
    assert_same(model2.state_dict(), model.state_dict())
    assert_same(opt2.optimizer.state_dict()["state"], opt.optimizer.state_dict()["state"])


def test_a_save_before_the_first_step_leaves_the_optimizer_untouched(tmp_path):
    model, opt = _tiny()
    save_sharded(model, opt, tmp_path / "ck0")
    assert not opt.optimizer.state, "saving must not initialise Adam's state (that would count a step)"
    model2, opt2 = _tiny(seed=1)
    load_sharded(model2, opt2, tmp_path / "ck0")
    for m, o in ((model, opt), (model2, opt2)):
        _step(m, o, 0)
    assert_same(model2.state_dict(), model.state_dict())
    assert_same(opt2.optimizer.state_dict()["state"], opt.optimizer.state_dict()["state"])


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_partial(saved, monkeypatch):
    path, model, opt = saved
    before = (path / "__0_0.distcp").read_bytes()
    _step(model, opt, 1)

    def crash(*args, **kwargs):
        Path(kwargs["checkpoint_id"], "__0_0.distcp").write_bytes(b"half")  # some bytes were written, then...
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_mod.dcp, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_sharded(model, opt, path)
    assert (path / "__0_0.distcp").read_bytes() == before and is_sharded_checkpoint(path)
    assert not (path.parent / ".ck.partial").exists()


def test_a_killed_save_is_never_taken_for_a_checkpoint(saved, tmp_path):
    path, model, opt = saved
    partial = tmp_path / ".next.partial"  # what a save killed after DCP wrote .metadata leaves behind
    import shutil

    shutil.copytree(path, partial)
    (partial / "drmas_sharded.json").unlink()
    assert not is_sharded_checkpoint(partial)
    with pytest.raises(FileNotFoundError, match="is not a complete sharded checkpoint"):
        load_sharded(model, opt, partial)
    save_sharded(model, opt, tmp_path / "next")  # the next save clears it
    assert is_sharded_checkpoint(tmp_path / "next") and not partial.exists()


@pytest.mark.slow
def test_load_errors_name_the_problem(saved, tmp_path):
    path, model, opt = saved
    with pytest.raises(FileNotFoundError, match=r"sharded checkpoint '.*nowhere' does not exist"):
        load_sharded(model, opt, tmp_path / "nowhere")
    save_sharded(model, None, tmp_path / "weights_only")
    with pytest.raises(ValueError, match=r"holds no optimizer state \(saved with optimizer=None\)"):
        load_sharded(model, opt, tmp_path / "weights_only")
    load_sharded(model, None, tmp_path / "weights_only")  # weights only is fine
    other = load_model("tiny-qwen3").model
    with pytest.raises(ValueError, match="it was saved from another architecture"):
        load_sharded(other, None, path)
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        save_sharded(model, "adam", tmp_path / "bad")


@pytest.mark.slow
def test_export_and_import_round_trip_and_refusals(saved, tmp_path):
    path, model, opt = saved
    cfg = _hf_config_dir(tmp_path / "cfg")
    out = export_hf(path, tmp_path / "hf", model_config_dir=cfg, dtype="bfloat16")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    fresh, _ = _tiny(seed=5)
    import_hf(out, fresh)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v.to(torch.bfloat16).float()), k
    with pytest.raises(FileExistsError, match="is never overwritten"):
        export_hf(path, out, model_config_dir=cfg)
    qwen = tmp_path / "qwen"
    lm = load_model("tiny-qwen3")
    lm.model.config.save_pretrained(qwen)
    with pytest.raises(ValueError, match="does not match the Qwen3ForCausalLM"):
        export_hf(path, tmp_path / "hf2", model_config_dir=qwen)
    assert not (tmp_path / "hf2").exists()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        export_hf(path, tmp_path / "hf3", model_config_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors weights"):
        import_hf(tmp_path, fresh)


_KILLED_SAVE = """
import os, signal, sys, torch
import drmas_train.distributed.checkpoint as ck
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
opt = torch.optim.AdamW(model.parameters())
model(torch.ones(3, 4)).sum().backward()
opt.step()
path = sys.argv[1]
ck.save_sharded(model, opt, path)                       # a complete checkpoint
torch.save({k: v.clone() for k, v in model.state_dict().items()}, path + ".expected.pt")
with torch.no_grad():
    for p in model.parameters():
        p.add_(1.0)
real_save = ck.dcp.save
def save_then_die(*args, **kwargs):                     # every shard and .metadata written, then SIGKILL
    real_save(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
ck.dcp.save = save_then_die
ck.save_sharded(model, opt, path)                       # replaced... but the process dies first
"""


@pytest.mark.slow
def test_a_sigkilled_save_keeps_the_previous_checkpoint(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "ck"
    root = str(Path(__file__).resolve().parents[3])  # this checkout's drmas_train, whatever is installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    # timeout: a hang guard, ~100x the subprocess's 6 s
    proc = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(path)], capture_output=True, text=True,
                          timeout=600, env=env)  # fmt: skip
    assert proc.returncode == -9, proc.stderr[-2000:]  # SIGKILL: no exception handler or cleanup ran
    partial = tmp_path / ".ck.partial"
    assert (partial / ".metadata").is_file() and not is_sharded_checkpoint(partial)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    load_sharded(model, None, path)  # the previous, complete checkpoint
    assert_same(model.state_dict(), torch.load(str(path) + ".expected.pt"))
    save_sharded(model, None, path)  # the next save clears the leftover
    assert not partial.exists() and is_sharded_checkpoint(path)
