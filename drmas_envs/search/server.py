"""Retrieval server: any in-process retriever behind the Search-R1 / Dr. MAS HTTP protocol, so many env workers
share one index.

    POST /retrieve  {"queries": [str], "topk": int | null, "return_scores": bool}     (Search-R1: a batch)
                 or {"query": str, "topk": int | null, "return_scores": bool}        (Dr. MAS: one query)
                 -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}
                    one ranked list per query (one list for a "query" body); without scores each list holds the
                    documents
    GET  /health    {"status": "ok", "retriever": name, "num_passages": int | null}

Both clients are served unchanged: Search-R1's ``_batch_search`` (``PeterGriffinJin/Search-R1
search_r1/llm_agent/generation.py``) posts ``{"queries", "topk", "return_scores": true}``; the Dr. MAS search tool
(``langfengQ/DrMAS agent_system/environments/env_package/search/third_party/skyrl_gym/tools/search.py:48``) posts
``{"query", "topk", "return_scores": true}`` and reads ``result[i][j]["document"]["contents"]`` (``:222-227``, ``:135``),
which is what the reference's own server answers (``examples/search/retriever/retrieval_server.py:304-345``).
A body with both or neither of ``queries`` / ``query`` is rejected (HTTP 422).

Binds 127.0.0.1 unless told otherwise. FastAPI and uvicorn (``pip install 'drmas[server]'``) are imported only
when a server is built. Limits per request: at most ``max_queries`` queries and ``max_topk`` results per
query (HTTP 422 beyond; the error names the field and the limit and never echoes the request); each query is cut to
``max_query_chars`` characters; a body over ``max_body_bytes`` is refused with HTTP 413 (FastAPI's ``max_body_size``:
at once when ``Content-Length`` is over it, else when the bytes read pass it).

**Faults.** Searches run in a pool of ``workers`` threads, ``search_chunk`` queries at a time; between chunks, and
every ``disconnect_poll_s`` while one runs, the request checks that its client is still connected, and an abandoned
request stops there (its queued chunk is cancelled), so clients that time out cannot starve the server. More than
``max_pending`` requests in progress are refused with HTTP 503 (which :class:`~drmas_envs.search.retrievers.http.
HTTPRetriever` retries). On SIGTERM, uvicorn stops accepting, waits ``shutdown_timeout`` seconds for requests in
progress, then cancels them: the server exits within a few seconds.
"""

import asyncio
import concurrent.futures
import socket
import threading
import time
from typing import Any

from drmas_envs.search.retrievers.base import Retriever, RetrieverError

__all__ = ["create_app", "serve", "bind_socket", "ServerThread"]


def _require_server_deps() -> tuple[Any, Any]:
    try:
        import fastapi
        import uvicorn
    except ImportError as e:
        raise RetrieverError(f"the retrieval server needs fastapi and uvicorn: pip install 'drmas[server]' ({e})") from e
    return fastapi, uvicorn


