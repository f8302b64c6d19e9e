"""A small OpenAI-compatible server over any drmas backend (FastAPI), for tests and for serving a local model.

Endpoints (the subset of the OpenAI API that chat tools and the ``openai`` client use):

* ``POST /v1/chat/completions``: ``messages`` (``content`` a string or a list of ``{"type": "text", "text": ...}``
  parts), ``n``, ``temperature``, ``top_p``, ``top_k``, ``max_tokens`` / ``max_completion_tokens``, ``stop``,
  ``seed``, ``logprobs``, ``stream`` (server-sent events, ``stream_options.include_usage``) and vLLM's
  ``return_token_ids``;
* ``POST /v1/completions``: raw-text (or token-id) ``prompt`` (one or a list), the same sampling fields,
  ``logprobs`` (log-probs of the sampled tokens), ``stream``; needs a backend with ``generate_ids`` and a tokenizer
  (the ``hf`` backend);
* ``GET /v1/models``.

**Batching** (the reference behaviour is vLLM's continuous batching; a batch window is enough here): requests
are queued; one scheduler thread takes the first, waits ``batch_window_s`` for more (up to ``max_batch_prompts``
prompts) and sends requests that share their sampling parameters through **one** batched ``generate`` call of the
backend. Backends are not thread-safe, so only that thread ever calls the backend. A request with an explicit
``seed`` is generated alone, so its result is reproducible whatever else is queued (the same result as
``backend.generate`` with that seed).

**Streaming**: with ``stream=true`` the reply is ``text/event-stream``: one ``chat.completion.chunk`` (or
``text_completion``) event per decoded token when the backend reports tokens as it decodes (the ``hf`` backend's
``on_tokens``), else one event per choice once it is done; then a final event with ``finish_reason``, an optional
usage event, and ``data: [DONE]``.

    drmas serve --model smollm2-135m-instruct --port 8000      # drmas_train.commands.serve
"""

# no `from __future__ import annotations`: FastAPI and pydantic resolve the local models below at runtime

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from drmas_train.backends.base import Generation, SamplingParams, reports_tokens

