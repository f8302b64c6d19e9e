"""A small OpenAI-compatible server over any drmas backend (FastAPI), for tests and for serving a local model.

``POST /v1/chat/completions`` (``n``, ``temperature``, ``top_p``, ``top_k``, ``max_tokens`` /
``max_completion_tokens``, ``stop``, ``seed``, ``logprobs``, and vLLM's ``return_token_ids``) and
``GET /v1/models``. Requests are served one at a time (backends are not thread-safe).

    python -m drmas_train.backends.openai_server --model tiny-qwen3 --port 8000
"""

# no `from __future__ import annotations`: FastAPI and pydantic resolve the local models below at runtime

import argparse
import threading
import time
import uuid
from typing import Any

from drmas_train.backends.base import SamplingParams

__all__ = ["create_app", "main"]


def create_app(backend: Any, model_name: str) -> Any:
    """A FastAPI app serving ``backend`` under the name ``model_name``."""
    from fastapi import FastAPI, HTTPException
    from pydantic import BaseModel, Field

    class Message(BaseModel):
        role: str
        content: str

    class ChatRequest(BaseModel):
        model: str
        messages: list[Message] = Field(min_length=1)
        n: int = 1
        temperature: float = 1.0
        top_p: float = 1.0
        top_k: int = -1
        max_tokens: int | None = None
        max_completion_tokens: int | None = None
        stop: str | list[str] | None = None
        seed: int | None = None
        logprobs: bool = False
        return_token_ids: bool = False

    app = FastAPI(title=f"drmas OpenAI-compatible server ({model_name})")
    lock = threading.Lock()

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "drmas"}]}

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest) -> dict[str, Any]:
        if req.model != model_name:
            raise HTTPException(404, f"model {req.model!r} not served; this server has {model_name!r}")
        try:
            sampling = SamplingParams(
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=req.top_k,
                max_new_tokens=req.max_completion_tokens or req.max_tokens or 256,
                stop=() if req.stop is None else req.stop,
                n=req.n,
                seed=req.seed,
            )
        except ValueError as err:
            raise HTTPException(400, str(err)) from err
        with lock:
            gens = backend.generate([[m.model_dump() for m in req.messages]], sampling)
        tok = backend.tokenizer
        choices = []
        for i, g in enumerate(gens):
            choice: dict[str, Any] = {
                "index": i,
                "message": {"role": "assistant", "content": g.text},
                "finish_reason": g.finish_reason,
                "logprobs": None,
            }
            if req.logprobs:
                choice["logprobs"] = {
                    "content": [
                        {"token": tok.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in zip(g.response_ids, g.logprobs, strict=False)
                    ]
                }
            if req.return_token_ids:
                choice["token_ids"] = g.response_ids
            choices.append(choice)
        prompt_len = len(gens[0].prompt_ids) if gens else 0
        body: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_len,
                "completion_tokens": sum(len(g.response_ids) for g in gens),
                "total_tokens": prompt_len + sum(len(g.response_ids) for g in gens),
            },
        }
        if req.return_token_ids:
            body["prompt_token_ids"] = gens[0].prompt_ids if gens else []
        return body

    return app


def main(argv: list[str] | None = None) -> int:
    """Serve a model (:func:`drmas_train.models.load_model`) with the HF backend."""
    import uvicorn

    from drmas_train.backends.hf import HFBackend
    from drmas_train.models import load_model

    parser = argparse.ArgumentParser(description="OpenAI-compatible server over a drmas HF backend")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="named model, local path or HF id")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    loaded = load_model(args.model)
    uvicorn.run(create_app(HFBackend.from_loaded(loaded), loaded.model_id), host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
