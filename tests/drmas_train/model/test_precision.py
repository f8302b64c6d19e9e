"""Mixed precision: float32 master weights computing in bf16, the bf16 ISA check, and what stepping bf16 weights loses."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from drmas_train.algorithm.optim import build_optimizer
from drmas_train.algorithm.update_size import UpdateSizeProbe
from drmas_train.model.models import ModelSpec, load_model
from drmas_train.model.precision import (
    COMPUTE_ATTR,
    cpu_bf16_isa,
    forward_dtype,
    frozen_copy,
    mark_compute_dtype,
    resolve_autocast,
)
from drmas_train.run.checkpoint import read_weights
from drmas_train.run.trainer import build_run
from helpers.tiny_rl import tiny_config, tiny_samples

ZEN4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE = "flags\t\t: avx512f avx512_bf16 amx_bf16 amx_tile\n"
SKYLAKE = "flags\t\t: avx2 avx512f avx512bw\n"


def test_cpu_bf16_isa_reads_the_flags(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert cpu_bf16_isa(ZEN4) == "avx512_bf16"
    assert cpu_bf16_isa(SAPPHIRE) == "amx_bf16"
    assert cpu_bf16_isa(SKYLAKE) is None
    assert cpu_bf16_isa("") is None


def test_auto_follows_the_isa_and_the_probe(monkeypatch):
    from drmas_train.model import precision

    monkeypatch.setattr(precision, "cpu_bf16_isa", lambda: "avx512_bf16")
    monkeypatch.setattr(precision, "bf16_speedup", lambda: 2.1)
    assert resolve_autocast("auto", "cpu") is torch.bfloat16
    monkeypatch.setattr(precision, "bf16_speedup", lambda: 0.9)  # flags promise bf16, the kernels are not faster
    assert resolve_autocast("auto", "cpu") is None
    monkeypatch.setattr(precision, "cpu_bf16_isa", lambda: None)
    monkeypatch.setattr(precision, "bf16_speedup", lambda: pytest.fail("no probe without the ISA"))
    assert resolve_autocast("auto", "cpu") is None
    assert resolve_autocast("off", "cpu") is None


def _step_share_changed(spec: ModelSpec, steps: int = 20, lr: float = 1e-6) -> float:
    """Share of weights with a gradient that changed over ``steps`` AdamW steps of random 1e-3 gradients."""
    model = load_model(spec).model
    opt = build_optimizer("m", model, lr=lr, weight_decay=0.0)
    probe = UpdateSizeProbe(opt.params)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        for p in opt.params:
            p.grad = (torch.randn(p.shape, generator=gen) * 1e-3).to(p.dtype)
        probe.before()
        opt.step()
        probe.after()
    return probe.metrics()["update_changed_frac"]


@pytest.mark.slow  # loads tiny-qwen3 (151,669-token vocabulary) and steps it
def test_stepping_bf16_weights_at_lr_1e6_loses_the_steps_and_masters_keep_them():
    """The measurement behind float32 masters: 20 AdamW steps at the paper's lr 1e-6 on tiny-qwen3."""
    bf16 = _step_share_changed(ModelSpec("tiny-qwen3", dtype="bfloat16"))
    masters = _step_share_changed(ModelSpec("tiny-qwen3", dtype="bfloat16", master_dtype="float32"))
    assert bf16 < 0.1  # most steps round away (1.91 % of the weights moved in issue 39's measurement)
    assert masters > 0.99  # float32 keeps all but the steps Adam shrinks below 1e-7 relative (m_t near 0)


@pytest.mark.slow  # loads tiny-qwen3 (151,669-token vocabulary) and steps it
def test_load_model_holds_float32_masters_marked_to_compute_in_bf16():
    loaded = load_model(ModelSpec("tiny-qwen3", dtype="bfloat16", master_dtype="float32"))
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
    assert forward_dtype("off", loaded.model) is torch.bfloat16  # its own dtype, whatever optim.autocast says
    frozen = load_model(ModelSpec("tiny-qwen3", dtype="bfloat16", master_dtype="float32", trainable=False))
    assert {p.dtype for p in frozen.model.parameters()} == {torch.bfloat16} and not hasattr(frozen.model, COMPUTE_ATTR)
    assert forward_dtype("bf16", frozen.model) is None  # computes in its weights' dtype, no autocast
    plain = load_model(ModelSpec("tiny-qwen3"))
    assert forward_dtype("off", plain.model) is None and forward_dtype("bf16", plain.model) is torch.bfloat16
    ref = frozen_copy(loaded.model)
    assert {p.dtype for p in ref.parameters()} == {torch.bfloat16} and not hasattr(ref, COMPUTE_ATTR)
    assert not any(p.requires_grad for p in ref.parameters()) and hasattr(loaded.model, COMPUTE_ATTR)
    mark_compute_dtype(plain.model, None)  # a wrapper that casts by itself (FSDP2's mixed precision)
    assert forward_dtype("bf16", plain.model) is None


