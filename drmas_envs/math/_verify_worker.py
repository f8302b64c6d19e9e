"""The math-verify worker process behind :mod:`drmas_envs.math.grading` (run as ``python -m``; not imported).

Protocol (one JSON object per line, UTF-8):
    parent -> worker   ``{"pred": str, "golds": [str, ...]}``   each string is an extracted answer (no ``\\boxed``).
    worker -> parent   ``{"ok": bool, "error": str | null}``    ``ok``: pred equals at least one gold.
At start-up the worker caps its own address space (``RLIMIT_AS``, bytes from ``argv[1]``; 0 = no cap), imports
math-verify, warms it up with two verifications (its first call lazily loads sympy/antlr internals, ~0.5 s) and
writes the line ``ready``. It then answers requests one at a time until stdin closes.

The worker never bounds its own time: math-verify's timeouts use ``SIGALRM``, which cannot interrupt a long C
call such as a huge integer power. The parent kills this process instead (see ``grading.VerifyWorker``).
"""

from __future__ import annotations

import functools
import json
import logging
import sys


def _cap_memory(limit_bytes: int) -> None:
    if limit_bytes <= 0:
        return
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    except (ImportError, ValueError, OSError):  # not POSIX, or the hard limit is lower: keep going uncapped
        pass


def main() -> int:
    """Serve verify requests on stdin/stdout until EOF; returns the exit code."""
    _cap_memory(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    logging.disable(logging.WARNING)  # math-verify warns that its own timeouts are off; the parent owns time.
    from math_verify import parse, verify

    def parse_boxed(answer: str):
        return parse("\\boxed{" + answer + "}", parsing_timeout=None)

    parsed_gold = functools.lru_cache(maxsize=4096)(parse_boxed)  # ground truths repeat across a GRPO group

    # Warm up: the first parse/verify loads sympy/antlr internals lazily (~0.5 s), which must not be charged
    # to the first real call's time limit.
    verify(parsed_gold("\\frac{1}{2}"), parse_boxed("0.5"), timeout_seconds=None)
    verify(parsed_gold("x^2+1"), parse_boxed("(1,2]"), timeout_seconds=None)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            pred = parse_boxed(request["pred"])
            ok = bool(pred) and any(
                verify(parsed_gold(g), pred, timeout_seconds=None) for g in request["golds"]
            )
            reply = {"ok": ok, "error": None}
        except MemoryError:
            reply = {"ok": False, "error": "memory"}
        except Exception as err:  # noqa: BLE001 - any parser failure on untrusted text is a non-match
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}"[:200]}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
