"""Experiment trackers beside ``metrics.jsonl``: ``run.loggers: [tensorboard, trackio, wandb, mlflow]``.

Each tracker is its own library, local or offline by default, so a run on a machine without network logs as well
as one with it; every iteration's metrics row (the scalars of ``metrics.jsonl``) goes to each, with the iteration
as the step.

==============  ========================  =========================================================================
``run.loggers`` library (pip extra)       where the metrics go
==============  ========================  =========================================================================
``tensorboard`` ``tensorboard`` (train)   ``<run dir>/tensorboard/`` event files (:class:`MetricsLogger`'s own)
``trackio``     ``trackio`` (trackers)    trackio's local SQLite database (``$TRACKIO_DIR``, default
                                          ``~/.cache/huggingface/trackio``), project = the run's name;
                                          ``trackio show`` opens its dashboard
``wandb``       ``wandb`` (trackers)      ``<run dir>/wandb/offline-run-*``: ``mode="offline"`` unless
                                          ``WANDB_MODE`` says otherwise; ``wandb sync <that folder>`` uploads it
``mlflow``      ``mlflow-skinny``,        ``sqlite:///<run dir>/mlflow.db`` unless ``MLFLOW_TRACKING_URI`` names
                ``sqlalchemy``,           another store (MLflow 3 refuses its old file store); experiment = the
                ``alembic`` (trackers)    run's name; ``mlflow ui --backend-store-uri sqlite:///<run dir>/mlflow.db``
==============  ========================  =========================================================================

MLflow accepts metric names of letters, digits and ``_ - . space : /`` only: other characters become ``_``
(``val/avg@4`` is logged as ``val/avg_4``). Each process of a run (a ``--resume`` included) is one tracker run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from drmas_train.errors import ConfigError

__all__ = ["TRACKERS", "Tracker", "check_trackers", "open_tracker", "mlflow_metric_name"]

#: accepted ``run.loggers`` entries -> the modules each needs and the pip extra that installs them.
TRACKERS: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": (("tensorboard",), "train"),
    "trackio": (("trackio",), "trackers"),
    "wandb": (("wandb",), "trackers"),
    "mlflow": (("mlflow", "sqlalchemy", "alembic"), "trackers"),
}


class Tracker(Protocol):
    """One experiment tracker of a run: ``log`` one iteration's finite scalars, ``close`` at the end."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def check_trackers(names: Sequence[str]) -> None:
    """Check ``run.loggers`` before anything is loaded.

    Raises:
        ConfigError: an unknown name (the message lists the accepted ones), a name given twice, or a tracker whose
            library is not installed (the message names the pip extra that installs it).
    """
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"run.loggers: unknown logger {name!r}; accepted: {', '.join(TRACKERS)}")
        modules, extra = TRACKERS[name]
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(f"run.loggers: {name!r} needs the {', '.join(missing)} package(s), not installed; "
                              f"install them with: pip install 'drmas[{extra}]'")  # fmt: skip
    if len(set(names)) != len(names):
        raise ConfigError(f"run.loggers names a logger twice: {list(names)}")


_MLFLOW_BAD = re.compile(r"[^\w\-. :/]")


def mlflow_metric_name(key: str) -> str:
    """``key`` with every character MLflow refuses in a metric name replaced by ``_`` (``val/avg@4`` ->
    ``val/avg_4``)."""
    return _MLFLOW_BAD.sub("_", key)


class _Trackio:
    def __init__(self, run_dir: Path, name: str, config: Mapping[str, Any]) -> None:
        import trackio

        self._run = trackio.init(project=name, name=run_dir.name, config=dict(config), auto_log_cpu=False,
                                 auto_log_gpu=False, embed=False)  # fmt: skip

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class _Wandb:
    def __init__(self, run_dir: Path, name: str, config: Mapping[str, Any]) -> None:
        import wandb

        self._run = wandb.init(project=name, name=run_dir.name, dir=str(run_dir), config=dict(config),
                               mode=os.environ.get("WANDB_MODE", "offline"))  # fmt: skip

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class _Mlflow:
    def __init__(self, run_dir: Path, name: str, config: Mapping[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"
        self._client = MlflowClient(tracking_uri=uri)
        found = self._client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else self._client.create_experiment(
            name, artifact_location=str(run_dir.resolve() / "mlflow_artifacts"))  # fmt: skip
        self._run_id = self._client.create_run(experiment, run_name=run_dir.name).info.run_id

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(mlflow_metric_name(k), float(v), now, step) for k, v in metrics.items()]
        for start in range(0, len(rows), 1000):  # MLflow's log_batch takes at most 1000 metrics
            self._client.log_batch(self._run_id, metrics=rows[start : start + 1000])

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


def open_tracker(name: str, run_dir: str | Path, *, project: str, config: Mapping[str, Any]) -> Tracker:
    """Start tracker ``name`` (``trackio``, ``wandb`` or ``mlflow``; TensorBoard is :class:`MetricsLogger`'s own)
    for the run in ``run_dir``, as its module docstring says.

    Args:
        project: the trackio project, W&B project and MLflow experiment (the run's name). config: the run's
            resolved config, recorded by each tracker.
    """
    kinds = {"trackio": _Trackio, "wandb": _Wandb, "mlflow": _Mlflow}
    if name not in kinds:
        raise ValueError(f"open_tracker: {name!r} is not a tracker of its own; accepted: {', '.join(kinds)}")
    return kinds[name](Path(run_dir), project, config)
