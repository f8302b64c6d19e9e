"""Several LoRA adapters on one base model, one per agent (``models.<key>.adapters``, ``agents.<a>: <key>:<adapter>``).

Checked on the tiny env of tests/helpers/tiny_rl.py: the base is loaded once and held once (every adapter's model is
the same ``PeftModel`` object, its base tensors the same storage), it stays frozen, each adapter trains its own
weights with its own optimizer, the checkpoint holds one folder per adapter (PEFT's layout) and one optimizer state
per adapter, and a resumed run reads them back exactly.
"""

from __future__ import annotations

import pytest
import torch

from drmas_train.errors import ConfigError
from drmas_train.model.adapters import adapter_parameters
from drmas_train.model.models import ModelSpec
from helpers.tiny_rl import tiny_config, tiny_loader

ADAPTERS = [
    "models.m.adapters.one.r=2", "models.m.adapters.one.alpha=4", "models.m.adapters.one.target_modules=[q_proj,v_proj]",
    "models.m.adapters.two.r=2", "models.m.adapters.two.alpha=4", "models.m.adapters.two.target_modules=[q_proj,v_proj]",
    "agents.a=m:one", "agents.b=m:two",
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "message"), [
    (["models.m.adapters.x.r=2"], r"agents.a='m': models.m holds adapters \['x'\]; name one, e.g. agents.a=m:x"),
    (["agents.a=m:x"], r"agents.a='m:x': models.m has no adapters; name the model alone"),
    (["models.m.adapters.x.r=2", "agents.a=m:y", "agents.b=m:x"], r"models.m has no adapter 'y'; its adapters: \['x'\]"),
    (["models.m.adapters.x.r=2", "models.m.lora.r=2", "agents.a=m:x", "agents.b=m:x"], r"give lora .* or adapters"),
    (["models.m.adapters.x.r=2", "agents.a=m:x", "agents.b=m:x", "distributed.enabled=true"],
     r"models.m.adapters with distributed.enabled=true"),
    (["models.m.adapters.x.r=2", "agents.a=m:x", "agents.b=m:x", "models.m.backend=vllm"], r"accepted: hf"),
    (["models.m.adapters.x.r=2", "agents.a=m:x", "agents.b=m:x", "algorithm.estimator=gae"],
     r"algorithm.estimator=gae with models.m.adapters: a critic starts from its policy's weights"),
    (["models.m.adapters.x\\.1.r=2", "agents.a=m:x", "agents.b=m:x"], r"adapter names take letters"),
    (["models.m.adapters.ora.r=2", "agents.a=m:ora", "agents.b=m:ora"], r"not a part of 'lora_'"),
])  # fmt: skip
def test_adapter_config_errors(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path / "run", *overrides)


def test_adapter_spec_errors():
    with pytest.raises(ValueError, match="needs lora"):
        ModelSpec("tiny", adapter="x")
    with pytest.raises(ValueError, match="not both"):
        ModelSpec("tiny", lora={"r": 2}, adapter_path="/x")


def _storages(pool) -> dict[int, int]:
    """data_ptr -> bytes of every distinct parameter storage held by the pool's models."""
    out = {}
    for loaded in pool.models.values():
        for p in loaded.model.parameters():
            out[p.untyped_storage().data_ptr()] = p.untyped_storage().nbytes()
    return out


def test_one_base_two_adapters_train_apart_and_round_trip(tmp_path):
    from drmas_train.run.checkpoint import latest_checkpoint
    from drmas_train.run.trainer import build_run, train

    cfg = tiny_config(tmp_path / "run", "run.iterations=3", "run.save_every=1", *ADAPTERS)
    base = tiny_loader(ModelSpec("tiny", seed=cfg.seed), "m").model.state_dict()
    loads = []

    def loader(spec, model_id):
        loads.append((spec.adapter, spec.lora, model_id))
        return tiny_loader(spec, model_id)

    run = build_run(cfg, loader=loader)
    assert len(loads) == 1 and loads[0][:2] == (None, None)  # the base, loaded once, without an adapter
    pool = run.pool
    a, b = pool.models["m:one"], pool.models["m:two"]
    assert a.model is b.model  # one PeftModel for both adapters
    base_a = {n: p.data_ptr() for n, p in a.model.get_base_model().named_parameters() if "lora_" not in n}
    base_b = {n: p.data_ptr() for n, p in b.model.get_base_model().named_parameters() if "lora_" not in n}
    assert base_a == base_b  # the base weights are held once
    held = sum(_storages(pool).values())
    base_bytes = sum(t.numel() * t.element_size() for t in base.values())
    assert held < 1.2 * base_bytes  # one base (+ two small adapters), not two
    params_a, params_b = adapter_parameters(a), adapter_parameters(b)
    assert len(params_a) == len(params_b) == 4  # lora_A, lora_B of q_proj and v_proj in one layer
    assert not {id(p) for p in params_a} & {id(p) for p in params_b}
    assert [p for g in run.updater.optimizers["m:one"].optimizer.param_groups for p in g["params"]] == params_a
    assert [p for g in run.updater.optimizers["m:two"].optimizer.param_groups for p in g["params"]] == params_b
    run.logger.close()

    train(cfg, loader=tiny_loader, overwrite=True)
    ckpt = latest_checkpoint(tmp_path / "run" / "checkpoints")
    for name in ("one", "two"):
        assert (ckpt / "models" / "m" / name / "adapter_model.safetensors").is_file()
        assert (ckpt / "optim" / "m" / f"{name}.pt").is_file()
    assert (ckpt / "models" / "m" / "tokenizer_config.json").is_file()

    resumed = build_run(tiny_config(tmp_path / "run", "run.iterations=4", "run.save_every=1", *ADAPTERS),
                        resume=True, loader=tiny_loader)  # fmt: skip
    model = resumed.pool.models["m:one"].model
    for n, p in model.get_base_model().named_parameters():
        if "lora_" not in n:  # the base never trains
            assert torch.equal(p, base[n.replace("base_layer.", "")]), n
    from safetensors.torch import load_file

    weights = {}
    for name in ("one", "two"):
        saved = load_file(ckpt / "models" / "m" / name / "adapter_model.safetensors")
        mine = dict(zip([n for n, _ in model.named_parameters() if f".{name}." in n and "lora_" in n],
                        adapter_parameters(resumed.pool.models[f"m:{name}"]), strict=True))  # fmt: skip
        assert len(saved) == len(mine) == 4
        for key, tensor in saved.items():  # PEFT saves keys without the adapter name
            match = [v for n, v in mine.items() if n.replace(f".{name}.", ".") == key]
            assert len(match) == 1 and torch.equal(match[0], tensor), key
        weights[name] = {k: v for k, v in saved.items() if "lora_B" in k}
        assert all(v.abs().max() > 0 for v in weights[name].values())  # B starts at 0: the adapter trained
    assert any(
        not torch.equal(weights["one"][k], weights["two"][k]) for k in weights["one"]
    )  # different weights
    assert resumed.updater.optimizers["m:one"].optimizer.state_dict()["state"]  # AdamW moments restored
    resumed.logger.close()


