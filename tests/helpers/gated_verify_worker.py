"""A stand-in for ``drmas_envs/math/_verify_worker.py`` that stays *not ready* until its test opens a gate.

Run as ``python gated_verify_worker.py <memory limit bytes>`` (the real worker's command line), with
``DRMAS_TEST_WORKER_GATE`` naming a file: until that file exists the process writes nothing, as a worker still
importing sympy would; once it exists it ``exec``s the real worker in the same process (same pid, same pipes), which
then imports math-verify and writes ``ready``. Tests point ``grading._WORKER_SCRIPT`` at this file to reach the
"no ready worker" path of ``VerifyWorker.verify`` deterministically instead of racing a real import.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import drmas_envs.math.grading as grading

if __name__ == "__main__":
    gate = Path(os.environ["DRMAS_TEST_WORKER_GATE"])
    while not gate.exists():  # waiting on an event the test controls; nothing here is timed
        time.sleep(0.01)
    real = str(Path(grading.__file__).with_name("_verify_worker.py"))
    os.execv(sys.executable, [sys.executable, real, *sys.argv[1:]])
