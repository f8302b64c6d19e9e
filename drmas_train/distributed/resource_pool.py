"""A resource pool over one Ray placement group, shared by the models' worker groups or split between them.

One **bundle** holds one rank of a worker group: ``cpus_per_worker`` CPUs, plus one GPU on GPU nodes. With
``colocate`` every model's group uses the same bundles and they take turns (the Dr. MAS "shared resource
scheduling of LLM actor backends"); Ray sees each of the ``k`` actors sharing a bundle as asking for ``1/k`` of
it. Without ``colocate`` each model gets bundles of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

__all__ = ["ResourcePool", "plan_world_sizes"]


def plan_world_sizes(
    models: Sequence[str], requested: Mapping[str, int], n_bundles: int | None, *, colocate: bool
) -> tuple[dict[str, int], int]:
    """Ranks per model and the number of bundles the pool needs.

    Args:
        models: model ids that get a worker group.
        requested: ``model_id -> ranks`` (``distributed.world_size``; missing models get the default).
        n_bundles: bundles the cluster can hold (None: size the pool from ``requested`` alone).
        colocate: groups share bundles (default ranks: every bundle) or split them (default: an even split).

    Returns:
        ``(world_sizes, pool_bundles)``.

    Raises:
        ValueError: a model asked for more ranks than the pool holds, or too few bundles to give every model one.
    """
    missing = [m for m in models if m not in requested]
    if missing and n_bundles is None:
        raise ValueError(f"models {missing} have no distributed.world_size and the pool size is unknown")
    if colocate:
        sizes = {m: int(requested.get(m, n_bundles or 0)) for m in models}
        need = max(sizes.values(), default=0)
    else:
        fixed = sum(int(requested[m]) for m in models if m in requested)
        free = (n_bundles or 0) - fixed
        if missing and free < len(missing):
            raise ValueError(f"a split pool of {n_bundles} bundles cannot give {missing} a rank each after "
                             f"{fixed} fixed ranks; set distributed.world_size or colocate: true")  # fmt: skip
        share = {m: free // len(missing) + (k < free % len(missing)) for k, m in enumerate(missing)} if missing else {}
        sizes = {m: int(requested[m]) if m in requested else share[m] for m in models}
        need = sum(sizes.values())
    if n_bundles is not None and need > n_bundles:
        raise ValueError(f"distributed.world_size {sizes} needs {need} bundles "
                         f"({'max' if colocate else 'sum'} over models) but the cluster holds {n_bundles}")  # fmt: skip
    return sizes, need


class ResourcePool:
    """``n_bundles`` bundles of ``{"CPU": cpus, "GPU": gpus}`` in one placement group.

    Args:
        n_bundles: bundles (ranks) in the pool (>= 1).
        cpus_per_bundle: CPUs per bundle (>= 1).
        gpus_per_bundle: 0 (CPU workers) or 1.
        strategy: Ray placement strategy (``PACK``: as few nodes as possible; ``SPREAD``; ``STRICT_PACK`` ...).
        timeout_s: how long to wait for the cluster to grant the bundles.

    Raises:
        ValueError: bad sizes. TimeoutError: the cluster could not place the bundles in ``timeout_s``.
    """

    def __init__(self, n_bundles: int, *, cpus_per_bundle: int = 1, gpus_per_bundle: int = 0,
                 strategy: str = "PACK", timeout_s: float = 120.0) -> None:  # fmt: skip
        if n_bundles < 1 or cpus_per_bundle < 1 or gpus_per_bundle not in (0, 1):
            raise ValueError(f"need n_bundles >= 1, cpus_per_bundle >= 1, gpus_per_bundle in (0, 1); got "
                             f"{n_bundles}, {cpus_per_bundle}, {gpus_per_bundle}")  # fmt: skip
        self.n_bundles, self.cpus, self.gpus = n_bundles, cpus_per_bundle, gpus_per_bundle
        bundle = {"CPU": float(cpus_per_bundle)} | ({"GPU": float(gpus_per_bundle)} if gpus_per_bundle else {})
        self.placement_group = placement_group([dict(bundle) for _ in range(n_bundles)], strategy=strategy)
        ready, _ = ray.wait([self.placement_group.ready()], timeout=timeout_s)
        if not ready:
            ray.util.remove_placement_group(self.placement_group)
            raise TimeoutError(f"the Ray cluster could not place {n_bundles} bundles of {bundle} in {timeout_s:.0f} s; "
                               f"cluster resources: {ray.cluster_resources()}")  # fmt: skip
        self._next = 0  # first free bundle of a split pool

    def take(self, n: int, *, colocate: bool) -> list[int]:
        """Bundle indices for a group of ``n`` ranks: the first ``n`` (colocated) or the next ``n`` free ones.

        Raises:
            ValueError: not enough free bundles.
        """
        if colocate:
            if n > self.n_bundles:
                raise ValueError(f"a group of {n} ranks does not fit a pool of {self.n_bundles} bundles")
            return list(range(n))
        if self._next + n > self.n_bundles:
            raise ValueError(f"a group of {n} ranks does not fit the {self.n_bundles - self._next} free bundles")
        out = list(range(self._next, self._next + n))
        self._next += n
        return out

    def actor_options(self, bundle: int, share: int) -> dict[str, Any]:
        """``.options(...)`` that place one actor on ``bundle``, asking for ``1/share`` of it.

        ``share``: how many actors live on the bundle (they take turns; Ray only checks the sum fits).
        """
        return {
            "num_cpus": self.cpus / share,
            "num_gpus": self.gpus / share,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=bundle),
        }  # fmt: skip

    def shutdown(self) -> None:
        """Give the bundles back (the actors on them should be gone first)."""
        ray.util.remove_placement_group(self.placement_group)