@pytest.mark.slow
def test_a_lora_per_agent_checkpoint_plays_in_eval_on_one_base(tmp_path):
    """``drmas eval --team`` of a LoRA-per-agent checkpoint: each role's adapter on the run's base, the base loaded
    once for both, and each adapter giving the trained policy's log-probs exactly (the tiny model, whose rewards vary
    so the adapters train; then tiny-llama, a named model, through the command line)."""
    import json

    from drmas_train.backends.factory import build_models
    from drmas_train.commands import eval as eval_cmd
    from drmas_train.model.adapters import activate
    from drmas_train.model.logprobs import forward_logprobs
    from drmas_train.run.run_models import team_model
    from drmas_train.run.trainer import build_run, train

    cfg = tiny_config(tmp_path / "run", "run.iterations=2", "run.name=lora", *ADAPTERS)
    train(cfg, loader=tiny_loader)
    ckpt = tmp_path / "run" / "checkpoints" / "iter_000002"
    specs = {role: team_model(str(ckpt), role) for role in ("a", "b")}
    assert specs["a"] == {"name_or_path": "tiny", "dtype": "float32", "device": "cpu", "seed": 0,
                          "chat_template_kwargs": {}, "adapter_path": str(ckpt / "models" / "m" / "one"),
                          "adapter": "one_it2", "trainable": False, "model_id": "lora/iter_2/m:one"}  # fmt: skip
    loads = []
    pool = build_models(
        specs, env_agents=["a", "b"], loader=lambda spec, mid: loads.append(mid) or tiny_loader(spec, mid)
    )
    assert len(loads) == 1  # the base, once
    assert pool.models["lora/iter_2/m:one"].model is pool.models["lora/iter_2/m:two"].model
    trained = build_run(tiny_config(tmp_path / "run", "run.iterations=3", "run.name=lora", *ADAPTERS), resume=True,
                        loader=tiny_loader)  # fmt: skip
    prompt, response = [[5, 6, 7, 8]], [[9, 10, 11]]
    for name in ("one", "two"):
        mine, theirs = pool.models[f"lora/iter_2/m:{name}"], trained.pool.models[f"m:{name}"]
        activate(mine)
        activate(theirs)
        with torch.no_grad():
            got = forward_logprobs(mine.model, prompt, response, pad_token_id=0)[0]
            want = forward_logprobs(theirs.model, prompt, response, pad_token_id=0)[0]
            with mine.model.disable_adapter():
                base = forward_logprobs(mine.model, prompt, response, pad_token_id=0)[0]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        assert float((got - base).abs().max()) > 1e-5  # the adapter trained: not the base's policy
    trained.logger.close()

    named = tiny_config(tmp_path / "named", "run.iterations=1", "models.m.name_or_path=tiny-llama", "run.name=named",
                        *ADAPTERS)  # fmt: skip
    train(named)
    ckpt = tmp_path / "named" / "checkpoints" / "iter_000001"
    out = tmp_path / "eval"
    argv = ["--preset", str(tmp_path / "named" / "config.yaml"), "--team", f"a={ckpt},b={ckpt}", "--k", "1",
            "--limit", "2", "--no-progress", "--out", str(out)]  # fmt: skip
    assert eval_cmd.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["agent_models"] == {"a": "named/iter_1/m:one", "b": "named/iter_1/m:two"}
    assert summary["num_episodes"] == 2
