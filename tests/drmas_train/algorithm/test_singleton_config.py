"""``algorithm.singleton`` reaches the estimator: a lone call in its (group, agent) gets the reference's raw score
/ (1 + eps) by default (``raw``, langfengQ/DrMAS ``verl/trainer/ppo/core_algos.py:553-566``) and A = 0 with ``zero``
(see docs/fidelity.md, Advantages)."""

from __future__ import annotations

import numpy as np
import pytest

from drmas_train.collect.samples import Sample
from drmas_train.run.config import ConfigError, load_config, validate_config
from drmas_train.run.trainer import compute_advantages


def _samples():
    # group u0: the verifier called twice (scores 1 and 0), the search agent once (a lone call, score 1)
    rows = [("verifier", 1.0), ("verifier", 0.0), ("search", 1.0)]
    out = []
    for k, (agent, r) in enumerate(rows):
        s = Sample("u0", f"t{k}", agent, "m", 0, 0, [1], [2], [0.0], [1])
        s.reward = r
        out.append(s)
    return out


@pytest.mark.parametrize(("mode", "lone"), [("zero", 0.0), ("raw", 1.0 / (1.0 + 1e-6))])
def test_singleton_mode_reaches_the_estimator(mode, lone):
    cfg = load_config("quickstart_math", [f"algorithm.singleton={mode}"])
    adv = compute_advantages(cfg, _samples())
    # the verifier's pair: (1 - 0.5) / (std_unbiased=0.7071 + 1e-6) and its negative, whatever the singleton mode
    pair = 0.5 / (np.sqrt(0.5) + 1e-6)
    np.testing.assert_allclose(adv, [pair, -pair, lone], rtol=1e-12)


def test_unknown_singleton_mode_is_a_config_error():
    assert load_config("quickstart_math").algorithm.singleton == "raw"  # the reference's rule is the default
    with pytest.raises(ConfigError, match=r"algorithm.singleton='mean'; accepted: raw, zero"):
        load_config("quickstart_math", ["algorithm.singleton=mean"])
    cfg = load_config("quickstart_math")
    cfg.algorithm.singleton = "Raw"  # set in code, then checked before a run
    with pytest.raises(ConfigError, match=r"algorithm.singleton='Raw'; accepted: raw, zero"):
        validate_config(cfg)
