"""The QA row formats, re-exported: they live in :mod:`drmas_envs.data.qa_rows` (registered by the data package)."""

from drmas_envs.data.qa_rows import QA_FORMATS

__all__ = ["QA_FORMATS"]
