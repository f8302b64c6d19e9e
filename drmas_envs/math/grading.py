r"""Math answer grading: extract the last ``\boxed{...}`` and decide equivalence in a bounded worker process.

Pure rules, no env code (the envs call a grader's ``grade``). Two graders share this machinery; the math envs
select one with ``grader=`` (:mod:`drmas_envs.math.graders`):

* ``"reference"`` (the envs' default; :class:`~drmas_envs.math.reference_grading.ReferenceGrader`): the Dr. MAS
  reference's reward, the text after the first ``</think>``, the last ``\boxed{...}`` only, the reference's
  normalise-then-sympy equivalence (:mod:`drmas_envs.math.reference_equivalence`).
* ``"math_verify"`` (this module's :class:`MathGrader`), described here:

1. **Extraction** (:func:`extract_boxed`): the *last* ``\boxed{...}`` or ``\fbox{...}`` in the text, nested braces
   kept (``\boxed{\frac{1}{2}}`` -> ``\frac{1}{2}``); ``\boxed 5`` (no braces) gives ``5``. One linear scan from
   the last marker, so a 1 MB response costs about a millisecond. An unclosed last box counts as no box; the
   grader stops scanning a box after ``max_answer_chars`` characters (``too_long``).
2. **Equivalence** with `math-verify <https://github.com/huggingface/Math-Verify>`_ (``parse`` + ``verify`` on
   ``\boxed{answer}`` for both sides), never ``eval``.

Safety (LLM output is untrusted). math-verify's own timeout uses ``SIGALRM``: it only works in the main thread,
and a signal cannot interrupt a long C call (``\boxed{9^{9^{9^{9}}}}`` makes sympy compute a 370-million-digit
power). So the grader:

* applies cheap pre-checks first, in the calling process: no box -> ``no_box``; blank -> ``empty``; an answer
  longer than ``max_answer_chars`` (default 1,000) -> ``too_long``; an answer identical (after ``strip``) to a
  ground truth -> ``correct`` without parsing (``exact_shortcut``, on by default);
* runs the equivalence check (math-verify, or the reference's sympy routine) in a small **persistent worker
  process** (:class:`VerifyWorker`, ``python drmas_envs/math/_verify_worker.py``), with its address space capped (``RLIMIT_AS``, default 1 GiB) and a
  hard wall-clock limit per call (default 1 s) that covers the whole call, restarts included. On timeout the
  parent SIGKILLs the worker, answers ``timeout`` and hands the next call to a **warm spare** worker (kept
  ready beside the active one), while a new spare starts in the background: one adversarial answer no longer
  makes the next grades wait for sympy to import. Only the first start of a process (importing sympy and a
  warm-up verification, ~1-2 s) is not charged to a call; the math envs start the workers when they are
  constructed (``prestart``).
  One worker (and its spare) per backend serves a process; calls are serialised by a lock (math-verify, measured
  on GSM8K / MATH-500: p50 4-7 ms, p99 14-300 ms; ``benchmarks/grading_oracle.py``). A worker started before
  ``os.fork`` is not shared with the child: the child starts its own.

Grades are deterministic except for answers whose verification takes close to the limit: whether those time
out depends on machine load. Raise ``timeout_s`` where reproducibility matters more than throughput.

Reasons (``GradeResult.reason``): ``correct``, ``mismatch``, ``no_box``, ``empty``, ``too_long``, ``timeout``,
``parse_error`` (the worker's check raised or ran out of memory).

Example:
    >>> grade(r"so the answer is \boxed{\dfrac{1}{2}}", "0.5")
    GradeResult(extracted='\\dfrac{1}{2}', correct=True, reason='correct')
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

__all__ = [
    "GradeResult",
    "REASONS",
    "extract_boxed",
    "scan_last_box",
    "BACKENDS",
    "VerifyWorker",
    "MathGrader",
    "default_grader",
    "grade",
]

#: What can decide equivalence in a :class:`VerifyWorker` (see ``_verify_worker.py``).
BACKENDS = ("math_verify", "reference")

#: Every value ``GradeResult.reason`` can take.
REASONS = ("correct", "mismatch", "no_box", "empty", "too_long", "timeout", "parse_error")

_BOX_MARKERS = ("\\boxed", "\\fbox")
_BRACE_RE = re.compile(r"[{}]")
_WORKER_SCRIPT = Path(__file__).with_name("_verify_worker.py")


@dataclasses.dataclass(frozen=True)
class GradeResult:
    """The grade of one answer.

    Attributes:
        extracted: the answer that was compared (box content or the pre-extracted answer), ``None`` if no box.
        correct: whether it equals a ground truth.
        reason: one of :data:`REASONS`.
    """

    extracted: str | None
    correct: bool
    reason: str

    @property
    def score(self) -> float:
        """1.0 if correct else 0.0."""
        return 1.0 if self.correct else 0.0


def extract_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` / ``\fbox{...}`` in ``text`` (nested braces kept), else ``None``.

    ``\boxed 42`` (space, no braces) gives ``"42"``. An unclosed last box gives ``None``. Runs in O(len(text)).
    This is the math-verify grader's extraction; the reference grader's is
    :func:`drmas_envs.math.reference_grading.reference_boxed`.

    Raises:
        TypeError: if ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_boxed expects a str, got {type(text).__name__}")
    return scan_last_box(text)[0]


def scan_last_box(
    text: str, max_chars: int | None = None, *, markers: Sequence[str] = _BOX_MARKERS, braceless: bool = True
) -> tuple[str | None, bool]:
    r"""``(content, too_long)`` of the last of ``markers`` in ``text``.

    The marker must be followed by ``{`` (its balanced content is returned, nested braces kept) or, when
    ``braceless``, by a space and a token (``\boxed 5``). An unclosed box, or any other character after the
    marker, gives ``(None, False)``. A box still open after ``max_chars`` characters of content stops the scan at
    once (``(None, True)``), so adversarial nesting cannot cost a full pass. One C-speed pass over the braces.
    """
    start, marker = max((text.rfind(m), m) for m in markers)
    if start < 0:
        return None, False
    i = start + len(marker)
    if i < len(text) and text[i] == "{":
        stop = len(text) if max_chars is None else min(len(text), i + max_chars + 2)
        depth = 0
        for brace in _BRACE_RE.finditer(text, i, stop):  # C-speed skip over everything that is not a brace
            depth += 1 if brace.group() == "{" else -1
            if depth == 0:
                return text[i + 1 : brace.start()], False
        return None, stop < len(text)  # unclosed (or not closed within max_chars)
    if braceless and i < len(text) and text[i] == " ":
        rest = text[i : i + (max_chars or len(text)) + 64].lstrip(" ")
        token = rest.split(None, 1)[0] if rest.strip() else ""
        return token.rstrip("$.,") or None, False
    return None, False


class _WorkerProcess:
    """One ``_verify_worker.py`` process: its pipes, read buffer, readiness and the pid that started it."""

    def __init__(self, memory_limit_bytes: int, backend: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, str(_WORKER_SCRIPT), str(memory_limit_bytes), backend],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self.owner = os.getpid()
        self.ready = False
        self.buffer = b""

    def usable(self) -> bool:
        """Started by this process (not inherited through ``fork``) and still running."""
        return self.owner == os.getpid() and self.popen.poll() is None

    def readline(self, deadline: float) -> str | None:
        """One line from the worker, or ``None`` if ``deadline`` (time.monotonic) passes or the worker died."""
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # EOF: the worker exited (e.g. killed by the memory cap)
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("utf-8", errors="replace")

    def wait_ready(self, deadline: float) -> bool:
        """Whether the worker has written ``ready`` by ``deadline`` (it keeps starting if not)."""
        if not self.ready:
            line = self.readline(deadline)
            if line is not None and line != "ready":
                raise RuntimeError(f"the grading worker sent {line!r} instead of 'ready'")
            self.ready = line == "ready"
        return self.ready

    def kill(self) -> None:
        if self.owner == os.getpid():
            self.popen.kill()
            self.popen.wait()


class VerifyWorker:
    """A persistent equivalence-checking process with a hard per-call time limit and a memory cap, plus a warm
    spare.

    Args:
        memory_limit_bytes: ``RLIMIT_AS`` of each worker process (default 1 GiB; 0 = no cap).
        startup_timeout_s: how long the *first* call waits for the first worker (and its spare) to import
            its backend (~1-2 s; not charged to that call's limit).
        backend: what decides equivalence in the worker: ``"math_verify"`` (math-verify) or ``"reference"``
            (the Dr. MAS reference's routine, :mod:`drmas_envs.math.reference_equivalence`).

    Every later call is bounded by its own limit, restarts included: a call that times out kills the worker and
    promotes the **spare** (a second process, already warm), and a new spare starts in the background. A call
    that finds no ready worker (the spare is still importing after back-to-back timeouts) waits for it inside
    its own limit and, past it, answers ``timeout`` like a slow verification. Two processes of ~150 MB each.
    POSIX only (``select`` on pipes).
    """

    def __init__(
        self, memory_limit_bytes: int = 1 << 30, startup_timeout_s: float = 120.0, backend: str = "math_verify"
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.backend = backend
        self.memory_limit_bytes = int(memory_limit_bytes)
        self.startup_timeout_s = float(startup_timeout_s)
        self._lock = threading.Lock()
        self._active: _WorkerProcess | None = None
        self._spare: _WorkerProcess | None = None
        self._warm_pid = -1  # os.getpid() of the process in which a worker was once ready (cold start done)
        self.restarts = 0  # how many times a worker was killed (timeouts, crashes)

    @property
    def _proc(self) -> subprocess.Popen[bytes] | None:
        """The active worker's process (None before the first start)."""
        return self._active.popen if self._active is not None else None

    def _fill(self) -> None:
        """Make sure an active worker and a spare exist (started by this process, running); never waits."""
        if self._active is None or not self._active.usable():
            if self._active is not None and self._active.owner == os.getpid():
                self._active.kill()  # died on its own (memory cap): reap it
            if self._spare is not None and self._spare.usable():
                self._active, self._spare = self._spare, None
            else:
                self._active = _WorkerProcess(self.memory_limit_bytes, self.backend)
        if self._spare is None or not self._spare.usable():
            self._spare = _WorkerProcess(self.memory_limit_bytes, self.backend)

    def prestart(self) -> None:
        """Start the worker and its spare now without waiting for them (they import while the caller works on)."""
        with self._lock:
            self._fill()

    def _replace_active(self) -> None:
        """Kill the active worker and promote the spare; a new spare starts in the background."""
        assert self._active is not None
        self._active.kill()
        self._active = None
        self.restarts += 1
        self._fill()

    def verify(self, pred: str, golds: Sequence[str], timeout_s: float) -> tuple[bool, str | None]:
        """Whether ``pred`` equals any of ``golds`` (extracted answers), within ``timeout_s`` seconds.

        The limit covers the whole call (waiting for a ready worker included), except the very first call of a
        process, which may wait up to ``startup_timeout_s`` for the first workers to import math-verify.

        Returns:
            ``(ok, error)``: ``error`` is ``None``, ``"timeout"`` (the limit passed: the worker was killed and
            the spare took over, or no worker was ready in time), ``"worker died"`` or math-verify's exception text.

        Raises:
            RuntimeError: the first worker did not start within ``startup_timeout_s`` (math-verify missing?).
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._fill()
            assert self._active is not None and self._spare is not None
            if self._warm_pid != os.getpid():  # cold start: wait for both, not charged to the call
                cold = time.monotonic() + self.startup_timeout_s
                if not (self._active.wait_ready(cold) and self._spare.wait_ready(cold)):
                    self._active.kill()
                    self._spare.kill()
                    self._active = self._spare = None
                    needs = "math-verify" if self.backend == "math_verify" else "sympy and pylatexenc"
                    raise RuntimeError(
                        f"the {self.backend} grading worker ({_WORKER_SCRIPT}) did not start within "
                        f"{self.startup_timeout_s} s; check that {needs} is installed for {sys.executable}"
                    )
                self._warm_pid = os.getpid()
                deadline = time.monotonic() + timeout_s
            elif not self._active.wait_ready(deadline):
                return False, "timeout"  # still importing after back-to-back timeouts; it keeps starting
            assert self._active.popen.stdin is not None
            try:
                self._active.popen.stdin.write((json.dumps({"pred": pred, "golds": list(golds)}) + "\n").encode())
                self._active.popen.stdin.flush()
            except (BrokenPipeError, OSError):
                self._replace_active()
                return False, "worker died"
            line = self._active.readline(deadline)
            if line is None:
                self._replace_active()
                return False, "timeout"
            reply = json.loads(line)
            return bool(reply["ok"]), reply["error"]

    def close(self) -> None:
        """Stop the worker and its spare (safe to call twice); a later :meth:`verify` starts new ones."""
        with self._lock:
            for proc in (self._active, self._spare):
                if proc is not None:
                    proc.kill()
            self._active = self._spare = None
            self._warm_pid = -1


@dataclasses.dataclass
class MathGrader:
    r"""The **math-verify** grader: the last ``\boxed{}`` / ``\fbox{}`` of the whole response, math-verify
    equivalence (see the module docstring for the rules and reasons). Subclasses change what is graded and how
    (:class:`~drmas_envs.math.reference_grading.ReferenceGrader`) through :meth:`extract`, :meth:`is_valid`,
    :meth:`graded_answer` and :meth:`ground_truths`; timeouts, caps and the worker are shared.

    Args:
        timeout_s: hard wall-clock limit of one equivalence check in the worker, in seconds (> 0).
        max_answer_chars: longer extracted answers are ``too_long`` without parsing.
        exact_shortcut: an answer identical to a ground truth (after ``strip``) is correct without the worker.
        worker: the :class:`VerifyWorker` to use (default: one shared per process and backend); its ``backend``
            must be this grader's.

    Raises:
        ValueError: non-positive ``timeout_s`` or ``max_answer_chars``, or a ``worker`` of another backend.
    """

    #: The grader's name (``grader=`` of the math envs, :data:`drmas_envs.math.graders.GRADERS`).
    name: ClassVar[str] = "math_verify"
    #: The :class:`VerifyWorker` backend that decides equivalence.
    backend: ClassVar[str] = "math_verify"
    #: Whether the worker gets the answer and ground truths as extracted (unstripped): the reference's routine
    #: normalises them itself, and its normalisers look at leading characters.
    verbatim: ClassVar[bool] = False

    timeout_s: float = 1.0
    max_answer_chars: int = 1000
    exact_shortcut: bool = True
    worker: VerifyWorker | None = None

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        if not self.max_answer_chars > 0:
            raise ValueError(f"max_answer_chars must be > 0, got {self.max_answer_chars!r}")
        if self.worker is not None and self.worker.backend != self.backend:
            raise ValueError(
                f"the {self.name} grader needs a worker with backend={self.backend!r}, got {self.worker.backend!r}"
            )

    def _worker(self) -> VerifyWorker:
        return self.worker if self.worker is not None else default_worker(self.backend)

    def prestart(self) -> None:
        """Start this grader's worker in the background (envs call it at construction)."""
        self._worker().prestart()

    # ---- what is graded (overridden by other graders) ----
    def extract(self, text: str) -> str | None:
        """The answer as this grader's validity rule reads it in a whole reply (:func:`extract_boxed`)."""
        return extract_boxed(text)

    def is_valid(self, text: str) -> bool:
        """Whether a proposer's reply is well-formed (its ``is_action_valid``): a non-blank box."""
        extracted = self.extract(text)
        return bool(extracted and extracted.strip())

    def graded_answer(self, response: str) -> tuple[str | None, bool]:
        """``(answer, too_long)``: what is compared with the ground truths (:func:`scan_last_box`)."""
        return scan_last_box(response, self.max_answer_chars)

    def ground_truths(self, golds: tuple[str, ...]) -> tuple[str, ...]:
        """The ground truths as the worker compares them."""
        return golds

    def grade(
        self, response: str, ground_truth: str | Sequence[str], *, pre_extracted: bool = False
    ) -> GradeResult:
        r"""Grade ``response`` (a reply with a ``\boxed{}``, or the answer itself if ``pre_extracted``).

        ``ground_truth`` is one answer string or several acceptable ones (extracted form, no ``\boxed``).

        Raises:
            TypeError: ``response`` or a ground truth is not a str.
            ValueError: no ground truth given.
        """
        if not isinstance(response, str):
            raise TypeError(f"response must be a str, got {type(response).__name__}")
        golds = (ground_truth,) if isinstance(ground_truth, str) else tuple(ground_truth)
        if not golds or not all(isinstance(g, str) for g in golds):
            raise ValueError(
                f"ground_truth must be a str or a non-empty sequence of str, got {ground_truth!r}"
            )
        if pre_extracted:
            answer: str | None = response
        else:
            answer, too_long = self.graded_answer(response)
            if too_long:
                return GradeResult(None, False, "too_long")
        if answer is None:
            return GradeResult(None, False, "no_box")
        raw, answer = answer, answer.strip()
        if not answer:
            return GradeResult(answer, False, "empty")
        if len(answer) > self.max_answer_chars:
            return GradeResult(answer[: self.max_answer_chars] + "...", False, "too_long")
        golds = self.ground_truths(golds)
        if not golds:
            return GradeResult(answer, False, "mismatch")
        stripped = tuple(g.strip() for g in golds)
        if self.exact_shortcut and answer in stripped:
            return GradeResult(answer, True, "correct")
        if self.verbatim:
            ok, error = self._worker().verify(raw, golds, self.timeout_s)
        else:
            ok, error = self._worker().verify(answer, stripped, self.timeout_s)
        if error == "timeout":
            return GradeResult(answer, False, "timeout")
        if error is not None:
            return GradeResult(answer, False, "parse_error")
        return GradeResult(answer, ok, "correct" if ok else "mismatch")


_DEFAULT_WORKERS: dict[str, VerifyWorker] = {}
_DEFAULT_GRADER: MathGrader | None = None


def default_worker(backend: str = "math_verify") -> VerifyWorker:
    """The process-wide :class:`VerifyWorker` of ``backend`` (created on first use, stopped at exit).

    Raises:
        ValueError: unknown ``backend``.
    """
    if backend not in _DEFAULT_WORKERS:
        worker = VerifyWorker(backend=backend)
        atexit.register(worker.close)
        _DEFAULT_WORKERS[backend] = worker
    return _DEFAULT_WORKERS[backend]


def default_grader() -> MathGrader:
    """A math-verify :class:`MathGrader` with default settings (1 s, 1,000 chars, exact shortcut on)."""
    global _DEFAULT_GRADER
    if _DEFAULT_GRADER is None:
        _DEFAULT_GRADER = MathGrader()
    return _DEFAULT_GRADER


def grade(
    response: str,
    ground_truth: str | Sequence[str],
    *,
    pre_extracted: bool = False,
    timeout_s: float | None = None,
) -> GradeResult:
    """Grade with the default math-verify :class:`MathGrader` (``timeout_s`` overrides its 1 s limit for this
    call)."""
    grader = (
        default_grader() if timeout_s is None else dataclasses.replace(default_grader(), timeout_s=timeout_s)
    )
    return grader.grade(response, ground_truth, pre_extracted=pre_extracted)
