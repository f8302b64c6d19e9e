"""Fixtures of the distributed tests: one local Ray for the whole folder (start-up paid once), tiny models.

Ray runs on 127.0.0.1 with 4 logical CPUs (more than the 2 physical cores of CI; the workers take turns).
Workers import ``tiny_rl`` (tests/train) by reference, so that folder goes on their PYTHONPATH.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

TRAIN_TESTS = str(Path(__file__).resolve().parent.parent / "train")
if TRAIN_TESTS not in sys.path:
    sys.path.insert(0, TRAIN_TESTS)



@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray (4 logical CPUs, no dashboard), shut down after the distributed tests."""
    ray = pytest.importorskip("ray")
    from drmas_train.distributed.cluster import init_ray

    os.environ["PYTHONPATH"] = os.pathsep.join([TRAIN_TESTS, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = not ray.is_initialized()
    resources = init_ray(None, num_cpus=4)
    yield resources
    if started:
        ray.shutdown()


def tiny_samples(model, n: int = 8, seed: int = 0, model_id: str = "m"):
    """``n`` on-policy samples (old log-probs = the model's own) of random tiny-vocabulary token ids."""
    from drmas_train.collect.samples import Sample
    from drmas_train.model.logprobs import forward_logprobs

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = rng.integers(4, 20, int(rng.integers(2, 6))).tolist()
        r = rng.integers(4, 20, int(rng.integers(1, 5))).tolist()
        out.append(Sample(f"u{i % 2}", f"t{i}", "a", model_id, 0, 0, p, r, [0.0] * len(r), [1] * len(r)))
    with torch.no_grad():
        lp, _, _ = forward_logprobs(model, [s.prompt_ids for s in out], [s.response_ids for s in out], pad_token_id=0)
    for b, s in enumerate(out):
        s.old_logprobs = lp[b, : len(s.response_ids)].tolist()
    return out
