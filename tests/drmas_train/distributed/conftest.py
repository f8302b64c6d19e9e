"""Fixtures of the distributed tests: one local Ray for the whole folder (start-up paid once).

Ray runs on 127.0.0.1 with 4 logical CPUs (more than the 2 physical cores of CI; the workers take turns).
Workers import helpers (e.g. ``helpers.tiny_rl.tiny_loader``) by reference: tests/conftest.py has put tests/ on
the ``PYTHONPATH`` they inherit.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray (4 logical CPUs, no dashboard), shut down after the distributed tests."""
    ray = pytest.importorskip("ray")
    from drmas_train.distributed.cluster import init_ray

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = not ray.is_initialized()
    resources = init_ray(None, num_cpus=4)
    yield resources
    if started:
        ray.shutdown()
