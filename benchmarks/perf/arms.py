"""A benchmark's arms, each in a fresh process, so that each arm's peak memory is its own.

The benchmark script re-runs itself once per arm with an argument naming the arm (``rank_memory.py --arm``,
``lora_agents_memory.py --child``); the child prints the arm's figures as one JSON object on its last stdout line.
The scripts load this file by path (``benchmarks`` is no package).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterable
from typing import Any

#: Characters of a failed child's stderr kept (the end of its traceback).
STDERR_TAIL_CHARS = 4000


class ArmFailed(RuntimeError):
    """A child exited with a non-zero status: ``arm``, ``returncode`` and ``stderr_tail`` (the last
    :data:`STDERR_TAIL_CHARS` characters of its stderr)."""

    def __init__(self, arm: str, returncode: int, stderr_tail: str) -> None:
        super().__init__(f"arm {arm!r} exited with status {returncode}")
        self.arm, self.returncode, self.stderr_tail = arm, returncode, stderr_tail


def run_arms(arms: Iterable[str], command: Callable[[str], list[str]]) -> dict[str, Any]:
    """Run ``command(arm)`` for each arm in turn, each in a fresh process, and parse its last stdout line as JSON.

    The children get this process's environment with ``OMP_NUM_THREADS`` set to 1 unless it is set already;
    their stdout and stderr are captured.

    Returns:
        ``{arm: the child's JSON}``, in the order of ``arms``.

    Raises:
        ArmFailed: at the first child that exits non-zero (the later arms do not run).
        IndexError / json.JSONDecodeError: a child exited 0 without printing a JSON line last.
    """
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    results: dict[str, Any] = {}
    for arm in arms:
        done = subprocess.run(command(arm), capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise ArmFailed(arm, done.returncode, done.stderr[-STDERR_TAIL_CHARS:])
        results[arm] = json.loads(done.stdout.strip().splitlines()[-1])
    return results
