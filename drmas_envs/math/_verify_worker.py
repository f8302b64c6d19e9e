"""The equivalence worker process behind :mod:`drmas_envs.math.grading` (run as a script; not imported).

    python _verify_worker.py <memory limit bytes> <backend>

Protocol (one JSON object per line, UTF-8):
    parent -> worker   ``{"pred": str, "golds": [str, ...]}``   each string is an extracted answer (no ``\\boxed``).
    worker -> parent   ``{"ok": bool, "error": str | null}``    ``ok``: pred equals at least one gold.

Backends (``argv[2]``, default ``math_verify``):
    ``math_verify``  math-verify's ``parse`` + ``verify`` on ``\\boxed{answer}`` for both sides.
    ``reference``    the Dr. MAS reference's normalise-then-sympy routine
                     (:mod:`drmas_envs.math.reference_equivalence`, imported as a sibling module of this script so
                     the worker does not import drmas, pettingzoo or numpy).

At start-up the worker caps its own address space (``RLIMIT_AS``, bytes from ``argv[1]``; 0 = no cap), imports
its backend, warms it up (the first parse lazily loads sympy/antlr/pylatexenc internals, ~0.5 s) and writes the
line ``ready``. It then answers requests one at a time until stdin closes.

The worker never bounds its own time: math-verify's timeouts use ``SIGALRM``, which cannot interrupt a long C
call such as a huge integer power, and the reference's routine has none. The parent kills this process instead
(see ``grading.VerifyWorker``).
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable, Sequence

BACKENDS = ("math_verify", "reference")


def _cap_memory(limit_bytes: int) -> None:
    if limit_bytes <= 0:
        return
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    except (ImportError, ValueError, OSError):  # not POSIX, or the hard limit is lower: keep going uncapped
        pass


def _math_verify() -> Callable[[str, Sequence[str]], bool]:
    from math_verify import parse, verify

    def parse_boxed(answer: str):
        return parse("\\boxed{" + answer + "}", parsing_timeout=None)

    parsed_gold = functools.lru_cache(maxsize=4096)(parse_boxed)  # ground truths repeat across a GRPO group

    def check(pred: str, golds: Sequence[str]) -> bool:
        parsed = parse_boxed(pred)
        return bool(parsed) and any(verify(parsed_gold(g), parsed, timeout_seconds=None) for g in golds)

    return check


def _reference() -> Callable[[str, Sequence[str]], bool]:
    from reference_equivalence import equivalent_any  # this script's directory is sys.path[0]

    return equivalent_any


def main() -> int:
    """Serve verify requests on stdin/stdout until EOF; returns the exit code."""
    _cap_memory(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    backend = sys.argv[2] if len(sys.argv) > 2 else "math_verify"
    if backend not in BACKENDS:
        sys.stdout.write(f"unknown backend {backend!r}; accepted: {BACKENDS}\n")
        return 2
    # math-verify warns that its own timeouts are off (the parent owns time), pylatexenc about odd macros;
    # stderr is /dev/null, so the warnings would only cost time
    logging.disable(logging.WARNING)
    check = _math_verify() if backend == "math_verify" else _reference()
    # Warm up: the first calls load sympy/antlr/pylatexenc internals lazily (~0.5 s), which must not be charged
    # to the first real call's time limit.
    check("0.5", ["\\frac{1}{2}"])
    check("(1,2]", ["x^2+1"])
    check("\\sqrt{2}/2", ["\\frac{\\sqrt{2}}{2}"])
    check("2x+2", ["2(x+1)"])  # the reference's sympy parse + simplify
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = {"ok": bool(check(request["pred"], request["golds"])), "error": None}
        except MemoryError:
            reply = {"ok": False, "error": "memory"}
        except Exception as err:  # noqa: BLE001 - any parser failure on untrusted text is a non-match
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}"[:200]}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
