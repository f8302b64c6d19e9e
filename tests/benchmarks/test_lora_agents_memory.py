"""benchmarks/perf/lora_agents_memory.py: its arms are valid configs of the math team, and one short run of two arms
shows the base held once (parameter bytes, not timings or peak RSS, which depend on the machine)."""

from __future__ import annotations

import json

import pytest

from helpers.scripts import load_script

bench = load_script("benchmarks/perf/lora_agents_memory.py")


@pytest.mark.parametrize("arm", bench.ARMS)
def test_every_arm_is_a_valid_math_team(tmp_path, arm):
    from drmas_train.run.config import load_config
    from drmas_train.run.models import model_specs

    yaml = tmp_path / "arm.yaml"
    yaml.write_text(json.dumps({"extends": "quickstart_math", **bench.arm_models(arm, "tiny-llama")}))
    specs = model_specs(load_config(str(yaml)))
    assert sorted(specs) == ["solver", "verifier"]
    ids = {s.model_id for s in specs.values()}
    assert len(ids) == 2  # two trainable models (or adapters) in every arm
    assert all((s.adapter is not None) == (arm == "lora_per_agent") for s in specs.values())
    assert all((s.lora is not None) == (arm != "full") for s in specs.values())


def test_unknown_arm():
    with pytest.raises(ValueError, match="unknown arm 'x'; accepted: full, lora_per_model, lora_per_agent"):
        bench.arm_models("x", "tiny-llama")


@pytest.mark.slow
def test_one_base_holds_half_the_parameters_of_two_models(capsys):
    assert bench.main(["--model", "tiny-llama", "--iterations", "1", "--max-new-tokens", "4",
                       "--arms", "full,lora_per_agent"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    full, lora = out["arms"]["full"], out["arms"]["lora_per_agent"]
    # one base plus the two adapters' float32 weights, where two full models hold two bases
    adapters_mb = 4 * lora["trainable_parameters"] / 2**20
    assert lora["held_parameter_mb"] == pytest.approx(full["held_parameter_mb"] / 2 + adapters_mb, rel=1e-9)
    assert lora["trainable_parameters"] < 0.5 * full["trainable_parameters"]
    assert full["adamw_state_mb"] == pytest.approx(2 * 4 * full["trainable_parameters"] / 2**20)
    assert {"peak_rss_mb", "wall_s", "loadavg_before"} <= set(full) | set(out)