def create_app(
    retriever: Retriever,
    *,
    default_topk: int = 3,
    max_queries: int = 4096,
    max_topk: int = 1000,
    max_query_chars: int = 4096,
    max_body_bytes: int = 8 * 2**20,
    workers: int = 4,
    search_chunk: int = 64,
    max_pending: int = 1024,
    disconnect_poll_s: float = 0.25,
) -> Any:
    """A FastAPI app serving ``retriever`` with the Search-R1 and Dr. MAS ``/retrieve`` bodies (see the module doc).

    Args:
        retriever: the index. default_topk: results per query when a request gives none.
        max_queries, max_topk, max_query_chars, max_body_bytes: request limits (see the module docstring).
        workers: threads that run searches. search_chunk: queries per search call (>= 1): how much work an
            abandoned request may still cost. max_pending: requests in progress beyond which HTTP 503 is answered.
        disconnect_poll_s: how often a running request checks that its client is still there (seconds).

    The app's ``state.pool`` is the search thread pool; its lifespan shuts it down (queued work cancelled).
    """
    fastapi, _ = _require_server_deps()
    from contextlib import asynccontextmanager

    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from pydantic import BaseModel, Field, model_validator

    class QueryRequest(BaseModel):
        queries: list[str] | None = Field(default=None, max_length=max_queries)
        query: str | None = None
        topk: int | None = Field(default=None, ge=1, le=max_topk)
        return_scores: bool = False

        @model_validator(mode="after")
        def _one_query_field(self) -> "QueryRequest":
            if (self.queries is None) == (self.query is None):
                raise ValueError("give exactly one of 'queries' (a list of str, Search-R1's body) or 'query' "
                                 "(one str, the Dr. MAS search tool's body)")
            return self

    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="drmas-retrieval")

    @asynccontextmanager
    async def lifespan(_app: Any) -> Any:
        yield
        pool.shutdown(wait=False, cancel_futures=True)

    # FastAPI's own body limit: 413 as soon as Content-Length (or the bytes read) pass it
    app = fastapi.FastAPI(title="drmas retrieval server", version="1", lifespan=lifespan, max_body_size=max_body_bytes)
    app.state.pool = pool
    pending = [0]  # requests in progress (touched on the event loop only)
    # (no ``from __future__ import annotations`` in this module: FastAPI must see the local QueryRequest class)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_request: Any, exc: RequestValidationError) -> Any:
        """FastAPI's 422 ``{"detail": [{"type", "loc", "msg"}, ...]}`` (what clients detect the protocol by),
        without the ``input`` it would echo (a 16 MB request must not get a 16 MB error) and at most 5 entries."""
        errors = [{k: e[k] for k in ("type", "loc", "msg") if k in e} for e in exc.errors()[:5]]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.post("/retrieve")
    async def retrieve(body: QueryRequest, request: fastapi.Request) -> Any:
        if pending[0] >= max_pending:
            return JSONResponse({"detail": f"the retrieval server is busy ({max_pending} requests in progress); "
                                           "retry later"}, status_code=503, headers={"Retry-After": "1"})  # fmt: skip
        topk = body.topk or default_topk
        asked = body.queries if body.queries is not None else [body.query]
        queries = [q[:max_query_chars] for q in asked]
        loop = asyncio.get_running_loop()
        results: list[Any] = []
        pending[0] += 1
        try:
            for start in range(0, len(queries), search_chunk):
                chunk = loop.run_in_executor(pool, retriever.search, queries[start : start + search_chunk], topk)
                try:
                    while not chunk.done():
                        await asyncio.wait({chunk}, timeout=disconnect_poll_s)
                        if not chunk.done() and await request.is_disconnected():
                            chunk.cancel()  # a queued chunk never runs; a running one is the last
                            return Response(status_code=499)  # nginx's "client closed request": nobody reads it
                except asyncio.CancelledError:  # uvicorn's graceful-shutdown timeout
                    chunk.cancel()
                    raise
                results.extend(chunk.result())
        finally:
            pending[0] -= 1
        if body.return_scores:
            return {"result": [[{"document": p.to_document(), "score": p.score} for p in hits] for hits in results]}
        return {"result": [[p.to_document() for p in hits] for hits in results]}

    @app.get("/health")
    def health() -> dict[str, Any]:
        passages = getattr(retriever, "passages", None)
        return {"status": "ok", "retriever": getattr(retriever, "name", type(retriever).__name__),
                "num_passages": None if passages is None else len(passages)}

    return app


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening-ready TCP socket bound to ``(host, port)`` with ``TCP_NODELAY`` (inherited by accepted
    connections on Linux), which avoids ~40 ms Nagle / delayed-ACK stalls per small request."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def serve(retriever: Retriever, *, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3,
          log_level: str = "info", shutdown_timeout: float = 3.0, **limits: Any) -> None:  # fmt: skip
    """Serve ``retriever`` until interrupted (blocking). Binds ``host`` (loopback by default).

    ``shutdown_timeout``: seconds SIGTERM / Ctrl-C waits for requests in progress before cancelling them (uvicorn's
    ``timeout_graceful_shutdown``). ``limits``: :func:`create_app`'s request limits and pool settings.
    """
    _, uvicorn = _require_server_deps()
    sock = bind_socket(host, port)
    config = uvicorn.Config(create_app(retriever, default_topk=default_topk, **limits), log_level=log_level,
                            timeout_graceful_shutdown=shutdown_timeout)  # fmt: skip
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()


class ServerThread:
    """Run a retrieval server in a background thread on a real socket; a context manager.

    ``port=0`` lets the OS pick a free port (the socket is bound before uvicorn starts, so there is no race).
    ``url`` is the ``/retrieve`` endpoint once started. ``app`` serves another ASGI app instead of
    :func:`create_app` over ``retriever`` (e.g. :func:`drmas_envs.search.testing.create_reference_protocol_app`).

        >>> with ServerThread(retriever) as srv:                      # doctest: +SKIP
        ...     HTTPRetriever(srv.url).search(["q"], 3)

    Raises:
        RetrieverError: the server did not start within ``start_timeout`` seconds.
    """

    def __init__(self, retriever: Retriever | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 default_topk: int = 3, start_timeout: float = 20.0, app: Any = None) -> None:
        _, uvicorn = _require_server_deps()
        if (retriever is None) == (app is None):
            raise ValueError("give exactly one of retriever (served by create_app) or app")
        self._sock = bind_socket(host, port)
        self.host, self.port = self._sock.getsockname()[:2]
        app = create_app(retriever, default_topk=default_topk) if app is None else app
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self._start_timeout = start_timeout

    @property
    def url(self) -> str:
        """``http://host:port/retrieve``."""
        return f"http://{self.host}:{self.port}/retrieve"

    def start(self) -> "ServerThread":
        """Start serving; returns once the server accepts requests."""
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RetrieverError(f"retrieval server on {self.host}:{self.port} did not start within {self._start_timeout} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (safe to call twice)."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
