"""The distributed variants of the paper presets (``drmas_train/configs/*_dist.yaml``): each is its base preset
plus a ``distributed:`` section, its own ``run.dir`` and the driver-side model placement the Ray path requires."""

from __future__ import annotations

import dataclasses

import pytest

from drmas_train.run.config import TrainConfig, list_presets, load_config

#: base preset -> GPUs of its distributed variant (Qwen3-4B math: 4, search: 8, as in the paper; the 8B math
#: presets get 8, twice the 4B's parameter memory, see docs/scaling.md).
GPUS = {
    "drmas_math_qwen3_4b": 4, "drmas_math_qwen3_4b_nonsharing": 4, "drmas_math_qwen3_4b_hetero": 4,
    "drmas_math_qwen3_8b": 8, "drmas_math_qwen3_8b_nonsharing": 8,
    "drmas_search_qwen25_3b": 8, "drmas_search_qwen25_3b_nonsharing": 8, "drmas_search_qwen25_3b_hetero": 8,
    "drmas_search_qwen25_7b": 8, "drmas_search_qwen25_7b_nonsharing": 8,
}  # fmt: skip
HAS_SECTION = "distributed" in {f.name for f in dataclasses.fields(TrainConfig)}


def test_every_paper_preset_has_a_distributed_variant():
    names = set(list_presets())
    paper = {n for n in names if n.startswith(("drmas_", "grpo_")) and not n.endswith("_dist")}
    assert {n.replace("grpo_", "drmas_", 1) for n in paper} == set(GPUS)
    assert {n for n in names if n.endswith("_dist")} == {f"{n}_dist" for n in paper}


@pytest.mark.skipif(not HAS_SECTION, reason="TrainConfig has no 'distributed' section yet (added by issue 12's Ray path)")
@pytest.mark.parametrize("base", sorted(GPUS) + sorted(n.replace("drmas_", "grpo_", 1) for n in GPUS))
def test_a_distributed_variant_adds_only_the_distributed_section(base):
    cfg, ref = load_config(f"{base}_dist"), load_config(base)
    gpus = GPUS[base.replace("grpo_", "drmas_", 1)]
    d = cfg.distributed
    assert (d.enabled, d.address, d.num_nodes, d.devices_per_node, d.colocate, d.strategy) == (True, None, 1, gpus, True, "fsdp2")
    assert d.world_size == {model: gpus for model in cfg.models}  # colocated: every group spans every GPU
    assert cfg.run.dir == f"runs/{base}_dist" and cfg.run.name == f"{base}_dist"
    # the same models, as the driver's CPU copy with the HF engine (workers place their own copies on GPUs)
    assert {k: (m.name_or_path, m.dtype) for k, m in cfg.models.items()} == {
        k: (m.name_or_path, m.dtype) for k, m in ref.models.items()
    }
    assert {(m.device, m.backend) for m in cfg.models.values()} == {("cpu", "hf")}
    cfg.distributed, cfg.run.dir, cfg.run.name, cfg.models = ref.distributed, ref.run.dir, ref.run.name, ref.models
    assert cfg == ref
