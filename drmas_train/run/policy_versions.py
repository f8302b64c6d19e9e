"""Policy versions: per model, how many PPO updates its weights have received; the staleness of what it consumes.

Every trained model (a model id of the agent -> model assignment: a config key, or ``<key>:<adapter>`` for a LoRA
adapter, which has its own optimizer) has its own counter, starting at 0 and advanced by one after each PPO update
of that model (one update = the ``ppo_epochs x mini_batches`` optimizer steps of one iteration; a model without
samples in an iteration, or waiting out the critic's warm-up, is not updated and keeps its version). Frozen models
stay at 0.

Each :class:`~drmas_train.collect.samples.Sample` carries the version of the model that generated it
(``policy_version``). A sample's *staleness* when an update consumes it is ``trainer version - sample version``:
how many updates its model received between generating it and training on it. The synchronous loop generates an
iteration's samples with the weights its update starts from, so every staleness is 0 there; an asynchronous loop
(``run.mode: async``, docs/async.md) is where it becomes positive and is bounded per model
(:mod:`drmas_train.collect.group_buffer`).

The counters are saved in every checkpoint (``trainer_state.pt``'s ``extra["policy_versions"]``) and restored on
``--resume``; a checkpoint written before drmas recorded them gets versions derived from its iteration
(:meth:`PolicyVersions.from_iteration`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["PolicyVersions", "staleness_metrics", "VERSION_PREFIX", "STALENESS_PREFIX"]

#: metric prefix of each model's version after the iteration's update: ``version/<model_id>``.
VERSION_PREFIX = "version/"
#: metric prefix of the staleness of the samples each update consumed: ``staleness/<model_id>/{mean,max}``.
STALENESS_PREFIX = "staleness/"


class PolicyVersions:
    """The version counters of a run's trained models.

    Args:
        model_ids: the trained models (each starts at 0 unless ``versions`` says otherwise).
        versions: ``{model_id: version}`` to start from (a checkpoint's); every id must be one of ``model_ids``.

    Raises:
        ValueError: a version that is not an int >= 0, or one of a model that is not trained.
    """

    def __init__(self, model_ids: Iterable[str], versions: Mapping[str, int] | None = None) -> None:
        self._v = {mid: 0 for mid in model_ids}
        for mid, v in (versions or {}).items():
            if mid not in self._v:
                raise ValueError(
                    f"policy version of {mid!r}, which is not a trained model; trained: {sorted(self._v)}"
                )
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"policy version of {mid!r} must be an int >= 0, got {v!r}")
            self._v[mid] = v

    @classmethod
    def from_iteration(
        cls, model_ids: Iterable[str], iteration: int, *, policy_warmup: int = 0
    ) -> PolicyVersions:
        """Versions derived for a checkpoint that did not record them (written before drmas did): every trained
        model updated once in each of the ``iteration`` iterations after the first ``policy_warmup`` (the critic's
        warm-up, ``critic.warmup_iterations``). Exact for the synchronous loop unless a model had no samples in
        some iteration (it is then not updated and its true version is lower)."""
        return cls(model_ids, {mid: max(iteration - policy_warmup, 0) for mid in model_ids})

    @property
    def model_ids(self) -> list[str]:
        return list(self._v)

    def __getitem__(self, model_id: str) -> int:
        """The version of ``model_id``; 0 for a model that is not trained (a frozen model never changes)."""
        return self._v.get(model_id, 0)

    def advance(self, model_ids: Iterable[str]) -> None:
        """One more update of each of ``model_ids`` (each once, whatever its repeats).

        Raises:
            KeyError: a model that is not trained.
        """
        for mid in set(model_ids):
            if mid not in self._v:
                raise KeyError(
                    f"cannot advance the version of {mid!r}: not a trained model; trained: {sorted(self._v)}"
                )
            self._v[mid] += 1

    def stamp(self, samples: Iterable[Any]) -> None:
        """Set each sample's ``policy_version`` to its model's current version, in place (the samples were just
        generated with the current weights)."""
        for s in samples:
            s.policy_version = self[s.model_id]

    def metrics(self) -> dict[str, float]:
        """``version/<model_id>``: each trained model's version now."""
        return {f"{VERSION_PREFIX}{mid}": float(v) for mid, v in self._v.items()}

    def state_dict(self) -> dict[str, int]:
        """``{model_id: version}`` (plain ints: a checkpoint's ``weights_only`` load reads it)."""
        return dict(self._v)

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore :meth:`state_dict` (the same validation as the constructor)."""
        self._v = PolicyVersions(self._v, state)._v


def staleness_metrics(samples: Sequence[Any], versions: PolicyVersions) -> dict[str, float]:
    """The staleness of the samples an update consumes, per model: ``staleness/<model_id>/mean`` and ``/max`` of
    ``versions[model_id] - sample.policy_version`` over its samples (versions taken before the update: the
    proximal policy's). Samples of models that are not trained (nothing consumes them) and models without
    samples are left out.

    Raises:
        ValueError: a sample newer than its model's version (it cannot have been generated by these weights).
    """
    per: dict[str, list[int]] = {}
    trained = set(versions.model_ids)
    for s in samples:
        if s.model_id not in trained:
            continue
        lag = versions[s.model_id] - s.policy_version
        if lag < 0:
            raise ValueError(
                f"a sample of {s.model_id!r} (traj_uid {s.traj_uid!r}) has policy_version {s.policy_version}, newer than "
                f"its model's version {versions[s.model_id]}"
            )
        per.setdefault(s.model_id, []).append(lag)
    out: dict[str, float] = {}
    for mid in sorted(per):
        lags = per[mid]
        out[f"{STALENESS_PREFIX}{mid}/mean"] = sum(lags) / len(lags)
        out[f"{STALENESS_PREFIX}{mid}/max"] = float(max(lags))
    return out
