"""Task sources: procedural (reasoning-gym), local JSONL/Parquet files, Hugging Face ids.

Everything returns a :class:`~drmas_envs.core.TaskSource` of :class:`~drmas_envs.core.Task`; :func:`load_tasks`
takes any spec (``"reasoning_gym:gsm_symbolic"``, a file path, ``"hf:openai/gsm8k:main@test"``).
Row formats (how a record becomes a Task) are a registry by name (:mod:`drmas_envs.data.row_formats`): the math
formats and the QA formats (:mod:`drmas_envs.data.qa_rows`) are built in; formats defined elsewhere plug into
the same file/HF loaders with :func:`register_format`.
"""

from drmas_envs.data import qa_rows  # noqa: F401  (registers the QA row formats)
from drmas_envs.data.files import data_source_from_path, load_file, read_rows
from drmas_envs.data.hf import HFUnavailableError, hf_offline, load_hf
from drmas_envs.data.load import DEFAULT_MATH_SPEC, load_tasks
from drmas_envs.data.procedural import ReasoningGymSource
from drmas_envs.data.row_formats import (
    FORMAT_MODULES,
    DataFormatError,
    RowFormat,
    formats,
    get_format,
    gsm8k_final_answer,
    infer_format,
    register_format,
)

__all__ = [
    "DEFAULT_MATH_SPEC",
    "FORMAT_MODULES",
    "DataFormatError",
    "HFUnavailableError",
    "ReasoningGymSource",
    "RowFormat",
    "data_source_from_path",
    "formats",
    "get_format",
    "gsm8k_final_answer",
    "hf_offline",
    "infer_format",
    "load_file",
    "load_hf",
    "load_tasks",
    "read_rows",
    "register_format",
]
