"""Read a file of the Dr. MAS reference from a local git mirror, or skip the calling test."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REFERENCE_GIT = Path(os.environ.get("DRMAS_REFERENCE_GIT", "/work/.mirror/langfengQ+DrMAS/repo"))


def reference_file(path: str) -> str:
    """The text of ``path`` at the mirror's HEAD; skips the test when no mirror (or git) is available."""
    if not REFERENCE_GIT.is_dir() or shutil.which("git") is None:
        pytest.skip(f"no local mirror of langfengQ/DrMAS at {REFERENCE_GIT} (set DRMAS_REFERENCE_GIT)")
    result = subprocess.run(["git", f"--git-dir={REFERENCE_GIT}", "show", f"HEAD:{path}"],
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        pytest.skip(f"{path} not in the reference mirror: {result.stderr.strip()}")
    return result.stdout


def triple_quoted(source: str, name: str) -> str:
    """The value of the string literal ``NAME = \"\"\"...\"\"\"`` in ``source`` (escapes evaluated)."""
    body = source.split(f'{name} = """', 1)[1].split('"""', 1)[0]
    return ast.literal_eval(f'"""{body}"""')
