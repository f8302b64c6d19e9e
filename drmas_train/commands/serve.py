"""``drmas serve``: serve a model with the OpenAI API (chat and completions, streaming, concurrent requests batched).

    drmas serve --model smollm2-135m-instruct --port 8000

Limits (see :func:`drmas_train.serving.openai_server.create_app`): a prompt longer than the model's context is refused
with HTTP 400 (``--prompt-truncation left`` cuts it instead), ``max_tokens`` must fit beside it, a body over
``--max-body-bytes`` gets HTTP 413, and a client that disconnects has its generation stopped.

Clients: ``LLMPolicy.from_model(name, backend="openai", base_url="http://127.0.0.1:8000/v1")``, ``drmas eval
--backend openai``, or any OpenAI client. All logic lives in :mod:`drmas_train.serving.openai_server`; this module
only parses arguments (its sibling ``drmas retrieval-server`` serves a search index).
"""

from __future__ import annotations

import argparse

from drmas_train.commands import HelpFormatter, doc_summary

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``drmas serve``."""
    p = argparse.ArgumentParser(prog="drmas serve", description=doc_summary(__doc__), formatter_class=HelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="named offline model, local path or HF id")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback only by default)")
    p.add_argument("--port", type=int, default=8000, help="TCP port")
    p.add_argument("--batch-window", type=float, default=0.02, help="seconds a request waits for others to batch with")
    p.add_argument("--max-batch", type=int, default=64, help="most prompts in one batched generate call")
    p.add_argument("--prompt-truncation", default="error", choices=["error", "left"],
                   help="a prompt that leaves no room in the model's context: refused with HTTP 400 (error), or cut "
                        "to its last context - max_tokens tokens (left)")
    p.add_argument("--context", type=int, default=None,
                   help="prompt + completion tokens allowed per request (default: the model's max_position_embeddings)")
    p.add_argument("--max-body-bytes", type=int, default=2**20,
                   help="largest request body in bytes; larger ones are refused with HTTP 413")
    p.add_argument("--shutdown-timeout", type=float, default=3.0,
                   help="seconds SIGTERM / Ctrl-C waits for requests in progress before cancelling them")
    return p


def main(argv: list[str]) -> int:
    """Load the model with the HF backend and serve it until interrupted (SIGTERM or Ctrl-C: requests in progress get
    ``--shutdown-timeout`` seconds, then are cancelled); returns the exit code (2: unknown model or a bad option)."""
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
    try:
        app = create_app(HFBackend.from_loaded(loaded), loaded.model_id, batch_window_s=args.batch_window,
                         max_batch_prompts=args.max_batch, context_tokens=args.context,
                         prompt_truncation=args.prompt_truncation, max_body_bytes=args.max_body_bytes)  # fmt: skip
    except ValueError as err:
        print(f"drmas serve: {err}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=args.shutdown_timeout)
    return 0
