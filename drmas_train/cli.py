"""The ``drmas`` command line: ``drmas <subcommand> [args...]``.

Each subcommand lives in its own module under :mod:`drmas_train.commands` exposing ``main(argv) -> int``;
they are imported only when called, so ``drmas --help`` is instant and needs no torch.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys

#: subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("drmas_train.commands.train", "train a multi-agent LLM system with GRPO / Dr. MAS"),
    "eval": ("drmas_train.commands.eval", "evaluate a policy on env ids x data sources (avg@k, pass@k)"),
    "crossplay": ("drmas_train.commands.crossplay", "cross-play a run's checkpoints: one role's x another's (heatmaps)"),
    "leaderboard": ("drmas_train.commands.leaderboard", "aggregate eval results into Markdown/HTML/PNG tables"),
    "retrieval-server": ("drmas_train.commands.retrieval_server", "serve a local retriever over HTTP"),
    "serve": ("drmas_train.commands.serve", "serve a model with the OpenAI API (chat, completions, streaming)"),
    "data": ("drmas_train.commands.data", "build the paper's train/test sets from downloaded files (list | prepare | verify)"),
    "envs": ("drmas_train.commands.envs", "list registered environments"),
    "play": ("drmas_train.commands.play", "play one episode of an env with scripted or LLM policies"),
    "rehearse": ("drmas_train.commands.rehearse", "dress-rehearse a (paper) preset on a CPU with tiny models"),
}


def _usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in SUBCOMMANDS.items())
    return f"usage: drmas <command> [args...]\n\ncommands:\n{rows}\n\nRun 'drmas <command> --help' for details."


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``drmas`` console script; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from drmas_train import __version__

        print(f"drmas {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        close = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        print(f"drmas: unknown command {name!r}.{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    if not sys.stderr.isatty():  # a log file: the Hugging Face libraries' own bars (loading, saving weights) would
        # write \r and cursor moves into it; drmas's own progress is line-based there (collect/progress.py)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