__all__ = ["create_app", "RequestBatcher"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Job:
    """One request waiting for the backend: ``prompts`` are chat conversations (``kind="chat"``) or token ids."""

    kind: str  # "chat" | "ids"
    prompts: list[Any]
    sampling: SamplingParams
    future: concurrent.futures.Future  # -> list[Generation], len(prompts) * n, prompt-major
    on_token: Callable[[int, int], None] | None = None  # (choice index, token id), called from the batch thread

    def key(self) -> Any:
        """Requests with equal keys share one backend call; a seeded request never shares."""
        return (self.kind, self.sampling) if self.sampling.seed is None else id(self)


class RequestBatcher:
    """Collects concurrent requests for ``batch_window_s`` and runs them through batched ``generate`` calls.

    Args:
        backend: a drmas backend (``generate(prompts, sampling, **kw)``; ``generate_ids`` for raw prompts).
        batch_window_s: how long the first request of a batch waits for others, in seconds (>= 0).
        max_batch_prompts: most prompts in one backend call (>= 1).

    Raises:
        ValueError: a negative window or a non-positive batch size.
    """

    def __init__(self, backend: Any, *, batch_window_s: float = 0.02, max_batch_prompts: int = 64) -> None:
        if not batch_window_s >= 0:
            raise ValueError(f"batch_window_s must be >= 0 seconds, got {batch_window_s!r}")
        if isinstance(max_batch_prompts, bool) or not isinstance(max_batch_prompts, int) or max_batch_prompts < 1:
            raise ValueError(f"max_batch_prompts must be an int >= 1, got {max_batch_prompts!r}")
        self.backend = backend
        self.batch_window_s = float(batch_window_s)
        self.max_batch_prompts = max_batch_prompts
        self.backend_calls = 0  # batched generate calls made (for tests and metrics)
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._methods = {name for name in ("generate", "generate_ids") if callable(getattr(backend, name, None))}
        self._streams = reports_tokens(backend)  # one answer for both methods: generate passes on_tokens on
        self._thread = threading.Thread(target=self._run, name="drmas-openai-batcher", daemon=True)
        self._thread.start()

    @property
    def supports_ids(self) -> bool:
        """Whether raw (token-id) prompts can be served (``/v1/completions``)."""
        return "generate_ids" in self._methods and getattr(self.backend, "tokenizer", None) is not None

    def submit(self, kind: str, prompts: list[Any], sampling: SamplingParams,
               on_token: Callable[[int, int], None] | None = None) -> concurrent.futures.Future:  # fmt: skip
        """Queue a request; the future gets ``len(prompts) * sampling.n`` generations (prompt-major)."""
        job = _Job(kind, prompts, sampling, concurrent.futures.Future(), on_token)
        self._queue.put(job)
        return job.future

    def close(self) -> None:
        """Stop the scheduler thread after the queued requests (safe to call twice)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=60)

    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        jobs, size = [first], len(first.prompts)
        deadline = time.monotonic() + self.batch_window_s
        while size < self.max_batch_prompts:
            remaining = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            jobs.append(job)
            size += len(job.prompts)
        return jobs, False

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            jobs, stop = self._collect(first)
            groups: dict[Any, list[_Job]] = {}
            for job in jobs:
                groups.setdefault(job.key(), []).append(job)
            for group in groups.values():
                self._generate(group)

    def _generate(self, group: list[_Job]) -> None:
        kind, sampling = group[0].kind, group[0].sampling
        prompts = [p for job in group for p in job.prompts]
        owner: list[tuple[_Job, int]] = []  # output row -> (job, choice index in that job)
        for job in group:
            owner.extend((job, i) for i in range(len(job.prompts) * sampling.n))
        kwargs: dict[str, Any] = {}
        method = "generate" if kind == "chat" else "generate_ids"
        if self._streams and any(job.on_token for job in group):

            def on_tokens(rows: list[int], tokens: list[int]) -> None:
                for row, token in zip(rows, tokens, strict=True):
                    job, choice = owner[row]
                    if job.on_token is not None:
                        job.on_token(choice, token)

            kwargs["on_tokens"] = on_tokens
        try:
            gens = getattr(self.backend, method)(prompts, sampling, **kwargs)
            self.backend_calls += 1
        except Exception as err:  # noqa: BLE001 - handed to every request of the batch
            for job in group:
                job.future.set_exception(err)
            return
        start = 0
        for job in group:
            count = len(job.prompts) * sampling.n
            job.future.set_result(gens[start : start + count])
            start += count


def _sse(payload: Any) -> str:
    return f"data: {json.dumps(payload)}\n\n"


class _Detokenizer:
    """Text deltas of one choice as its tokens arrive: decode the whole response so far, send the new suffix
    (held back while it ends in an incomplete UTF-8 character)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.ids, self.sent = tokenizer, [], ""

    def add(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def finish(self, final_text: str) -> str:
        """What remains to send so that the deltas add up to ``final_text``."""
        delta = final_text[len(self.sent) :] if final_text.startswith(self.sent) else ""
        self.sent = final_text
        return delta


def create_app(backend: Any, model_name: str, *, batch_window_s: float = 0.02, max_batch_prompts: int = 64) -> Any:
    """A FastAPI app serving ``backend`` under the name ``model_name`` (see the module docstring).

    Args:
        backend: any drmas backend. model_name: the ``model`` that requests must name.
        batch_window_s, max_batch_prompts: see :class:`RequestBatcher`.

    The app's ``state.batcher`` is the :class:`RequestBatcher`; it stops when the app shuts down.
    """
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse, StreamingResponse
    from pydantic import BaseModel, Field

    class ContentPart(BaseModel):
        type: str
        text: str | None = None

    class Message(BaseModel):
        role: str
        content: str | list[ContentPart] | None = None

    class StreamOptions(BaseModel):
        include_usage: bool = False

    class Sampled(BaseModel):
        model: str
        n: int = 1
        temperature: float = 1.0
        top_p: float = 1.0
        top_k: int = -1
        max_tokens: int | None = None
        stop: str | list[str] | None = None
        seed: int | None = None
        stream: bool = False
        stream_options: StreamOptions | None = None
        return_token_ids: bool = False

    class ChatRequest(Sampled):
        messages: list[Message] = Field(min_length=1)
        max_completion_tokens: int | None = None
        logprobs: bool = False

    class CompletionRequest(Sampled):
        prompt: str | list[str] | list[int] | list[list[int]]
        logprobs: int | None = None
        echo: bool = False

    batcher = RequestBatcher(backend, batch_window_s=batch_window_s, max_batch_prompts=max_batch_prompts)

    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        yield
        batcher.close()

    app = FastAPI(title=f"drmas OpenAI-compatible server ({model_name})", lifespan=lifespan)
    app.state.batcher = batcher

    @app.exception_handler(HTTPException)
    async def openai_error(_request: Any, exc: HTTPException) -> Any:
        """Errors in OpenAI's shape (``{"error": {"message", "type", "code"}}``), which its clients read."""
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse({"error": {"message": str(exc.detail), "type": kind, "code": exc.status_code}},
                            status_code=exc.status_code)  # fmt: skip

    def check_model(req: Sampled) -> None:
        if req.model != model_name:
            raise HTTPException(404, f"model {req.model!r} not served; this server has {model_name!r}")

    def sampling_of(req: Sampled, max_tokens: int | None, default_max: int) -> SamplingParams:
        try:
            return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                                  max_new_tokens=max_tokens or default_max, stop=() if req.stop is None else req.stop,
                                  n=req.n, seed=req.seed)  # fmt: skip
        except ValueError as err:
            raise HTTPException(400, str(err)) from err

    def text_of(m: Message) -> dict[str, str]:
        if m.content is None or isinstance(m.content, str):
            return {"role": m.role, "content": m.content or ""}
        parts = []
        for part in m.content:
            if part.type not in ("text", "input_text") or part.text is None:
                raise HTTPException(400, f"content part of type {part.type!r} is not supported; accepted: text parts "
                                         "({'type': 'text', 'text': ...})")  # fmt: skip
            parts.append(part.text)
        return {"role": m.role, "content": "".join(parts)}

    def usage(gens: list[Generation], n: int) -> dict[str, int]:
        prompt = sum(len(g.prompt_ids) for g in gens[::n])
        completion = sum(len(g.response_ids) for g in gens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def run(kind: str, prompts: list[Any], sampling: SamplingParams) -> list[Generation]:
        try:
            return await asyncio.wrap_future(batcher.submit(kind, prompts, sampling))
        except ValueError as err:  # e.g. a prompt over the backend's limits
            raise HTTPException(400, str(err)) from err

    def stream(kind: str, prompts: list[Any], sampling: SamplingParams, chunk: Callable[[int, str, str | None], Any],
               include_usage: bool, usage_chunk: Callable[[dict[str, int]], Any]) -> Any:  # fmt: skip
        """SSE response: ``chunk(choice, delta, finish_reason)`` builds one event's payload."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Any] = asyncio.Queue()
        tok = getattr(backend, "tokenizer", None)
        n_choices = len(prompts) * sampling.n
        detok = [_Detokenizer(tok) if tok is not None else None for _ in range(n_choices)]

        def on_token(choice: int, token: int) -> None:
            loop.call_soon_threadsafe(events.put_nowait, ("token", choice, token))

        future = batcher.submit(kind, prompts, sampling, on_token if tok is not None else None)
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(events.put_nowait, ("done", f)))

        async def body() -> AsyncIterator[str]:
            while True:
                event = await events.get()
                if event[0] == "token":
                    _, choice, token = event
                    delta = detok[choice].add(token) if detok[choice] is not None else ""
                    if delta:
                        yield _sse(chunk(choice, delta, None))
                    continue
                err = event[1].exception()
                if err is not None:
                    yield _sse({"error": {"message": str(err), "type": type(err).__name__}})
                    yield "data: [DONE]\n\n"
                    return
                gens = event[1].result()
                for choice, g in enumerate(gens):
                    rest = detok[choice].finish(g.text) if detok[choice] is not None else g.text
                    if rest:
                        yield _sse(chunk(choice, rest, None))
                    yield _sse(chunk(choice, "", g.finish_reason))
                if include_usage:
                    yield _sse(usage_chunk(usage(gens, sampling.n)))
                yield "data: [DONE]\n\n"
                return

        return StreamingResponse(body(), media_type="text/event-stream")

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "drmas"}]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest) -> Any:
        check_model(req)
        sampling = sampling_of(req, req.max_completion_tokens or req.max_tokens, 256)
        prompts = [[text_of(m) for m in req.messages]]
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "created": created, "model": model_name}
        if req.stream:
            def chunk(choice: int, delta: str, finish: str | None) -> dict[str, Any]:
                d = {"role": "assistant", "content": delta} if finish is None else {}
                return {**head, "object": "chat.completion.chunk",
                        "choices": [{"index": choice, "delta": d, "finish_reason": finish, "logprobs": None}]}  # fmt: skip

            def usage_chunk(u: dict[str, int]) -> dict[str, Any]:
                return {**head, "object": "chat.completion.chunk", "choices": [], "usage": u}

            include = bool(req.stream_options and req.stream_options.include_usage)
            return stream("chat", prompts, sampling, chunk, include, usage_chunk)
        gens = await run("chat", prompts, sampling)
        tok = backend.tokenizer
        choices = []
        for i, g in enumerate(gens):
            choice: dict[str, Any] = {"index": i, "message": {"role": "assistant", "content": g.text},
                                      "finish_reason": g.finish_reason, "logprobs": None}  # fmt: skip
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
        body: dict[str, Any] = {**head, "object": "chat.completion", "choices": choices, "usage": usage(gens, req.n)}
        if req.return_token_ids:
            body["prompt_token_ids"] = gens[0].prompt_ids if gens else []
        return body

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Any:
        check_model(req)
        if not batcher.supports_ids:
            raise HTTPException(501, f"/v1/completions needs a backend with generate_ids and a tokenizer; "
                                     f"{type(backend).__name__} serves /v1/chat/completions only")  # fmt: skip
        if req.echo:
            raise HTTPException(400, "echo=true is not supported")
        sampling = sampling_of(req, req.max_tokens, 16)  # OpenAI's default max_tokens for completions
        p = req.prompt
        if isinstance(p, str):
            texts: list[Any] = [p]
        elif p and all(isinstance(x, int) for x in p):
            texts = [p]
        else:
            texts = list(p)
        tok = backend.tokenizer
        ids = [list(t) if isinstance(t, list) else tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        if not ids or any(len(x) == 0 for x in ids):
            raise HTTPException(400, "prompt must be a non-empty string (or token list), or a list of them")
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "created": created, "model": model_name}
        if req.stream:
            def chunk(choice: int, delta: str, finish: str | None) -> dict[str, Any]:
                return {**head, "object": "text_completion",
                        "choices": [{"index": choice, "text": delta, "finish_reason": finish, "logprobs": None}]}  # fmt: skip

            def usage_chunk(u: dict[str, int]) -> dict[str, Any]:
                return {**head, "object": "text_completion", "choices": [], "usage": u}

            include = bool(req.stream_options and req.stream_options.include_usage)
            return stream("ids", ids, sampling, chunk, include, usage_chunk)
        gens = await run("ids", ids, sampling)
        choices = []
        for i, g in enumerate(gens):
            choice = {"index": i, "text": g.text, "finish_reason": g.finish_reason, "logprobs": None}
            if req.logprobs is not None:
                tokens = [tok.decode([t]) for t in g.response_ids]
                offsets = [sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": list(g.logprobs), "top_logprobs": None,
                                      "text_offset": offsets}  # fmt: skip
            if req.return_token_ids:
                choice["token_ids"] = g.response_ids
                choice["prompt_token_ids"] = g.prompt_ids
            choices.append(choice)
        return {**head, "object": "text_completion", "choices": choices, "usage": usage(gens, req.n)}

    return app

