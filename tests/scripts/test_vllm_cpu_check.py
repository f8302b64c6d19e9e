"""scripts/vllm_cpu_check.sh / .py without vLLM: argument and venv-location errors (one JSON line, exit 2) and the
measuring helpers (the log-prob difference, the perturbed state dict) on a tiny model. The real-engine run is the
script itself (its measured output: docs/scaling.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from drmas_train.backends.base import Generation
from drmas_train.model.models import load_model
from helpers.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _script():
    return load_script("scripts/vllm_cpu_check.py")


def test_a_venv_inside_the_repository_is_refused(tmp_path):
    venv = str(ROOT / "venv")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": sys.executable, "DRMAS_VLLM_VENV": venv}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "vllm_cpu_check.sh")], capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert json.loads(line) == {"ok": False, "error": f"DRMAS_VLLM_VENV={ROOT / 'venv'} is inside the repository; "
                                                      "put the vLLM venv elsewhere"}  # fmt: skip


def test_bad_arguments_exit_2_with_one_json_line():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "vllm_cpu_check.py"), "--max-new-tokens", "0"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2
    assert json.loads(proc.stdout.splitlines()[-1])["error"] == "--max-new-tokens and --threads must be >= 1"


def test_logprob_diff_is_zero_for_the_forward_pass_own_values_and_counts_tokens():
    from drmas_train.model.logprobs import forward_logprobs

    check = _script()
    model = load_model("tiny-llama").model.eval()
    prompts, responses = [[4, 5, 6], [7, 8]], [[9, 10], [11, 12, 13]]
    with torch.no_grad():
        lp, _, _ = forward_logprobs(model, prompts, responses, pad_token_id=0, temperature=0.7)
    gens = [Generation(text="", prompt_ids=p, response_ids=r, logprobs=lp[i, : len(r)].tolist(), finish_reason="length")
            for i, (p, r) in enumerate(zip(prompts, responses, strict=True))]  # fmt: skip
    d = check.logprob_diff(model, gens, 0, 0.7)
    assert d["tokens"] == 5 and d["max"] < 1e-6
    gens[1].logprobs[2] += 0.5  # one token off by 0.5 nats: max 0.5, mean 0.1 over the 5 tokens
    d = check.logprob_diff(model, gens, 0, 0.7)
    assert abs(d["max"] - 0.5) < 1e-5 and abs(d["mean"] - 0.1) < 1e-5


def test_perturbed_state_keeps_names_shapes_and_changes_every_varying_tensor():
    check = _script()
    state = load_model("tiny-llama").model.state_dict()
    new = check.perturbed(state)
    assert list(new) == list(state) and all(new[k].shape == state[k].shape for k in state)
    varying = [k for k, t in state.items() if t.is_floating_point() and t.numel() > 1 and t.std() > 0]
    assert varying and all(not torch.equal(new[k], state[k]) for k in varying)
    # e.g. the norms, initialised to 1
    assert all(torch.equal(new[k], state[k]) for k in state if k not in varying)
    again = check.perturbed(state)  # a fixed generator: the same noise
    assert all(torch.equal(new[k], again[k]) for k in state)
