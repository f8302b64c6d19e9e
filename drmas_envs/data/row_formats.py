"""Row formats: how one record of a benchmark file becomes a :class:`~drmas_envs.core.Task`.

A *format* is a name plus the fields a row must have and a converter. File and Hugging Face loaders look
formats up here by name, or infer one from the first row (:func:`infer_format`). Other packages plug their own
formats in with :func:`register_format` (list their module in :data:`FORMAT_MODULES` so inference sees them
even before they are imported). The QA formats (HotpotQA / FlashRAG / Search-R1) are built in too, in
:mod:`drmas_envs.data.qa_rows`.

Built-in math formats:

=========  ====================================  =========================================================
name       required fields                       ground truth
=========  ====================================  =========================================================
``gsm8k``  ``question``, ``answer``              the text after ``#### `` in ``answer`` (``1,000`` -> ``1000``)
``math``   ``problem``, ``answer``               ``answer`` (MATH / MATH-500; also AIME / AMC, numbers -> str)
``tasks``  ``task_id``, ``data_source``,         ``answer`` (``Task.to_dict`` rows, round trip)
           ``question``, ``answer``
``verl``   ``prompt``, ``reward_model``,         ``reward_model.ground_truth`` (a str or number): verl's
           ``data_source``                       RL-dataset layout, as the Dr. MAS reference's math data prep
                                                 writes it (question: :func:`verl_question`)
=========  ====================================  =========================================================

The ``verl`` layout, from ``langfengQ/DrMAS`` ``examples/data_preprocess/drmas_math.py:49-66`` (training rows) and
``:80-97`` (test rows: MATH-500, AIME 24/25, AMC 23, Minerva, OlympiadBench)::

    {"data_source": "math500", "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "\\frac{14}{3}"},
     "prompt": [{"role": "user", "content": <question>}],
     "extra_info": {"split": "test", "index": 7, "answer": ..., "question": <question>},
     "env_kwargs": {"ground_truth": ..., "question": <question>, "data_source": "math500"}}

The QA rows of verl-based search projects (``search_r1`` in :mod:`drmas_envs.data.qa_rows`) share it, with
``reward_model.ground_truth = {"target": [answers]}``.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from drmas_envs.core import Task

__all__ = [
    "DataFormatError",
    "RowFormat",
    "FORMAT_MODULES",
    "register_format",
    "get_format",
    "formats",
    "infer_format",
    "verl_question",
]

#: Third-party modules that register formats when imported; imported on the first lookup (an ImportError becomes
#: a RuntimeWarning). Add yours with one line.
FORMAT_MODULES: list[str] = []


class DataFormatError(ValueError):
    """A data row (or a whole file) does not fit its format; the message names the file, line and field."""


@dataclasses.dataclass(frozen=True)
class RowFormat:
    """How to turn one row into a Task.

    Attributes:
        name: format name (``"gsm8k"``).
        required: fields every row must have (checked before ``to_task`` runs).
        to_task: ``(row, index, data_source) -> Task``; ``index`` is the 0-based row number. It raises
            ``DataFormatError`` (without location: the loader adds file and line) for bad values.
        detect: extra test on the first row used by :func:`infer_format` (default: has all ``required``).
        default_data_source: tag when neither the caller nor the file name gives one.
    """

    name: str
    required: tuple[str, ...]
    to_task: Callable[[Mapping[str, Any], int, str], Task]
    detect: Callable[[Mapping[str, Any]], bool] | None = None
    default_data_source: str | None = None

    def matches(self, row: Mapping[str, Any]) -> bool:
        """Whether ``row`` has every required field (and passes ``detect``)."""
        return all(f in row for f in self.required) and (self.detect is None or self.detect(row))


_FORMATS: dict[str, RowFormat] = {}
_loaded_modules: set[str] = set()


def register_format(fmt: RowFormat, *, aliases: tuple[str, ...] = ()) -> RowFormat:
    """Add ``fmt`` (and optional alias names) to the format registry.

    Raises:
        ValueError: if the name or an alias is already registered.
    """
    for name in (fmt.name, *aliases):
        if name in _FORMATS:
            raise ValueError(f"data format {name!r} is already registered")
        _FORMATS[name] = fmt
    return fmt


def _load_plugins() -> None:
    for module in FORMAT_MODULES:
        if module not in _loaded_modules:
            _loaded_modules.add(module)
            try:
                importlib.import_module(module)
            except ImportError as err:  # a broken plug-in must not take the math formats down with it
                warnings.warn(
                    f"data formats of {module!r} are unavailable: {err}", RuntimeWarning, stacklevel=3
                )


def formats() -> dict[str, RowFormat]:
    """Every registered format by name (aliases included)."""
    _load_plugins()
    return dict(_FORMATS)


def get_format(name: str) -> RowFormat:
    """The format called ``name``.

    Raises:
        DataFormatError: unknown name (the message lists the known ones).
    """
    known = formats()
    if name not in known:
        raise DataFormatError(f"unknown data format {name!r}; known formats: {', '.join(sorted(known))}")
    return known[name]


def infer_format(row: Mapping[str, Any], where: str) -> RowFormat:
    """The format of ``row``: among formats it matches, the one with the most required fields.

    Raises:
        DataFormatError: no format matches (names ``where``, the row's fields and what each format needs).
    """
    candidates = [f for f in dict.fromkeys(formats().values()) if f.matches(row)]
    if not candidates:
        needs = "; ".join(f"{f.name}: {', '.join(f.required)}" for f in dict.fromkeys(formats().values()))
        raise DataFormatError(
            f"{where}: cannot infer the data format from fields {sorted(row)}: each row needs the required fields "
            f"of one known format (known formats and their required fields: {needs})"
        )
    return max(candidates, key=lambda f: len(f.required))


def _text(row: Mapping[str, Any], field: str) -> str:
    value = row[field]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DataFormatError(f"field {field!r} must be a string or a number, got {type(value).__name__}")
    return value if isinstance(value, str) else str(value)


_GSM8K_NUMBER = re.compile(r"-?[\d,]*\d(\.\d+)?")


def gsm8k_final_answer(solution: str) -> str:
    """The final answer after ``#### `` of a GSM8K solution, thousands commas removed (``"1,000"`` -> ``"1000"``).

    Raises:
        DataFormatError: no ``####`` marker, or nothing after it.
    """
    if "####" not in solution:
        raise DataFormatError("field 'answer' has no '#### <final answer>' marker (GSM8K format)")
    final = solution.rsplit("####", 1)[1].strip()
    if not final:
        raise DataFormatError("field 'answer' has nothing after '####' (GSM8K format)")
    return final.replace(",", "") if _GSM8K_NUMBER.fullmatch(final) else final


def _gsm8k_task(row: Mapping[str, Any], index: int, data_source: str) -> Task:
    solution = _text(row, "answer")
    task_id = str(row.get("id", f"{data_source}-{index}"))
    return Task(
        task_id, data_source, _text(row, "question"), gsm8k_final_answer(solution), {"solution": solution}
    )


def _math_task(row: Mapping[str, Any], index: int, data_source: str) -> Task:
    extra = {k: row[k] for k in ("solution", "subject", "level", "unique_id", "year", "url") if k in row}
    task_id = str(row.get("unique_id", row.get("id", f"{data_source}-{index}")))
    return Task(task_id, data_source, _text(row, "problem"), _text(row, "answer").strip(), extra)


def _tasks_task(row: Mapping[str, Any], index: int, data_source: str) -> Task:
    try:
        return Task.from_dict({**row, "data_source": row.get("data_source") or data_source})
    except TypeError as err:
        raise DataFormatError(str(err)) from err


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def verl_question(row: Mapping[str, Any]) -> str | None:
    """The question of a verl RL-dataset row, in this order: ``extra_info.question`` (verl's and the Dr. MAS
    reference's data prep keep the bare question there: ``langfengQ/DrMAS``
    ``examples/data_preprocess/drmas_math.py:59-64``, ``drmas_search.py:69-75``), ``env_kwargs.question``
    (``drmas_math.py:65``), else the last user message of ``prompt``: the text after its last ``Question:`` when
    templated (Search-R1's instruction prefix), else the whole message (the reference's bare question,
    ``drmas_math.py:53-58``, ``drmas_search.py:28-30,48-49``). None when none is a non-empty str."""
    for holder in (_mapping(row.get("extra_info")), _mapping(row.get("env_kwargs"))):
        question = holder.get("question")
        if isinstance(question, str) and question.strip():
            return question.strip()
    prompt = row.get("prompt")
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if isinstance(prompt, (list, tuple)):
        users = [m for m in prompt if isinstance(m, Mapping) and m.get("role", "user") == "user"]
        text = str(users[-1].get("content") or "") if users else ""
        question = text.rsplit("Question:", 1)[-1] if "Question:" in text else text
        if question.strip():
            return question.strip()
    return None


def _verl_ground_truth(row: Mapping[str, Any]) -> Any:
    return _mapping(row.get("reward_model")).get("ground_truth")


def _verl_task(row: Mapping[str, Any], index: int, data_source: str) -> Task:
    question = verl_question(row)
    if question is None:
        raise DataFormatError("missing field 'question': no extra_info.question, env_kwargs.question or user "
                              "message in 'prompt' (verl layout)")  # fmt: skip
    truth = _verl_ground_truth(row)
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)) or not str(truth).strip():
        raise DataFormatError(f"field 'reward_model.ground_truth' must be a non-empty string or a number, got {truth!r}")
    source = row.get("data_source") if isinstance(row.get("data_source"), str) and row["data_source"] else data_source
    info = _mapping(row.get("extra_info"))
    number = info.get("index", index)
    extra = {k: v for k, v in (("ability", row.get("ability")), ("split", info.get("split"))) if v is not None}
    return Task(str(row.get("id", f"{source}-{number}")), source, question, str(truth).strip(), extra)


register_format(
    RowFormat(
        "verl",
        ("prompt", "reward_model", "data_source"),
        _verl_task,
        detect=lambda row: isinstance(_verl_ground_truth(row), (str, int, float)),
    ),
    aliases=("drmas_math",),
)
register_format(
    RowFormat(
        "gsm8k",
        ("question", "answer"),
        _gsm8k_task,
        detect=lambda row: isinstance(row.get("answer"), str) and "####" in row["answer"],
        default_data_source="gsm8k",
    )
)
register_format(
    RowFormat("math", ("problem", "answer"), _math_task, default_data_source="math"),
    aliases=("math500", "aime", "amc"),
)
register_format(RowFormat("tasks", ("task_id", "data_source", "question", "answer"), _tasks_task))
