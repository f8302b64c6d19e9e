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

**Faults and bad input** (no request can take the server down; ``tests/drmas_train/serving/test_server_faults.py``,
``benchmarks/serving/faults.py``): every prompt is tokenized before it is queued and checked against the model's
context (``max_position_embeddings``): one with no room left is refused with HTTP 400 ``context_length_exceeded``
(or cut from the left with ``prompt_truncation="left"``), as is a ``max_tokens`` that does not fit beside it; an
unset ``max_tokens`` is ``min(default, context - prompt)``. Bodies over ``max_body_bytes`` get HTTP 413. Every error
is in OpenAI's shape with OpenAI's status codes (FastAPI's 422 validation replies become 400s) and quotes at most a
few hundred characters of the request. A client that disconnects (streaming or not) has its request withdrawn: the
batcher drops its rows at the next decode step (the hf backend's ``on_tokens`` may return rows to stop), and one
failing request of a batch is retried alone so that the others succeed. Closing the app (SIGTERM, after uvicorn's
graceful-shutdown timeout) aborts the generation in progress.

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

__all__ = ["create_app", "RequestBatcher", "model_context", "PROMPT_TRUNCATION"]

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
        self._closing = threading.Event()
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
        """Queue a request; the future gets ``len(prompts) * sampling.n`` generations (prompt-major).

        Cancelling the future (``future.cancel()``, or cancelling an ``asyncio.wrap_future`` of it) withdraws the
        request: a queued one is never generated, a running one leaves the decode batch at the next step (with a
        backend that reports tokens, :func:`~drmas_train.backends.base.reports_tokens`); the others of its batch go on.

        Raises:
            RuntimeError: the batcher is closed.
        """
        if self._closing.is_set():
            raise RuntimeError("the server is shutting down")
        job = _Job(kind, prompts, sampling, concurrent.futures.Future(), on_token)
        self._queue.put(job)
        return job.future

    def close(self, timeout: float = 10.0) -> None:
        """Stop the scheduler thread (safe to call twice): the generation in progress stops at its next decode step
        (a backend that reports tokens) and queued requests fail with ``RuntimeError``; waits at most ``timeout`` s."""
        self._closing.set()
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=timeout)

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
                break
            jobs, stop = self._collect(first)
            groups: dict[Any, list[_Job]] = {}
            for job in jobs:
                if not job.future.cancelled():  # withdrawn while queued (a client that went away)
                    groups.setdefault(job.key(), []).append(job)
            for group in groups.values():
                self._generate(group)
        while True:  # closed: whatever is still queued will not be generated
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                _settle(job.future, error=RuntimeError("the server is shutting down"))

    def _generate(self, group: list[_Job]) -> None:
        if self._closing.is_set():
            for job in group:
                _settle(job.future, error=RuntimeError("the server is shutting down"))
            return
        group = [job for job in group if not job.future.cancelled()]
        if not group:
            return
        kind, sampling = group[0].kind, group[0].sampling
        prompts = [p for job in group for p in job.prompts]
        owner: list[tuple[_Job, int]] = []  # output row -> (job, choice index in that job)
        for job in group:
            owner.extend((job, i) for i in range(len(job.prompts) * sampling.n))
        kwargs: dict[str, Any] = {}
        method = "generate" if kind == "chat" else "generate_ids"
        if self._streams:  # per decode step: stream tokens, and drop the rows of withdrawn requests

            def on_tokens(rows: list[int], tokens: list[int]) -> list[int]:
                closing, stopped = self._closing.is_set(), []
                for row, token in zip(rows, tokens, strict=True):
                    job, choice = owner[row]
                    if closing or job.future.cancelled():
                        stopped.append(row)
                    elif job.on_token is not None:
                        job.on_token(choice, token)
                return stopped

            kwargs["on_tokens"] = on_tokens
        try:
            gens = getattr(self.backend, method)(prompts, sampling, **kwargs)
            self.backend_calls += 1
        except Exception as err:  # noqa: BLE001 - handed to the request(s) that caused it
            if len(group) > 1:  # one bad request must not fail the others batched with it: each again, alone
                for job in group:
                    self._generate([job])
                return
            _settle(group[0].future, error=err)
            return
        start = 0
        for job in group:
            count = len(job.prompts) * sampling.n
            if self._closing.is_set():  # stopped part-way by close(): no reply is the real one
                _settle(job.future, error=RuntimeError("the server is shutting down"))
            else:
                _settle(job.future, result=gens[start : start + count])
            start += count


def _settle(future: concurrent.futures.Future, *, result: Any = None, error: BaseException | None = None) -> None:
    """Set a job's outcome unless its request was withdrawn (a cancelled future takes none)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


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


#: ``--prompt-truncation`` values: ``error`` refuses a prompt that does not fit the context (HTTP 400, as vLLM and
#: OpenAI do), ``left`` keeps its last ``context - max_tokens`` tokens.
PROMPT_TRUNCATION = ("error", "left")

#: most characters of a client-supplied value quoted back in an error message
_QUOTE_CHARS = 200


def model_context(backend: Any) -> int | None:
    """The context length in tokens of ``backend``'s model (``config.max_position_embeddings``), None if unknown."""
    context = getattr(getattr(getattr(backend, "model", None), "config", None), "max_position_embeddings", None)
    return context if isinstance(context, int) and not isinstance(context, bool) and context > 0 else None


def _clip(text: str, limit: int = 1000) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


class _BodyLimit:
    """ASGI middleware refusing request bodies over ``max_bytes`` with HTTP 413 in OpenAI's shape: at once when
    ``Content-Length`` says so (nothing is read), else as soon as the bytes read pass the limit (a chunked body; the
    ``HTTPException`` raised then reaches the app's handler). FastAPI's own ``max_body_size`` is not used here: it
    replaces the reply to an over-long ``Content-Length`` with a plain-text "Content Too Large", which OpenAI clients
    cannot read."""

    def __init__(self, app: Any, *, max_bytes: int, error: Callable[[int, str], Any]) -> None:
        self.app, self.max_bytes, self.error = app, max_bytes, error

    def _message(self, size: str) -> str:
        return f"request body of {size} is over this server's limit of {self.max_bytes} bytes (--max-body-bytes)"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.exceptions import HTTPException
        from starlette.responses import JSONResponse

        length = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            await JSONResponse(self.error(413, self._message(f"{int(length)} bytes")), status_code=413)(scope, receive, send)
            return
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # FastAPI re-raises an HTTPException met while it reads the body
                    raise HTTPException(413, self._message(f"more than {self.max_bytes} bytes"))
            return message

        await self.app(scope, limited, send)


def create_app(backend: Any, model_name: str, *, batch_window_s: float = 0.02, max_batch_prompts: int = 64,
               context_tokens: int | None = None, prompt_truncation: str = "error",
               max_body_bytes: int = 2**20, disconnect_poll_s: float = 0.25) -> Any:  # fmt: skip
    """A FastAPI app serving ``backend`` under the name ``model_name`` (see the module docstring).

    Args:
        backend: any drmas backend. model_name: the ``model`` that requests must name.
        batch_window_s, max_batch_prompts: see :class:`RequestBatcher`.
        context_tokens: the model's context (prompt + completion tokens); None: :func:`model_context` of the backend
            (no length check when that is unknown either, or when the backend cannot tokenize a chat).
        prompt_truncation: one of :data:`PROMPT_TRUNCATION`: a prompt over the context is refused (``error``, HTTP
            400 ``context_length_exceeded``) or cut from the left (``left``).
        max_body_bytes: largest request body in bytes; a larger one is refused with HTTP 413 before it is read.
        disconnect_poll_s: how often a waiting request checks that its client is still connected (seconds).

    Every error comes in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with OpenAI's status
    codes (400 invalid request, 404 unknown model, 413 body too large, 500 server error), and never quotes more than
    a few hundred characters of the request. ``max_tokens`` / ``max_completion_tokens`` must be >= 1 and fit the
    context beside the prompt (400 otherwise; unset: ``min(default, context - prompt)``); ``temperature`` is in
    [0, 2] and ``top_p`` in [0, 1] (finite), ``n`` in [1, 128], roles are OpenAI's. A client that disconnects has its
    request withdrawn (:meth:`RequestBatcher.submit`). The app's ``state.batcher`` is the :class:`RequestBatcher`;
    it stops when the app shuts down, aborting the generation in progress.

    Raises:
        ValueError: an unknown ``prompt_truncation``, or a non-positive ``context_tokens`` / ``max_body_bytes``.
    """
    from contextlib import asynccontextmanager
    from typing import Literal

    from fastapi import FastAPI, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from pydantic import BaseModel, Field
    from starlette.exceptions import HTTPException as StarletteHTTPException

    if prompt_truncation not in PROMPT_TRUNCATION:
        raise ValueError(f"prompt_truncation must be one of {PROMPT_TRUNCATION}, got {prompt_truncation!r}")
    for name, value in (("context_tokens", context_tokens), ("max_body_bytes", max_body_bytes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    context = context_tokens if context_tokens is not None else model_context(backend)
    can_encode = callable(getattr(backend, "encode_prompts", None)) and getattr(backend, "tokenizer", None) is not None

    class APIError(HTTPException):
        """An error answered in OpenAI's shape, with its ``param`` and ``code``."""

        def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
            super().__init__(status, message)
            self.param, self.code = param, code

    def error_body(status: int, message: str, param: str | None = None, code: Any = None) -> dict[str, Any]:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": _clip(message), "type": kind, "param": param, "code": code}}

    class ContentPart(BaseModel):
        type: str
        text: str | None = None

    class Message(BaseModel):
        role: Literal["system", "developer", "user", "assistant", "tool", "function"]
        content: str | list[ContentPart] | None = None

    class StreamOptions(BaseModel):
        include_usage: bool = False

    class Sampled(BaseModel):
        model: str
        n: int = Field(1, ge=1, le=128)
        temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False)
        top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
        top_k: int = Field(-1, ge=-1)
        max_tokens: int | None = Field(None, ge=1)
        stop: str | list[str] | None = None
        seed: int | None = None
        stream: bool = False
        stream_options: StreamOptions | None = None
        return_token_ids: bool = False

    class ChatRequest(Sampled):
        messages: list[Message] = Field(min_length=1)
        max_completion_tokens: int | None = Field(None, ge=1)
        logprobs: bool = False

    class CompletionRequest(Sampled):
        prompt: str | list[str] | list[int] | list[list[int]]
        logprobs: int | None = None
        echo: bool = False

    batcher = RequestBatcher(backend, batch_window_s=batch_window_s, max_batch_prompts=max_batch_prompts)
    # tokenizing a long prompt takes a while: one thread of its own, off the event loop (the batch thread only decodes)
    encoder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="drmas-openai-encode")

    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        yield
        batcher.close()
        encoder.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title=f"drmas OpenAI-compatible server ({model_name})", lifespan=lifespan)
    app.state.batcher = batcher
    app.state.context_tokens = context
    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes, error=error_body)

    @app.exception_handler(StarletteHTTPException)
    async def openai_error(_request: Any, exc: StarletteHTTPException) -> Any:
        """Errors in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``), which its clients read."""
        body = error_body(exc.status_code, str(exc.detail), getattr(exc, "param", None), getattr(exc, "code", None))
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Any, exc: RequestValidationError) -> Any:
        """A malformed body (bad JSON, a missing or out-of-range field): 400 in OpenAI's shape, as OpenAI answers,
        instead of FastAPI's 422 ``{"detail": ...}``; the offending input is not echoed back."""
        errors = exc.errors()
        parts, param = [], None
        for e in errors[:3]:
            if e.get("type") == "json_invalid":  # loc is ("body", character position)
                where = e.get("loc", ("body", "?"))[-1]
                param = param or "body"
                parts.append(f"body: JSON decode error ({_clip(str((e.get('ctx') or {}).get('error', '')), 200)} at "
                             f"character {where})")  # fmt: skip
                continue
            loc = ".".join(str(x) for x in e.get("loc", ())[1:]) or "body"
            param = param or loc
            parts.append(f"{loc}: {e.get('msg', 'invalid')}")
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        return JSONResponse(error_body(400, "; ".join(parts) + more, param), status_code=400)

    @app.exception_handler(Exception)
    async def server_error(_request: Any, exc: Exception) -> Any:
        logger.exception("request failed")
        return JSONResponse(error_body(500, f"{type(exc).__name__}: {exc}"), status_code=500)

    def check_model(req: Sampled) -> None:
        if req.model != model_name:
            raise APIError(404, f"model {req.model[:_QUOTE_CHARS]!r} not served; this server has {model_name!r}",
                           "model", "model_not_found")  # fmt: skip

    def sampling_of(req: Sampled, max_tokens: int) -> SamplingParams:
        try:
            return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                                  max_new_tokens=max_tokens, stop=() if req.stop is None else req.stop,
                                  n=req.n, seed=req.seed)  # fmt: skip
        except ValueError as err:
            raise APIError(400, str(err)) from err

    def fit(ids: list[list[int]], max_tokens: int | None, default_max: int, param: str,
            max_name: str) -> tuple[list[list[int]], int]:  # fmt: skip
        """Prompts and the completion budget checked against the context: (prompts, max new tokens).

        Raises:
            APIError: 400 ``context_length_exceeded``: a prompt with no room left (``prompt_truncation="error"``),
                or ``max_tokens`` over what the context leaves beside the prompt.
        """
        if context is None:
            return ids, max_tokens or default_max
        if prompt_truncation == "left":
            want = max_tokens or min(default_max, context - 1)
            if want >= context:
                raise APIError(400, f"{max_name}={want} leaves no room for a prompt in this model's context of "
                                    f"{context} tokens; at most {context - 1}", max_name, "context_length_exceeded")  # fmt: skip
            return [x[-(context - want) :] for x in ids], want
        longest = max(map(len, ids))
        if longest >= context:
            raise APIError(400, f"This model's maximum context length is {context} tokens, but the prompt has "
                                f"{longest} tokens (at most {context - 1}, to leave room for one generated token); "
                                "shorten it, or start the server with --prompt-truncation left",
                           param, "context_length_exceeded")  # fmt: skip
        room = context - longest
        if max_tokens is None:
            return ids, min(default_max, room)
        if max_tokens > room:
            raise APIError(400, f"This model's maximum context length is {context} tokens, but {longest + max_tokens} "
                                f"were requested ({longest} in the prompt, {max_tokens} in the completion); set "
                                f"{max_name} to at most {room}", max_name, "context_length_exceeded")  # fmt: skip
        return ids, max_tokens

    def text_of(m: Message) -> dict[str, str]:
        if m.content is None or isinstance(m.content, str):
            return {"role": m.role, "content": m.content or ""}
        parts = []
        for part in m.content:
            if part.type not in ("text", "input_text") or part.text is None:
                raise APIError(400, f"content part of type {part.type[:_QUOTE_CHARS]!r} is not supported; accepted: "
                                    "text parts ({'type': 'text', 'text': ...})", "messages")  # fmt: skip
            parts.append(part.text)
        return {"role": m.role, "content": "".join(parts)}

    def usage(gens: list[Generation], n: int) -> dict[str, int]:
        prompt = sum(len(g.prompt_ids) for g in gens[::n])
        completion = sum(len(g.response_ids) for g in gens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def encode(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(encoder, fn, *args)
        except ValueError as err:  # e.g. a chat template that refuses the conversation
            raise APIError(400, str(err)) from err

    async def run(request: Request, kind: str, prompts: list[Any], sampling: SamplingParams) -> list[Generation] | None:
        """The request's generations, or None when its client went away (its work is then withdrawn)."""
        try:
            waiting = asyncio.wrap_future(batcher.submit(kind, prompts, sampling))
        except RuntimeError as err:
            raise APIError(503, str(err)) from err
        try:
            while not waiting.done():
                await asyncio.wait({waiting}, timeout=disconnect_poll_s)
                if not waiting.done() and await request.is_disconnected():
                    waiting.cancel()  # reaches the batcher's future: its rows leave the decode batch
                    return None
            return waiting.result()
        except asyncio.CancelledError:  # e.g. uvicorn's graceful-shutdown timeout
            waiting.cancel()
            raise
        except ValueError as err:  # e.g. a prompt over the backend's limits
            raise APIError(400, str(err)) from err
        except RuntimeError as err:  # the server is shutting down
            raise APIError(503, str(err)) from err

    def stream(request: Request, kind: str, prompts: list[Any], sampling: SamplingParams,
               chunk: Callable[[int, str, str | None], Any], include_usage: bool,
               usage_chunk: Callable[[dict[str, int]], Any]) -> Any:  # fmt: skip
        """SSE response: ``chunk(choice, delta, finish_reason)`` builds one event's payload."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Any] = asyncio.Queue()
        tok = getattr(backend, "tokenizer", None)
        n_choices = len(prompts) * sampling.n
        detok = [_Detokenizer(tok) if tok is not None else None for _ in range(n_choices)]

        def on_token(choice: int, token: int) -> None:
            loop.call_soon_threadsafe(events.put_nowait, ("token", choice, token))

        try:
            future = batcher.submit(kind, prompts, sampling, on_token if tok is not None else None)
        except RuntimeError as err:
            raise APIError(503, str(err)) from err
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(events.put_nowait, ("done", f)))

        async def body() -> AsyncIterator[str]:
            try:
                while True:
                    try:
                        event = await asyncio.wait_for(events.get(), timeout=disconnect_poll_s)
                    except TimeoutError:
                        if await request.is_disconnected():
                            return  # the finally below withdraws the request
                        continue
                    if event[0] == "token":
                        _, choice, token = event
                        delta = detok[choice].add(token) if detok[choice] is not None else ""
                        if delta:
                            yield _sse(chunk(choice, delta, None))
                        continue
                    if event[1].cancelled():
                        return
                    err = event[1].exception()
                    if err is not None:
                        status = 400 if isinstance(err, ValueError) else 500
                        yield _sse(error_body(status, f"{type(err).__name__}: {err}"))
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
            finally:  # a client that went away (or a server shutting down): its rows leave the decode batch
                future.cancel()

        return StreamingResponse(body(), media_type="text/event-stream")

    gone = Response(status_code=499)  # nginx's "client closed request": nobody reads it

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "drmas"}]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request) -> Any:
        check_model(req)
        max_name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        kind, prompts = "chat", [[text_of(m) for m in req.messages]]
        if can_encode and batcher.supports_ids:  # tokenized here: its length is checked before any compute
            kind, prompts = "ids", await encode(backend.encode_prompts, prompts)
            prompts, max_tokens = fit(prompts, max_tokens, 256, "messages", max_name)
        sampling = sampling_of(req, max_tokens or 256)
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
            return stream(request, kind, prompts, sampling, chunk, include, usage_chunk)
        gens = await run(request, kind, prompts, sampling)
        if gens is None:
            return gone
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
    async def completions(req: CompletionRequest, request: Request) -> Any:
        check_model(req)
        if not batcher.supports_ids:
            raise APIError(501, f"/v1/completions needs a backend with generate_ids and a tokenizer; "
                                f"{type(backend).__name__} serves /v1/chat/completions only")  # fmt: skip
        if req.echo:
            raise APIError(400, "echo=true is not supported", "echo")
        p = req.prompt
        if isinstance(p, str):
            texts: list[Any] = [p]
        elif p and all(isinstance(x, int) for x in p):
            texts = [p]
        else:
            texts = list(p)
        tok = backend.tokenizer

        def tokenize() -> list[list[int]]:
            return [list(t) if isinstance(t, list) else tok(t, add_special_tokens=False)["input_ids"] for t in texts]

        ids = await encode(tokenize)
        if not ids or any(len(x) == 0 for x in ids):
            raise APIError(400, "prompt must be a non-empty string (or token list), or a list of them", "prompt")
        ids, max_tokens = fit(ids, req.max_tokens, 16, "prompt", "max_tokens")  # 16: OpenAI's default for completions
        sampling = sampling_of(req, max_tokens)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "created": created, "model": model_name}
        if req.stream:
            def chunk(choice: int, delta: str, finish: str | None) -> dict[str, Any]:
                return {**head, "object": "text_completion",
                        "choices": [{"index": choice, "text": delta, "finish_reason": finish, "logprobs": None}]}  # fmt: skip

            def usage_chunk(u: dict[str, int]) -> dict[str, Any]:
                return {**head, "object": "text_completion", "choices": [], "usage": u}

            include = bool(req.stream_options and req.stream_options.include_usage)
            return stream(request, "ids", ids, sampling, chunk, include, usage_chunk)
        gens = await run(request, "ids", ids, sampling)
        if gens is None:
            return gone
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

