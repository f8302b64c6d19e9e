"""QA task loaders for the search envs: local files (HotpotQA, FlashRAG, Search-R1 / verl) and HF dataset ids.

Row schemas recognised (per row, in this order):

* **HotpotQA** (HF ``hotpot_qa`` schema or the original JSON): ``question``, ``answer``, ``supporting_facts``,
  ``context``. ``extra`` keeps ``type``, ``level`` and ``supporting_titles``.
* **Search-R1 / verl**: ``reward_model.ground_truth.target`` (list of answers) and a ``question`` (or a chat
  ``prompt`` whose text ends with ``Question: ...``); ``data_source`` from the row.
* **FlashRAG**: ``id``, ``question``, ``golden_answers``.
* **Plain**: ``question`` and ``answer`` (a str or list of str).

``data_source`` tags follow Search-R1 (``nq``, ``triviaqa``, ``popqa``, ``hotpotqa``, ``2wikimultihopqa``,
``musique``, ``bamboogle``): the row's own ``data_source``, else the ``data_source`` argument, else a known tag
found in the file name, else ``"qa"``. Answers become a tuple of golden answers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drmas_envs.core import ListTaskSource, Task
from drmas_envs.data.files import read_rows

__all__ = ["SEARCH_R1_SOURCES", "row_to_task", "load_qa_file", "load_qa_hf", "infer_data_source"]

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
    if not isinstance(question, str):
        prompt = row.get("prompt")
        if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[-1], Mapping):
            text = str(prompt[-1].get("content", ""))
            question = text.rsplit("Question:", 1)[-1].strip() if "Question:" in text else None
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: missing field 'question' (a non-empty str)")
    task_id = str(row.get("id", row.get("_id", f"{source}-{index}")))
    return Task(task_id, source, question.strip(), golds, extra)


def load_qa_file(path: str | Path, *, data_source: str | None = None, limit: int | None = None) -> ListTaskSource:
    """All rows of a local QA file as tasks (see the module doc for schemas and ``data_source``).

    Raises:
        FileNotFoundError / ValueError: see :func:`drmas_envs.data.read_rows` and :func:`row_to_task`.
    """
    path = Path(path)
    source = data_source or infer_data_source(path)
    tasks = []
    for where, row in read_rows(path):
        tasks.append(row_to_task(row, index=len(tasks), data_source=source, where=where))
        if limit is not None and len(tasks) >= limit:
            break
    return ListTaskSource(tasks, name=source or path.stem)


def load_qa_hf(name: str, split: str = "validation", *, config: str | None = None, data_source: str | None = None,
               limit: int | None = None) -> ListTaskSource:
    """A Hugging Face dataset id (e.g. ``"hotpot_qa"`` with ``config="distractor"``, ``"RUC-NLPIR/FlashRAG_datasets"``
    with ``config="nq"``) as tasks. Needs ``pip install 'drmas[hf]'`` and network access.

    Raises:
        RuntimeError: offline (``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` set) or ``datasets`` missing; raised
            before any network call, saying how to use a local file instead.
    """
    hint = f"download it once online, or pass a local .jsonl/.parquet file instead of the HF id {name!r}"
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") or os.environ.get("HF_DATASETS_OFFLINE", "0") not in ("", "0"):
        raise RuntimeError(f"cannot load HF dataset {name!r}: offline mode (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE) is set; {hint}")
    try:
        import datasets
    except ImportError as e:
        raise RuntimeError(f"loading HF dataset {name!r} needs the 'datasets' package: pip install 'drmas[hf]'; or {hint}") from e
    ds = datasets.load_dataset(name, config, split=split)
    source = data_source or infer_data_source(config or name)
    tasks = []
    for i, row in enumerate(ds):
        tasks.append(row_to_task(row, index=i, data_source=source, where=f"{name}[{split}][{i}]"))
        if limit is not None and len(tasks) >= limit:
            break
    return ListTaskSource(tasks, name=source or name)
