"""run.loggers: each tracker gets a short training run's metrics through its own library (local / offline), an
unknown name or a missing library is one line with exit 2 before any model loads."""

from __future__ import annotations

import importlib.util
import json
import re
import struct
import subprocess
import sys

import pytest

from drmas_train.commands.train import main as train_main
from drmas_train.errors import ConfigError
from drmas_train.run.metrics_log import MetricsLogger, read_metrics
from drmas_train.run.trackers import check_trackers, mlflow_metric_name
from helpers.tiny_rl import tiny_config, tiny_loader

ROWS = [(1, {"reward/a/mean": 0.25, "val/avg@4": 0.5, "perf/rollout_s": float("nan")}),
        (2, {"reward/a/mean": 0.75, "val/avg@4": 0.625})]  # fmt: skip


def _needs(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed (pip install 'drmas[trackers]')")


def _log_rows(run_dir, trackers):
    logger = MetricsLogger(run_dir, tensorboard=False, trackers=trackers, project="drmas-test", config={"seed": 0})
    for iteration, metrics in ROWS:
        logger.log(iteration, metrics)
    logger.close()


def test_unknown_or_missing_logger_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    assert train_main([f"run.dir={tmp_path / 'r'}", "run.loggers=[tensorboard,comet]"]) == 2
    assert capsys.readouterr().err == ("drmas train: run.loggers: unknown logger 'comet'; accepted: tensorboard, "
                                       "trackio, wandb, mlflow\n")  # fmt: skip
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=re.escape("run.loggers: 'wandb' needs the wandb package(s), not installed; "
                                                    "install them with: pip install 'drmas[trackers]'")):  # fmt: skip
        check_trackers(["tensorboard", "wandb"])
    with pytest.raises(ConfigError, match=re.escape("run.loggers names a logger twice: ['tensorboard', 'tensorboard']")):
        check_trackers(["tensorboard", "tensorboard"])


def test_mlflow_metric_names():
    assert mlflow_metric_name("val/avg@4") == "val/avg_4"
    assert mlflow_metric_name("loss/shared/grad_norm") == "loss/shared/grad_norm"


@_needs("trackio")
def test_trackio_gets_the_metrics(tmp_path):
    """trackio's local database (TRACKIO_DIR) holds each iteration's finite metrics at its step."""
    code = (
        "import sys, json\n"
        "from drmas_train.run.metrics_log import MetricsLogger\n"
        f"rows = [(1, {{'reward/a/mean': 0.25, 'val/avg@4': 0.5}}), (2, {{'reward/a/mean': 0.75, 'val/avg@4': 0.625}})]\n"
        f"logger = MetricsLogger({str(tmp_path / 'run')!r}, tensorboard=False, trackers=['trackio'], project='drmas-test')\n"
        "[logger.log(i, m) for i, m in rows]\n"
        "logger.close()\n"
        "from trackio.sqlite_storage import SQLiteStorage\n"
        "print('LOGS=' + json.dumps(SQLiteStorage.get_logs('drmas-test', 'run')))\n"
    )  # fmt: skip
    import os

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")})  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("LOGS=")]
    logs = json.loads(line.removeprefix("LOGS="))
    assert [(r["step"], r["reward/a/mean"], r["val/avg@4"]) for r in logs] == [(1, 0.25, 0.5), (2, 0.75, 0.625)]


def _wandb_records(path):
    """The protobuf records of a W&B ``.wandb`` file (a LevelDB-style log: 7-byte header, 32 KiB blocks of records
    with a 7-byte header each: CRC, length, type FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, records, pending = path.read_bytes(), [], b""
    pos = 7
    while pos + 7 <= len(data):
        if (pos % 32768) > 32768 - 7:  # the rest of a block is too short for a header: padding
            pos += 32768 - pos % 32768
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        if pos + 7 + length > len(data):  # a record still being written
            break
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def _wandb_history(path):
    """``[(step, {metric: value})]`` of the history records of a ``.wandb`` file (W&B's own keys, ``_*``, left out).

    ``run.finish()`` can return before W&B's service process has written the file (measured with wandb 0.31: 2 of 6
    runs had only its 7-byte header right after, all of it 1 s later); its ``exit`` record, the last, is awaited."""
    import time

    deadline = time.monotonic() + 30
    while not any(r.WhichOneof("record_type") == "exit" for r in _wandb_records(path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    out = []
    for r in _wandb_records(path):
        if r.WhichOneof("record_type") == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            out.append((items["_step"], {k: v for k, v in items.items() if not k.startswith("_")}))
    return out


@_needs("wandb")
def test_wandb_offline_run_gets_the_metrics(tmp_path, monkeypatch):
    """An offline W&B run under <run dir>/wandb/ whose history rows are the iterations' finite metrics."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    _log_rows(tmp_path / "run", ["wandb"])
    (path,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    assert _wandb_history(path) == [(1, {"reward/a/mean": 0.25, "val/avg@4": 0.5}),
                                    (2, {"reward/a/mean": 0.75, "val/avg@4": 0.625})]  # fmt: skip


@pytest.mark.slow  # MLflow creates its SQLite schema (~5 s)
@_needs("mlflow", "sqlalchemy", "alembic")
def test_mlflow_run_in_the_run_dir_gets_the_metrics(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _log_rows(tmp_path / "run", ["mlflow"])
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("drmas-test").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val/avg_4")] == [(1, 0.5), (2, 0.625)]
    assert "perf/rollout_s" not in run.data.metrics  # NaN is not sent


@pytest.mark.slow  # a 2-iteration tiny training run
@_needs("wandb")
def test_a_training_run_feeds_its_trackers(tmp_path, monkeypatch):
    """train() with run.loggers=[tensorboard, wandb]: W&B's history is metrics.jsonl's rows, TensorBoard still written."""
    from drmas_train.run.trainer import train

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = tiny_config(tmp_path / "run", "run.iterations=2", "run.tensorboard=true", "run.loggers=[tensorboard,wandb]")
    train(cfg, loader=tiny_loader)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    (path,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    assert _wandb_history(path) == [(row["iteration"], {k: v for k, v in row.items() if k != "iteration" and v is not None})
                                    for row in rows]  # fmt: skip
    assert [row["iteration"] for row in rows] == [1, 2]
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
