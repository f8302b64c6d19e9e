"""QA row formats (``hotpotqa``, ``search_r1``, ``flashrag``) and the QA row converter, registered with the loaders.

Owned by the data package so that :func:`drmas_envs.data.load_tasks` understands QA files with no import of the
search envs (the dependency points one way: ``drmas_envs.search`` uses these, never the reverse).

Row schemas recognised (per row, in this order):

* **HotpotQA** (HF ``hotpot_qa`` schema or the original JSON): ``question``, ``answer``, ``supporting_facts``,
  ``context``. ``extra`` keeps ``type``, ``level`` and ``supporting_titles``.
* **Search-R1 / verl**: ``reward_model.ground_truth.target`` (list of answers) and a ``question``, else
  ``extra_info.question``, else the chat ``prompt``'s user message: the text after ``Question:`` when templated
  (Search-R1), else the bare question (the Dr. MAS reference's ``examples/data_preprocess/drmas_search.py:28-30,
  48-49,69-75``; :func:`~drmas_envs.data.row_formats.verl_question`); ``data_source`` from the row.
* **FlashRAG**: ``id``, ``question``, ``golden_answers``.
* **Plain**: ``question`` and ``answer`` (a str or list of str).

``data_source`` tags follow Search-R1 (``nq``, ``triviaqa``, ``popqa``, ``hotpotqa``, ``2wikimultihopqa``,
``musique``, ``bamboogle``); a data_source that names one (``nq_test_1000`` -> ``nq``) is reduced to the tag.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drmas_envs.core import Task
from drmas_envs.data.row_formats import DataFormatError, RowFormat, register_format, verl_question

__all__ = ["SEARCH_R1_SOURCES", "QA_FORMATS", "infer_data_source", "row_to_task"]

#: Search-R1's data_source tags, in its table order.
SEARCH_R1_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


def infer_data_source(name: str | os.PathLike[str]) -> str | None:
    """The Search-R1 tag named in a file name or dataset id (``nq_test_1000.jsonl`` -> ``"nq"``), else None."""
    stem = Path(name).name.lower()
    # longest first, so "2wikimultihopqa" wins over "hotpotqa"-like substrings
    for tag in sorted(SEARCH_R1_SOURCES, key=len, reverse=True):
        if re.search(rf"(^|[^a-z0-9]){re.escape(tag)}([^a-z0-9]|$)", stem) or (tag in ("hotpotqa", "hotpot_qa") and "hotpot" in stem):
            return tag
    return None


def _answers(value: Any, where: str, field: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (str, int, float)) for v in value):
        return tuple(str(v) for v in value)
    raise ValueError(f"{where}: field {field!r} must be a str or a non-empty list of str, got {value!r}")


def row_to_task(row: Mapping[str, Any], *, index: int, data_source: str | None = None, where: str = "row") -> Task:
    """One QA row (any schema in the module doc) as a :class:`Task`.

    Raises:
        ValueError: the row has no question or no answer (names ``where`` and the missing field).
    """
    row = {k: v for k, v in row.items() if v is not None}  # Parquet fills absent columns with None
    row_source = row.get("data_source")
    source = str(row_source) if isinstance(row_source, str) and row_source else (data_source or "qa")
    extra: dict[str, Any] = {}
    if "supporting_facts" in row and "context" in row:  # HotpotQA
        sf = row["supporting_facts"]
        titles = sf["title"] if isinstance(sf, Mapping) else [t for t, *_ in sf]
        extra = {"type": row.get("type"), "level": row.get("level"), "supporting_titles": list(dict.fromkeys(titles))}
        source = str(row_source) if isinstance(row_source, str) and row_source else (data_source or "hotpotqa")
    if "golden_answers" in row:
        golds = _answers(row["golden_answers"], where, "golden_answers")
    elif isinstance(row.get("reward_model"), Mapping) and "ground_truth" in row["reward_model"]:
        gt = row["reward_model"]["ground_truth"]
        golds = _answers(gt.get("target") if isinstance(gt, Mapping) else gt, where, "reward_model.ground_truth.target")
    elif "answer" in row:
        golds = _answers(row["answer"], where, "answer")
    else:
        raise ValueError(f"{where}: missing field 'golden_answers' (or 'answer', or 'reward_model.ground_truth.target')")
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():  # verl rows: extra_info.question or the prompt
        question = verl_question(row)
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: missing field 'question' (a non-empty str; verl rows: extra_info.question or "
                         "the user message of 'prompt')")  # fmt: skip
    task_id = str(row.get("id", row.get("_id", f"{source}-{index}")))
    return Task(task_id, source, question.strip(), golds, extra)


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
    register_format(_fmt)
