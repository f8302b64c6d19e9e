"""Save and load :class:`~drmas_train.collect.samples.Sample` lists as JSONL or Parquet, losslessly.

Round trip guarantee: ``load_samples(save_samples(samples, path)) == samples`` for both formats (log-probs are
float32 values, stored exactly as float64; ``extra`` is stored as a JSON string column in Parquet).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from drmas_train.collect.samples import Sample

__all__ = ["save_samples", "load_samples"]

_FORMATS = (".jsonl", ".parquet")


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in _FORMATS:
        raise ValueError(f"unknown sample file format {suffix!r} for {path}; accepted: {_FORMATS}")
    return suffix


def _schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("uid", pa.string()),
            ("traj_uid", pa.string()),
            ("agent_id", pa.string()),
            ("model_id", pa.string()),
            ("turn", pa.int64()),
            ("agent_turn", pa.int64()),
            ("prompt_ids", pa.list_(pa.int64())),
            ("response_ids", pa.list_(pa.int64())),
            ("old_logprobs", pa.list_(pa.float64())),
            ("response_mask", pa.list_(pa.int64())),
            ("prompt_text", pa.string()),
            ("response_text", pa.string()),
            ("is_action_valid", pa.bool_()),
            ("reward", pa.float64()),
            ("won", pa.bool_()),
            ("score", pa.float64()),
            ("data_source", pa.string()),
            ("task_id", pa.string()),
            ("finish_reason", pa.string()),
            ("extra", pa.string()),
            ("anchor_key", pa.string()),
            ("rollout_logprobs", pa.list_(pa.float64())),
            ("policy_version", pa.int64()),
        ]
    )


def save_samples(samples: Sequence[Sample], path: str | Path) -> Path:
    """Write ``samples`` to ``path`` (``.jsonl``: one JSON object per line; ``.parquet``: one row per sample).

    Returns:
        the path written.

    Raises:
        ValueError: an unknown file suffix.
    """
    path = Path(path)
    kind = _format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [s.to_dict() for s in samples]
    if kind == ".jsonl":
        with path.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    for row in rows:
        row["extra"] = json.dumps(row["extra"], ensure_ascii=False)
    pq.write_table(pa.Table.from_pylist(rows, schema=_schema()), path)
    return path


def load_samples(path: str | Path) -> list[Sample]:
    """Read samples written by :func:`save_samples`.

    Raises:
        ValueError: an unknown suffix, or a row that is not a valid Sample (names the line/row).
    """
    path = Path(path)
    kind = _format(path)
    if kind == ".jsonl":
        out = []
        with path.open(encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        out.append(Sample.from_dict(json.loads(line)))
                    except (ValueError, json.JSONDecodeError) as err:
                        raise ValueError(f"{path}:{i}: not a Sample: {err}") from err
        return out
    import pyarrow.parquet as pq

    out = []
    for i, row in enumerate(pq.read_table(path).to_pylist()):
        row["extra"] = json.loads(row["extra"]) if row.get("extra") else {}
        try:
            out.append(Sample.from_dict(row))
        except ValueError as err:
            raise ValueError(f"{path}: row {i}: not a Sample: {err}") from err
    return out
