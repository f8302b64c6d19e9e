"""The real-vLLM-on-CPU hook (:mod:`drmas_train.distributed.vllm_cpu`): venv discovery, the checks on the venv's
interpreter (vLLM floor, Ray version), the config overrides and the head-size check. The interpreter is faked with a
shell script printing what the real probe prints; the real venv is exercised by ``scripts/vllm_cpu_check.sh``."""

from __future__ import annotations

import json
import re
import sys
from types import SimpleNamespace

import pytest
import ray

from drmas_train.distributed import vllm_cpu
from drmas_train.run.config import load_config


def fake_python(tmp_path, vllm="0.32.0", ray_version=None, code=0):
    """An executable that answers the probe like a venv with ``vllm`` and ``ray_version`` (default: this Ray)."""
    info = {
        "vllm": vllm,
        "ray": ray_version or ray.__version__,
        "platform": "CpuPlatform",
        "sleep_mode_available": False,
    }
    path = tmp_path / "venv" / "bin" / "python"
    path.parent.mkdir(parents=True)
    body = (
        f"echo '{json.dumps(info)}'" if code == 0 else "echo 'ModuleNotFoundError: No module named vllm' >&2"
    )
    path.write_text(f"#!/bin/sh\n{body}\nexit {code}\n")
    path.chmod(0o755)
    vllm_cpu.probe_vllm_python.cache_clear()
    return path


def test_default_venv_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DRMAS_VLLM_VENV", str(tmp_path / "v"))
    assert vllm_cpu.default_vllm_venv() == tmp_path / "v"
    monkeypatch.delenv("DRMAS_VLLM_VENV")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert vllm_cpu.default_vllm_venv() == tmp_path / "cache" / "drmas" / "vllm-cpu-venv"


def test_a_usable_venv_is_found(tmp_path):
    python = fake_python(tmp_path)
    assert vllm_cpu.find_vllm_python(tmp_path / "venv") == str(python)
    info = vllm_cpu.probe_vllm_python(str(python))
    assert (info["vllm"], info["sleep_mode_available"]) == ("0.32.0", False)


@pytest.mark.parametrize("kwargs, message", [
    ({"vllm": "0.15.1"}, "vLLM 0.15.1 is installed; drmas needs vLLM >= 0.16.0"),
    ({"ray_version": "2.0.0"}, "has Ray 2.0.0, this process Ray"),
    ({"code": 1}, "does not import vLLM and Ray (ModuleNotFoundError: No module named vllm)"),
])  # fmt: skip
def test_an_unusable_venv_is_refused_with_the_reason(tmp_path, kwargs, message, caplog):
    python = fake_python(tmp_path, **kwargs)
    with pytest.raises(vllm_cpu.VLLMCPUUnavailable, match=re.escape(message)):
        vllm_cpu.probe_vllm_python(str(python))
    vllm_cpu.probe_vllm_python.cache_clear()
    with caplog.at_level("INFO", logger="drmas_train.distributed.vllm_cpu"):
        assert vllm_cpu.find_vllm_python(tmp_path / "venv") is None
    assert message in caplog.text


def test_no_interpreter(tmp_path):
    with pytest.raises(
        vllm_cpu.VLLMCPUUnavailable, match=re.escape(f"no interpreter at {tmp_path}/bin/python")
    ):
        vllm_cpu.probe_vllm_python(str(tmp_path / "bin" / "python"))


def test_overrides_make_a_cpu_run_use_vllm_generation_workers():
    overrides = vllm_cpu.vllm_cpu_overrides("/opt/vllm/bin/python")
    cfg = load_config("quickstart_math", ["distributed.enabled=true", *overrides])
    d = cfg.distributed
    assert (d.devices_per_node, d.generation_engine, d.vllm_allow_cpu, d.vllm_python) == (
        0, "vllm", True, "/opt/vllm/bin/python")  # fmt: skip
    assert d.vllm_kwargs == {"enforce_eager": True}


def test_head_sizes_of_vllm_cpu_attention():
    from drmas_train.model.models import ModelSpec
    from helpers.tiny_rl import tiny_loader

    tiny = tiny_loader(ModelSpec("tiny-llama"), "m").model.config  # head_dim 16
    with pytest.raises(
        ValueError, match=re.escape("the model has head_dim=16; build the tiny model with one of them")
    ):
        vllm_cpu.check_vllm_cpu_model(tiny)
    vllm_cpu.check_vllm_cpu_model(SimpleNamespace(head_dim=64))  # SmolLM2-135M
    vllm_cpu.check_vllm_cpu_model(
        SimpleNamespace(head_dim=None, hidden_size=128, num_attention_heads=4)
    )  # head_dim 32
    with pytest.raises(ValueError, match="head_dim=48"):
        vllm_cpu.check_vllm_cpu_model(SimpleNamespace(hidden_size=96, num_attention_heads=2))


def test_this_environment_without_vllm_is_reported_not_raised():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is importable here")
    vllm_cpu.probe_vllm_python.cache_clear()
    with pytest.raises(vllm_cpu.VLLMCPUUnavailable, match="does not import vLLM and Ray"):
        vllm_cpu.probe_vllm_python(sys.executable)