def test_master_dtype_is_part_of_the_spec():
    with pytest.raises(ValueError, match=r"ModelSpec.master_dtype must be one of \('float32', 'bfloat16', 'float16'\)"):
        ModelSpec("tiny-qwen3", master_dtype="fp32")
    a, b = ModelSpec("tiny-qwen3", dtype="bfloat16"), ModelSpec("tiny-qwen3", dtype="bfloat16", master_dtype="float32")
    assert a.key() != b.key() and b.holds_masters() and not a.holds_masters()
    assert not ModelSpec("tiny-qwen3", dtype="bfloat16", master_dtype="float32", lora={"r": 2}).holds_masters()
    assert b.weights_dtype() == "float32" and a.weights_dtype() == "bfloat16"


def _bf16_run(tmp_path, *overrides: str):
    cfg = tiny_config(tmp_path / "run", "models.m.name_or_path=tiny-qwen3", "models.m.dtype=bfloat16",
                      "optim.lr=1.0e-6", "optim.weight_decay=0.01", *overrides)  # fmt: skip
    return build_run(cfg)


def _update(run) -> dict[str, float]:
    model = run.pool.models["m"].model
    samples = tiny_samples(model, n=8)
    adv = np.array([1.0, -1.0] * 4)
    return run.updater.update(samples, adv, seed=0)


@pytest.mark.slow  # loads tiny-qwen3 (151,669-token vocabulary) and steps it
def test_the_paper_presets_precision_trains_every_tensor_at_lr_1e6(tmp_path):
    """models.<key>.dtype: bfloat16 at the paper's lr: after one update every trained tensor moved, the weights and the
    AdamW state are float32, and the checkpoint keeps the float32 masters."""
    run = _bf16_run(tmp_path)
    model = run.pool.models["m"].model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = _update(run)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert unchanged == []
    assert metrics["loss/m/update_changed_frac"] == 1.0 and 0 < metrics["loss/m/update_rel"] < 1e-4
    state = run.updater.optimizers["m"].optimizer.state
    assert {t.dtype for s in state.values() for k, t in s.items() if k != "step"} == {torch.float32}
    run.updater.write_state(tmp_path / "ckpt")
    saved = read_weights(tmp_path / "ckpt" / "models" / "m")
    assert {t.dtype for t in saved.values()} == {torch.float32}
    assert torch.equal(saved["model.norm.weight"], model.model.norm.weight.detach())


@pytest.mark.slow  # loads tiny-qwen3 (151,669-token vocabulary) and steps it
def test_training_bf16_weights_directly_is_an_option_that_warns_and_shows(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="drmas_train.model.precision"):
        run = _bf16_run(tmp_path, "optim.master_dtype=model")
    assert "trains its bfloat16 weights directly (optim.master_dtype: model)" in caplog.text
    assert {p.dtype for p in run.pool.models["m"].model.parameters()} == {torch.bfloat16}
    metrics = _update(run)
    assert metrics["loss/m/update_changed_frac"] < 0.1  # the steps round away, and the metric says so
    from drmas_train.algorithm.update_size import stalled_updates
    from drmas_train.run.trainer import _warn_stalled_updates

    assert stalled_updates(metrics) == {"m": metrics["loss/m/update_changed_frac"]}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="drmas_train.run.trainer"):
        _warn_stalled_updates(run, 1, metrics)
        _warn_stalled_updates(run, 2, metrics)  # once per model
    warned = [r for r in caplog.records if "optimizer steps are being rounded away" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING"
    assert "model 'm': iteration 1's update had a non-zero gradient but changed only" in warned[0].getMessage()


def test_stalled_updates_reads_the_namespaced_metrics():
    from drmas_train.algorithm.update_size import stalled_updates

    metrics = {"loss/a/update_changed_frac": 0.02, "loss/a/grad_norm": 0.5,  # rounded away
               "loss/b/update_changed_frac": 0.02, "loss/b/grad_norm": 0.0,  # no gradient: nothing to move
               "loss/c/update_changed_frac": 0.99, "loss/c/grad_norm": 0.5,
               "loss/d/update_changed_frac": float("nan"), "loss/d/grad_norm": 0.5}  # fmt: skip
    assert stalled_updates(metrics) == {"a": 0.02}


@pytest.mark.slow  # loads tiny-qwen3 (151,669-token vocabulary) and steps it
def test_a_lora_adapter_over_a_bf16_base_trains_in_float32(tmp_path):
    run = _bf16_run(tmp_path, "models.m.lora={r: 4, alpha: 8}")
    model = run.pool.models["m"].model
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and {p.dtype for p in trained.values()} == {torch.float32}
    assert {p.dtype for n, p in model.named_parameters() if not p.requires_grad} == {torch.bfloat16}
    before = {n: p.detach().clone() for n, p in trained.items()}
    metrics = _update(run)
    # LoRA's B starts at 0, so A gets no gradient in the first step: every B moves, and every weight with a gradient
    moved = {n for n, p in trained.items() if not torch.equal(p.detach(), before[n])}
    assert {n for n in trained if "lora_B" in n} <= moved
    assert metrics["loss/m/update_changed_frac"] == 1.0
