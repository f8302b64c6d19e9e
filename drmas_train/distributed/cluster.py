"""Start or join the Ray cluster that holds the worker groups.

``distributed.address: null`` starts a local Ray bound to the loopback address only (``127.0.0.1``), without
the dashboard unless ``distributed.dashboard`` is true; any other value joins that cluster with
``ray.init(address=...)`` (``auto`` = the cluster this machine belongs to, ``ray://host:10001`` = a remote head).
"""

from __future__ import annotations

import os
from typing import Any

import ray

__all__ = ["init_ray"]


def init_ray(
    address: str | None = None, *, dashboard: bool = False, num_cpus: int | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Start a local Ray (loopback only) or join ``address``; a no-op when Ray is already initialised.

    Args:
        address: None = a local Ray on 127.0.0.1; else passed to ``ray.init(address=...)``.
        dashboard: start the dashboard (local Ray only).
        num_cpus: logical CPUs of a local Ray (default: the machine's). May exceed the physical cores.
        kwargs: more ``ray.init`` arguments.

    Returns:
        ``ray.cluster_resources()`` (e.g. ``{"CPU": 4.0, "GPU": 0.0, ...}``).
    """
    if not ray.is_initialized():
        if address is None:
            # local workers import drmas (and test helpers) from the driver's PYTHONPATH and stay offline like it
            env_vars = {k: os.environ[k] for k in ("PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "DRMAS_CACHE")
                        if k in os.environ}  # fmt: skip
            ray.init(num_cpus=num_cpus, include_dashboard=dashboard, _node_ip_address="127.0.0.1", dashboard_host="127.0.0.1",
                     runtime_env={"env_vars": env_vars} if env_vars else None, log_to_driver=False, **kwargs)  # fmt: skip
        else:  # a cluster: drmas must be installed on its nodes (or shipped with a runtime_env in kwargs)
            ray.init(address=address, **kwargs)
    return {k: float(v) for k, v in ray.cluster_resources().items()}
