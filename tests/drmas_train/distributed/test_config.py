"""The ``distributed`` config section, world-size planning and chunk seeds (no Ray needed)."""

from __future__ import annotations

import re

import pytest

from drmas_train.distributed.data_parallel import resolve_strategy
from drmas_train.distributed.generation_engines import chunk_seed
from drmas_train.distributed.resource_pool import plan_world_sizes
from drmas_train.run.config import ConfigError, load_config


def test_defaults_keep_the_single_process_path():
    d = load_config().distributed
    assert (d.enabled, d.address, d.num_nodes, d.devices_per_node, d.cpus_per_worker, d.colocate, d.world_size,
            d.strategy, d.max_restarts, d.dashboard) == (False, None, 1, 0, 1, True, {}, "auto", 2, False)  # fmt: skip


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("distributed.num_nodes=0", "distributed.num_nodes must be >= 1, got 0"),
        ("distributed.cpus_per_worker=0", "distributed.cpus_per_worker must be >= 1, got 0"),
        ("distributed.devices_per_node=-1", "distributed.devices_per_node must be >= 0 (0 = CPU-only), got -1"),
        ("distributed.max_restarts=-1", "distributed.max_restarts must be >= 0, got -1"),
        ("distributed.strategy=zero3", "distributed.strategy='zero3'; accepted: ['auto', 'fsdp2', 'ddp']"),
        ("distributed.rank_host_memory=lean", "distributed.rank_host_memory='lean'; accepted: ['release', 'keep']"),
        ("distributed.world_size.sharde=2", "distributed.world_size.sharde names no model; defined models: ['shared']. Did you mean 'shared'?"),
        ("distributed.world_size.shared=0", "distributed.world_size.shared must be an int >= 1, got 0"),
    ],
)  # fmt: skip
def test_bad_values_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [override])


def test_enabled_rejects_vllm_and_explicit_devices():
    with pytest.raises(ConfigError, match=re.escape("models.shared.backend='vllm' with distributed.enabled=true; accepted: hf")):
        load_config(None, ["distributed.enabled=true", "models.shared.backend=vllm"])
    with pytest.raises(ConfigError, match=re.escape("models.shared.device='cuda:1' with distributed.enabled=true")):
        load_config(None, ["distributed.enabled=true", "models.shared.device=cuda:1"])
    assert load_config(None, ["distributed.enabled=true", "distributed.world_size.shared=2"]).distributed.world_size == {"shared": 2}


def test_plan_world_sizes():
    # colocated: every group spans all bundles by default; the pool is as large as the largest group
    assert plan_world_sizes(["a", "b"], {}, 4, colocate=True) == ({"a": 4, "b": 4}, 4)
    assert plan_world_sizes(["a", "b"], {"a": 2}, 4, colocate=True) == ({"a": 2, "b": 4}, 4)
    assert plan_world_sizes(["a", "b"], {"a": 1, "b": 2}, None, colocate=True) == ({"a": 1, "b": 2}, 2)
    # split: an even split of what the fixed sizes leave, the pool is the sum
    assert plan_world_sizes(["a", "b", "c"], {}, 5, colocate=False) == ({"a": 2, "b": 2, "c": 1}, 5)
    assert plan_world_sizes(["a", "b"], {"a": 3}, 4, colocate=False) == ({"a": 3, "b": 1}, 4)
    with pytest.raises(ValueError, match=re.escape("needs 5 bundles (sum over models) but the cluster holds 4")):
        plan_world_sizes(["a", "b"], {"a": 3, "b": 2}, 4, colocate=False)
    with pytest.raises(ValueError, match="cannot give"):
        plan_world_sizes(["a", "b"], {"a": 4}, 4, colocate=False)
    with pytest.raises(ValueError, match=re.escape("needs 8 bundles (max over models) but the cluster holds 4")):
        plan_world_sizes(["a"], {"a": 8}, 4, colocate=True)


def test_chunk_seeds_are_fixed_per_chunk_and_distinct():
    assert chunk_seed(123, 0, 1) == 123 and chunk_seed(None, 1, 2) is None  # one chunk: the call's own seed
    seeds = [chunk_seed(123, i, 4) for i in range(4)]
    assert len(set(seeds)) == 4 and seeds == [chunk_seed(123, i, 4) for i in range(4)]  # a re-issue draws the same
    assert chunk_seed(124, 0, 4) != seeds[0]


def test_resolve_strategy():
    assert resolve_strategy("auto", "cpu") == resolve_strategy("auto", "cuda") == "fsdp2"
    assert resolve_strategy("ddp", "cpu") == "ddp"
    with pytest.raises(ValueError, match=re.escape("unknown distributed strategy 'zero'; accepted: ['auto', 'fsdp2', 'ddp']")):
        resolve_strategy("zero", "cpu")
