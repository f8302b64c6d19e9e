"""Hugging Face ``datasets`` ids -> :class:`~drmas_envs.core.ListTaskSource` (optional extra ``drmas[hf]``).

Offline (``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` set to ``1``/``true``/``yes``) fails at once with a message
saying how to load a local file instead, before ``datasets`` is imported or any network is tried.
Rows are converted by a :mod:`~drmas_envs.data.row_formats` format (given, or inferred from the first row).
"""

from __future__ import annotations

import os

from drmas_envs.core import ListTaskSource
from drmas_envs.data.files import rows_to_tasks
from drmas_envs.data.row_formats import DataFormatError

__all__ = ["HFUnavailableError", "hf_offline", "load_hf"]

_TRUE = {"1", "true", "yes", "on"}


class HFUnavailableError(RuntimeError):
    """A Hugging Face dataset cannot be loaded here (offline mode, or ``datasets`` not installed)."""


def hf_offline() -> bool:
    """Whether the environment asks for offline mode (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``)."""
    return any(
        os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def load_hf(
    dataset_id: str,
    *,
    config: str | None = None,
    split: str = "test",
    format: str | None = None,  # noqa: A002
    data_source: str | None = None,
    limit: int | None = None,
) -> ListTaskSource:
    """Load ``split`` of the Hub dataset ``dataset_id`` (e.g. ``"openai/gsm8k"``, config ``"main"``).

    Raises:
        HFUnavailableError: offline mode, or ``datasets`` missing (``pip install 'drmas[hf]'``).
        DataFormatError: rows that fit no format / miss a field (location ``hf:<id>/<split>:row <n>``).
    """
    where = f"hf:{dataset_id}" + (f":{config}" if config else "") + f"@{split}"
    if hf_offline():
        raise HFUnavailableError(
            f"cannot load Hugging Face dataset {where}: offline mode is on (HF_HUB_OFFLINE=1 or "
            "HF_DATASETS_OFFLINE=1). Download it while online, or pass a local .jsonl/.parquet path instead."
        )
    try:
        import datasets
    except ImportError as err:
        raise HFUnavailableError(
            f"cannot load {where}: the 'datasets' package is not installed; pip install 'drmas[hf]' "
            "or pass a local .jsonl/.parquet path"
        ) from err
    table = datasets.load_dataset(dataset_id, config, split=split)
    rows = ((f"{where}:row {i}", row) for i, row in enumerate(table, start=1))
    fallback = dataset_id.rsplit("/", 1)[-1].lower()
    tasks, fmt = rows_to_tasks(
        rows, fmt=format, data_source=data_source, fallback_source=fallback, limit=limit
    )
    if not tasks:
        raise DataFormatError(f"{where}: the split has no rows")
    return ListTaskSource(tasks, name=f"{fmt.name if fmt else 'tasks'}:{where}")
