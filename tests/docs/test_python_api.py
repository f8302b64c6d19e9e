"""docs/python-api.md's example runs as written, in a fresh interpreter from an empty folder, and prints what its
comments show; the page's tables name exactly the packages' ``__all__``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "python-api.md"


def _example(index: int) -> str:
    """The page's ``index``-th ```python block."""
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)[index]


def _promised(code: str) -> list[str]:
    """The output lines the snippet's ``# `` comments promise (section comments, which start lower-case words
    followed by a colon, left out)."""
    return [line.removeprefix("# ") for line in code.splitlines()
            if line.startswith("# ") and not re.match(r"# [a-z]+: ", line)]  # fmt: skip


def test_star_import_example_plays_an_episode(capsys):
    code = _example(0)
    assert code.startswith("from drmas_envs import *\n")
    exec(code, {})  # noqa: S102 - the documentation's own snippet
    assert capsys.readouterr().out.splitlines() == _promised(code) == ["1.0 ['solver', 'verifier']"]


@pytest.mark.slow  # a tiny-qwen3 training iteration and two scripted evaluations: ~15 s on 2 CPU cores
def test_train_evaluate_rank_example_prints_its_comments(tmp_path):
    code = _example(1)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr
    promised = _promised(code)
    assert len(promised) == 3 and done.stdout.splitlines() == promised
    assert (tmp_path / "runs" / "eval-oracle" / "summary.json").is_file()
    assert (tmp_path / "runs" / "tiny" / "metrics.jsonl").is_file()


@pytest.mark.parametrize("package", ["drmas_envs", "drmas_train"])
def test_page_tables_name_every_public_name(package):
    """Every name of ``package.__all__`` (``__version__`` aside) appears in the page's table for that package."""
    import importlib

    section = DOC.read_text(encoding="utf-8").split(f"## `{package}`", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([A-Za-z_]+)[(`]", section))
    missing = sorted(set(importlib.import_module(package).__all__) - named - {"__version__"})
    assert not missing, f"docs/python-api.md's {package} table does not name {missing}"
