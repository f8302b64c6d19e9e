"""README.md's Python snippets run as written, in a fresh interpreter as a reader pastes them, and print the
transcript they promise (the env renders itself as it steps in human mode; the ansi example prints it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _snippet(heading: str) -> str:
    """The first ```python block under the README section ``heading``."""
    section = README.read_text(encoding="utf-8").split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_example_prints_the_transcript():
    out = _run(_snippet("Example"))
    assert re.search(r"^# task \S+ \[reasoning_gym/gsm_symbolic\]$", out, flags=re.M)
    assert "--- turn 0 · solver ---\nLet me compute... \\boxed{42}\n" in out
    assert "--- turn 1 · verifier ---\nLooks right. <verify>approve</verify>\n" in out
    assert "=== episode over; returns:" in out


@pytest.mark.slow  # SmolLM2-135M on the CPU: model load + up to 3 calls of 256 tokens
def test_play_an_env_with_an_llm_prints_each_turn_without_render():
    from drmas_train.model.models import ModelNotFoundError, smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except ModelNotFoundError as err:
        pytest.skip(f"SmolLM2 weights not found: {err}")
    code = _snippet("Play an env with an LLM")
    assert "render()" not in code  # human mode needs no call
    out = _run(code)
    assert re.search(r"^# task \S+ \[reasoning_gym/gsm_symbolic\]$", out, flags=re.M)
    assert "--- turn 0 · solver" in out and "=== episode over; returns:" in out


def test_the_setup_paragraph_names_every_default_extra_of_setup_sh():
    """README's set-up paragraph lists the extras ``scripts/setup.sh`` installs by default (it once left out
    ``games``, which the script installs)."""
    script = (README.parent / "scripts" / "setup.sh").read_text(encoding="utf-8")
    default = re.search(r"EXTRAS=\$\{DRMAS_EXTRAS:-([a-z,]+)\}", script)[1].split(",")
    paragraph = re.search(r"`scripts/setup\.sh` creates `\.venv`.*?extras", README.read_text(encoding="utf-8"), re.S)[0]
    named = re.findall(r"`([a-z]+)`", paragraph.split("this package with its", 1)[1])
    assert named == default, f"README names {named}; setup.sh installs {default}"
