"""QA row formats for the shared data loaders (:mod:`drmas_envs.data`): ``hotpotqa``, ``search_r1``, ``flashrag``.

Importing this module registers them with :func:`drmas_envs.data.register_format`, so
``drmas_envs.data.load_tasks("nq_test.jsonl")`` understands QA files too. The conversion itself is
:func:`drmas_envs.search.data.row_to_task`; a data_source that names a Search-R1 tag (``nq_test_1000`` ->
``nq``) is reduced to the tag.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drmas_envs.core import Task
from drmas_envs.data import DataFormatError, RowFormat, register_format
from drmas_envs.search.data import infer_data_source, row_to_task

__all__ = ["QA_FORMATS"]


def _convert(default: str):
    def to_task(row: Mapping[str, Any], index: int, data_source: str) -> Task:
        source = infer_data_source(data_source) or data_source or default
        try:
            return row_to_task(row, index=index, data_source=source, where="row")
        except ValueError as e:
            raise DataFormatError(str(e).removeprefix("row: ")) from e

    return to_task


QA_FORMATS = (
    RowFormat("hotpotqa", ("question", "answer", "supporting_facts", "context"), _convert("hotpotqa"),
              default_data_source="hotpotqa"),
    RowFormat("search_r1", ("reward_model", "data_source"), _convert("qa"),
              detect=lambda row: isinstance(row.get("reward_model"), Mapping) and "ground_truth" in row["reward_model"]),
    RowFormat("flashrag", ("id", "question", "golden_answers"), _convert("qa")),
)

for _fmt in QA_FORMATS:
    try:
        register_format(_fmt)
    except ValueError:  # already registered (module reloaded)
        pass
