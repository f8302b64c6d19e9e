"""``drmas train [--config PRESET|FILE.yaml] [key=value ...] [--resume]``: train a multi-agent LLM system.

Without ``--config`` the bundled ``quickstart_math`` preset runs (SmolLM2-135M-Instruct as Solver and Verifier
on reasoning-gym basic_arithmetic (one-digit additions and subtractions), Dr. MAS advantages; minutes on a laptop
CPU, offline).

Exit codes: 0 done (also ``--resume`` of a run that already reached ``run.iterations``: it says so and writes
nothing); 2 a user mistake (bad config key or value, missing ``env.data`` file, unknown ``env.id``, env kwargs of
another env, a model name that does not resolve, ``--resume`` without a checkpoint, ``run.dir`` holding an earlier
run), one message on stderr and no traceback, with nothing written; 130 interrupted by Ctrl-C (after saving a
checkpoint). A run directory that holds an earlier run is never truncated: continue it with ``--resume``, choose
another ``run.dir=...``, or delete the whole earlier run with ``--overwrite`` (done only once everything is
validated and the models are loaded).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from drmas_train.commands import HelpFormatter
from drmas_train.run.config import DEFAULT_PRESET, ConfigError, list_presets, load_config, to_yaml


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="drmas train",
        description="Train a multi-agent LLM system with GRPO / Dr. MAS advantages.",
        epilog="examples:\n  drmas train\n  drmas train --config grpo_math_qwen3_4b rollout.group_size=4\n"
        "  drmas train --config my.yaml env.data=../shared/data/gsm8k_test.jsonl --resume",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--config", "-c", default=None, help=f"preset name or YAML path (default: {DEFAULT_PRESET}; --list-presets lists them)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. run.iterations=2")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in run.dir (a run that reached run.iterations: nothing to do)")
    p.add_argument("--overwrite", action="store_true",
                   help="delete the earlier run in run.dir and start again, once the config is validated and the "
                        "models are loaded (default: refuse)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--list-presets", action="store_true", help="list the bundled presets and exit")
    return p


class LevelFormatter(logging.Formatter):
    """Console lines as logged, those at WARNING and above prefixed with their level (``WARNING: ...``), so that a
    warning reads as one in a terminal or a log file (docs/agent-health.md: "one WARNING is logged")."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return f"{record.levelname}: {text}" if record.levelno >= logging.WARNING else text


def done_line(command_s: float, summary: dict) -> str:
    """The first words of the last line: this command's wall time, split into start-up (config, models, resume) and
    training (``summary["process_wall_time_s"]``: the loop, from the loaded models to the summary); for a resumed run
    also the training time of the whole run, every process's (``summary["wall_time_s"]``)."""
    loop = summary["process_wall_time_s"]
    text = f"done in {command_s:.0f}s (start-up and model loading {max(command_s - loop, 0.0):.0f}s, training {loop:.0f}s"
    if summary["resumed_from"]:  # a resumed run: say what the whole run's training took
        text += f"; the whole run's training, resumes included: {summary['wall_time_s']:.0f}s"
    return text + ")"


def main(argv: list[str]) -> int:
    """Entry point; returns the exit code (2 for a bad config, before any model loads)."""
    started = time.perf_counter()  # "done in": the whole command, start-up and model loading included
    args = _parser().parse_intermixed_args(argv)  # overrides may come before and after --resume etc.
    if args.list_presets:
        print("\n".join(list_presets()))
        return 0
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"drmas train: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print(to_yaml(cfg))
        return 0
    from drmas_envs.search.retrievers import RetrieverError, RetrieverUnavailableError
    from drmas_train.distributed.errors import DistributedError
    from drmas_train.run.checkpoint import CheckpointSpaceError
    from drmas_train.run.run_dir import RunFinished
    from drmas_train.run.trainer import train

    console = logging.StreamHandler()
    console.setFormatter(LevelFormatter("%(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[console])  # other libraries: warnings only
    for name in ("drmas_train", "drmas_envs"):  # drmas's own messages (per-iteration summaries, resume, Ctrl-C)
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        summary = train(cfg, resume=args.resume, overwrite=args.overwrite)
    except ConfigError as err:
        print(f"drmas train: {err}", file=sys.stderr)
        return 2
    except RunFinished as done:  # --resume of a finished run: a no-op, nothing loaded or written
        print(f"drmas train: {done}")
        return 0
    except DistributedError as err:  # a worker group failed for good: the message names the model and what to do
        print(f"drmas train: {err}", file=sys.stderr)
        return 1
    except RetrieverError as err:  # the search env's retriever: a server that refuses the protocol (a setting: 2), or
        # one unreachable within the retrieval budget with retrieval_failure: raise (1); checkpoints are kept
        print(f"drmas train: retrieval failed: {err}", file=sys.stderr)
        return 1 if isinstance(err, RetrieverUnavailableError) else 2
    except CheckpointSpaceError as err:  # disk full: what was needed and which checkpoint survived, in one line
        print(f"drmas train: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("drmas train: interrupted", file=sys.stderr)
        return 130
    print(f"{done_line(time.perf_counter() - started, summary)}; run dir {summary['run_dir']}")
    if summary["plot"]:
        print(f"plot: {summary['plot']}")
    if summary["checkpoint"]:
        print(f"checkpoint: {summary['checkpoint']}")
    return 0
