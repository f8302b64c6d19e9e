"""``drmas serve``: serve a model with the OpenAI API (chat and completions, streaming, concurrent requests batched).

    drmas serve --model smollm2-135m-instruct --port 8000

Clients: ``LLMPolicy.from_model(name, backend="openai", base_url="http://127.0.0.1:8000/v1")``, ``drmas eval
--backend openai``, or any OpenAI client. All logic lives in :mod:`drmas_train.serving.openai_server`; this module
only parses arguments (its sibling ``drmas retrieval-server`` serves a search index).
"""

from __future__ import annotations

import argparse

from drmas_train.commands import HelpFormatter

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``drmas serve``."""
    p = argparse.ArgumentParser(prog="drmas serve", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="named offline model, local path or HF id")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback only by default)")
    p.add_argument("--port", type=int, default=8000, help="TCP port")
    p.add_argument("--batch-window", type=float, default=0.02, help="seconds a request waits for others to batch with")
    p.add_argument("--max-batch", type=int, default=64, help="most prompts in one batched generate call")
    return p


def main(argv: list[str]) -> int:
    """Load the model with the HF backend and serve it until interrupted; returns the exit code (2: unknown model)."""
    import sys

    args = build_parser().parse_args(argv)
    import uvicorn

    from drmas_train.backends.hf import HFBackend
    from drmas_train.model.models import ModelNotFoundError, load_model
    from drmas_train.serving.openai_server import create_app

    try:
        loaded = load_model(args.model)
    except ModelNotFoundError as err:
        print(f"drmas serve: {err}", file=sys.stderr)
        return 2
    app = create_app(HFBackend.from_loaded(loaded), loaded.model_id, batch_window_s=args.batch_window,
                     max_batch_prompts=args.max_batch)  # fmt: skip
    uvicorn.run(app, host=args.host, port=args.port)
    return 0
