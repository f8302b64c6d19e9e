"""``scripts/gpu_check.sh``: the whole check on CPU with tiny sizes (one JSON line, exit codes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--device", "cpu", "--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--iterations", "2",
        "--tasks", "2", "--group-size", "2", "--max-new-tokens", "6", "--fsdp-steps", "1", "--threads", "1"]  # fmt: skip


def run_check(*args: str, timeout: int = 900) -> tuple[int, list[str], str]:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args],
        capture_output=True, text=True, timeout=timeout,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "HOME": str(Path.home())},
    )  # fmt: skip
    return proc.returncode, proc.stdout.splitlines(), proc.stderr


@pytest.mark.slow
def test_cpu_run_prints_one_json_line_with_the_figures():
    """The CUDA check's own precision on the CPU: bf16 compute over float32 master weights at lr 1e-6."""
    code, lines, err = run_check(*TINY, "--dtype", "bfloat16")
    assert code == 0, err[-3000:]
    assert len(lines) == 1, lines  # the trainer's own lines went to stderr
    out = json.loads(lines[0])
    assert out["ok"] is True and out["loss_finite"] is True and out["dtype"] == "bfloat16"
    assert out["weights_moved"] is True and out["single"]["update_changed_frac_min"] > 0.9
    assert out["fsdp"]["update_changed_frac"] > 0.9 and out["fsdp"]["compute_dtype"] == "bfloat16"
    # vocab 384 x 32 (tied) + one layer (q 32x32, k/v 32x16, o 32x32, q/k norms 16+16, MLP 3 x 32x88, 2 norms of 32)
    # + final norm 32
    assert out["model"] == {"arch": "Qwen3ForCausalLM", "params": 12288 + 11616 + 32, "hidden": 32, "layers": 1,
                            "vocab": 384}  # fmt: skip
    single, fsdp = out["single"], out["fsdp"]
    assert single["iterations"] == 2 and single["samples_per_iteration"] == 2 * 2 * 2  # N x G episodes x 2 agents  # fmt: skip
    assert single["rollout_tokens_per_s"] > 0 and single["update_tokens_per_s"] > 0 and single["peak_gpu_mem_mb"] is None  # fmt: skip
    assert fsdp["backend"] == "gloo" and fsdp["world_size"] == 1 and fsdp["steps"] == 1
    assert fsdp["checkpoint_roundtrip"] is True and fsdp["loss_finite"] is True and fsdp["update_tokens_per_s"] > 0  # fmt: skip
    assert out["torch"] and out["transformers"] and out["device"].startswith("cpu")


def _script():
    """scripts/gpu_check.py imported as a module (its main() runs in this process)."""
    return load_script("scripts/gpu_check.py")


def test_bad_arguments_exit_2_with_a_json_error(capsys):
    assert _script().main(["--device", "cpu", "--hidden", "30", "--heads", "4"]) == 2
    out = json.loads(capsys.readouterr().out.strip())
    assert out["error"] == "--hidden (30) must divide by --heads (4), which must divide by --kv-heads (4)"


def test_cuda_requested_without_a_gpu_exits_3(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert _script().main(["--device", "cuda"]) == 3
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["ok"] is False and out["error"].startswith("CUDA is not available")
