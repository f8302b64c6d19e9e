"""Client of the retrieval servers the paper's search runs use: the Dr. MAS reference's, Search-R1's and drmas's.

Protocol (one endpoint)::

    POST <url>            (conventionally http://127.0.0.1:8000/retrieve)
    request  {"query": str, "topk": int, "return_scores": bool}        protocol="drmas": one query per request, the
             Dr. MAS reference server's request model (langfengQ/DrMAS examples/search/retriever/
             retrieval_server.py:304-307) and its search tool's body (.../skyrl_gym/tools/search.py:48)
             {"queries": [str, ...], "topk": int, "return_scores": bool} protocol="search_r1": one batch
             (PeterGriffinJin/Search-R1 search_r1/search/retrieval_server.py)
    response {"result": [per query: [{"document": {"id": str, "contents": '"Title"\\ntext'}, "score": float}, ...]]}
             (with "return_scores": false each per-query list holds the documents themselves)

``drmas retrieval-server`` takes both bodies. ``protocol="auto"`` (the default) sends the reference's
one-query body first and, if the server answers HTTP 422 (FastAPI's "wrong body" reply), Search-R1's batch; the
body that worked is kept for every later request (all URLs of one retriever are assumed to run the same server). A server that rejects the body it was told to expect gets one
:class:`~drmas_envs.search.retrievers.base.RetrieverError` that says which body it wants and how to set
``protocol``; never a bare 422.

**Several URLs** (``url=[...]``, as the reference's ``search_url`` list, ``verl/trainer/config/ppo_trainer.yaml:327``
and ``agent_system/environments/env_package/search/envs.py:53-67``): requests go round-robin over them, and a
retry goes to the next URL. (The reference pins env ``i`` to URL ``i mod n`` and retries the same URL; the load
spreads the same way.)

**Budget** (the reference's, ``ppo_trainer.yaml:329``, ``tools/search.py:15-17,59-120``): each attempt may take
``timeout`` = 60 s; a connection error, a timeout or an HTTP 500/502/503/504 reply is retried up to
``max_retries`` = 9 times (10 attempts), waiting ``backoff`` x k seconds before retry k (1 s, 2 s, ... 9 s: 45 s in
all); any other error stops at once. ``total_timeout`` (drmas v0: 10 s) also caps the whole call. Retries and
waits come from tenacity; each attempt is bounded by wall-clock time however the server sends its reply: httpx's
own timeouts are per network operation, so a server trickling one byte every 0.5 s would hold an attempt for
minutes. Each attempt therefore streams the reply in a helper thread that checks the deadline after every chunk,
and the caller waits for it no longer than the deadline (a late attempt is abandoned: its thread ends at its
next chunk or read timeout). When every attempt failed, :class:`RetrieverUnavailableError` says which URL failed,
how, and how to start a server; ``search-orchestrator-v0`` shows its ``reason`` to the agents as the reference
does (``retrieval_failure="observation"``).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx
import tenacity

from drmas_envs.search.corpus import Passage, passage_from_document
from drmas_envs.search.retrievers.base import RetrieverError, RetrieverUnavailableError, check_search_args

__all__ = ["HTTPRetriever", "DEFAULT_URL", "PROTOCOLS"]

#: Accepted ``protocol`` values (see the module doc).
PROTOCOLS = ("auto", "drmas", "search_r1")

#: Where the reference's ``retrieval_launch.sh``, Search-R1's and ``drmas retrieval-server`` listen by default.
DEFAULT_URL = "http://127.0.0.1:8000/retrieve"

#: The server errors the reference retries (``tools/search.py:73``); other 4xx/5xx replies stop at once.
RETRIED_STATUS = (500, 502, 503, 504)

_BODY = {"drmas": "{'query': str} (one query per request)", "search_r1": "{'queries': [str, ...]} (a batch)"}
_SERVER = {"drmas": "the Dr. MAS reference server (examples/search/retriever/retrieval_server.py)",
           "search_r1": "Search-R1's retrieval server"}  # fmt: skip


class _Retryable(Exception):
    """A transport failure or a retried 5xx reply: worth another attempt."""


class _WrongBody(RetrieverError):
    """HTTP 422: the server's request model rejected the body (FastAPI's validation reply)."""

    def __init__(self, url: str, protocol: str, detail: str) -> None:
        super().__init__(detail)
        self.url, self.protocol, self.detail = url, protocol, detail

    def wanted(self) -> str | None:
        """The protocol whose field the server's validation reply says is missing (FastAPI / pydantic
        ``{"detail": [{"type": "missing", "loc": ["body", "query"], ...}]}``), else ``None``."""
        try:
            errors = json.loads(self.detail).get("detail")
        except (ValueError, AttributeError):
            return None
        for error in errors if isinstance(errors, list) else []:
            loc = error.get("loc") if isinstance(error, dict) else None
            if isinstance(loc, list) and loc and "missing" in str(error.get("type", "")):
                if loc[-1] == "queries":
                    return "search_r1"
                if loc[-1] == "query":
                    return "drmas"
        return None


class HTTPRetriever:
    """Retriever backed by one or more remote (usually local) retrieval servers.

    Args:
        url: the ``/retrieve`` endpoint, or a list of them (round-robin; a retry moves to the next).
        timeout: wall-clock limit of one attempt, in seconds (> 0; the reference's 60).
        max_retries: extra attempts after the first on connection errors, timeouts and HTTP 500/502/503/504
            (>= 0; the reference's 9, i.e. 10 attempts).
        backoff: wait before retry k is ``backoff * k`` seconds (>= 0; the reference's 1 s, i.e. 1, 2, ... 9 s).
        total_timeout: if set (> 0), the whole ``search`` call, attempts and waits included, gets at most this many
            seconds (drmas v0: 10); ``None`` (default, the reference): only the per-attempt limit.
        protocol: the request body, ``"auto"`` (default: detected per URL), ``"drmas"`` (one ``query`` per
            request: the Dr. MAS reference server, ``drmas retrieval-server``) or ``"search_r1"`` (a ``queries``
            batch: Search-R1's server, ``drmas retrieval-server``).

    Raises:
        ValueError: a bad ``url``/``timeout``/``max_retries``/``backoff``/``total_timeout``/``protocol``.
    """

    name = "http"

    def __init__(self, url: str | Sequence[str] = DEFAULT_URL, *, timeout: float = 60.0, max_retries: int = 9,
                 backoff: float = 1.0, total_timeout: float | None = None, protocol: str = "auto") -> None:  # fmt: skip
        urls = [url] if isinstance(url, str) else list(url) if isinstance(url, Sequence) else [url]
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"url must be an http(s) URL such as {DEFAULT_URL!r} or a non-empty list of them, got {url!r}")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if not (isinstance(backoff, (int, float)) and backoff >= 0):
            raise ValueError(f"backoff must be >= 0 seconds, got {backoff!r}")
        if total_timeout is not None and not (isinstance(total_timeout, (int, float)) and total_timeout > 0):
            raise ValueError(f"total_timeout must be > 0 seconds or None, got {total_timeout!r}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        self.urls = tuple(urls)
        self.protocol = protocol
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff = float(backoff)
        self.total_timeout = None if total_timeout is None else float(total_timeout)
        self._client = httpx.Client(trust_env=False)
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._detected: str | None = None  # the body that worked (protocol="auto"), for every URL

    @property
    def url(self) -> str:
        """The first URL (the only one unless a list was given)."""
        return self.urls[0]

    # ---- one attempt -----------------------------------------------------------------------------------------

    def _post(self, url: str, payload: dict[str, Any], deadline: float) -> Any:
        """One attempt, bounded by ``deadline`` (time.monotonic) however slowly the server sends its reply."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Retryable(httpx.TimeoutException("deadline reached before the request"))
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        threading.Thread(target=self._attempt, args=(url, payload, deadline, future), daemon=True,
                         name="drmas-http-retriever").start()  # fmt: skip
        try:
            return future.result(timeout=remaining)
        except concurrent.futures.TimeoutError:
            raise _Retryable(httpx.TimeoutException(
                f"no complete reply within the {remaining:.3g} s attempt deadline (server too slow or trickling bytes)"
            )) from None  # fmt: skip

    def _attempt(self, url: str, payload: dict[str, Any], deadline: float, future: concurrent.futures.Future[Any]) -> None:
        """Runs in a helper thread: POST, stream the reply checking ``deadline`` per chunk, set ``future``."""
        try:
            future.set_result(self._read_reply(url, payload, deadline))
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            future.set_exception(err)

    def _read_reply(self, url: str, payload: dict[str, Any], deadline: float) -> Any:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Retryable(httpx.TimeoutException("deadline reached before the request"))
        body = bytearray()
        try:
            with self._client.stream("POST", url, json=payload, timeout=remaining) as resp:
                for chunk in resp.iter_bytes():
                    body += chunk
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("reply still incomplete at the attempt deadline")
        except httpx.TransportError as e:  # connect refused, timeouts, resets
            raise _Retryable(e) from e
        text = body.decode("utf-8", errors="replace")
        if resp.status_code in RETRIED_STATUS:
            raise _Retryable(RetrieverError(f"HTTP {resp.status_code}: {text[:200]}"))
        if resp.status_code == 422:
            raise _WrongBody(url, "search_r1" if "queries" in payload else "drmas", text[:20_000])
        if resp.status_code != 200:
            raise RetrieverError(f"retrieval server at {url} answered HTTP {resp.status_code}: {text[:300]}")
        try:
            return json.loads(body)
        except ValueError as e:
            raise RetrieverError(f"retrieval server at {url} sent non-JSON: {text[:200]!r}") from e

    # ---- one request, with retries ---------------------------------------------------------------------------

    def _request(self, payload: dict[str, Any], start: float, first: int) -> Any:
        """POST ``payload`` with the retry budget, starting at URL ``first``; the parsed reply.

        Raises:
            RetrieverUnavailableError: every attempt failed with a retried error.
            _WrongBody: HTTP 422. RetrieverError: any other non-retried failure.
        """
        attempt_urls = itertools.cycle(self.urls[first:] + self.urls[:first])
        stop: tenacity.stop.stop_base = tenacity.stop_after_attempt(self.max_retries + 1)
        if self.total_timeout is not None:
            stop = stop | tenacity.stop_before_delay(self.total_timeout)
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retryable),
            stop=stop,
            wait=tenacity.wait_incrementing(start=self.backoff, increment=self.backoff),
            reraise=True,
        )
        tried: list[str] = []

        def attempt() -> Any:
            url = next(attempt_urls)
            tried.append(url)
            deadline = time.monotonic() + self.timeout
            if self.total_timeout is not None:
                deadline = min(deadline, start + self.total_timeout)
            return self._post(url, payload, deadline)

        try:
            return retrying(attempt)
        except _Retryable as e:
            cause = e.args[0] if e.args else e
            where = tried[-1] if len(set(tried)) == 1 else f"{sorted(set(tried))}"
            reason = (f"{type(cause).__name__}: {cause} ({len(tried)} attempt(s) in {time.monotonic() - start:.1f} s, "
                      f"last at {tried[-1]})")  # fmt: skip
            raise RetrieverUnavailableError(
                f"retrieval server at {where} is unavailable: {reason}; budget: {self.timeout:g} s per attempt, "
                f"{self.max_retries} retries"
                + ("" if self.total_timeout is None else f", {self.total_timeout:g} s in all")
                + ". Start one with: drmas retrieval-server --corpus <corpus.jsonl> --retriever bm25 --port <port> "
                "(or serve the e5 index: drmas data list, recipe wiki18)",
                reason=reason,
            ) from cause

    def _ask(self, protocol: str, queries: list[str], topk: int, start: float) -> list[list[Passage]]:
        """The ranked passages of ``queries`` over ``protocol``."""
        if protocol == "search_r1":
            payload = {"queries": queries, "topk": topk, "return_scores": True}
            return self._parse(self._request(payload, start, self._next_url()), len(queries))
        out = []
        for q in queries:  # one request per query, each to the next URL
            payload = {"query": q, "topk": topk, "return_scores": True}
            out.extend(self._parse(self._request(payload, start, self._next_url()), 1))
        return out

    def _next_url(self) -> int:
        with self._lock:
            return next(self._turn) % len(self.urls)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """Per query, the server's ranked passages.

        Raises:
            RetrieverUnavailableError: a request failed with retried errors on every attempt.
            RetrieverError: the server rejected the request body (says which body it wants and how to set
                ``protocol``), answered another 4xx / non-retried status, or broke the reply format.
        """
        queries = check_search_args(queries, topk)
        if not queries:
            return []
        start = time.monotonic()
        if self.protocol != "auto":
            try:
                return self._ask(self.protocol, queries, topk, start)
            except _WrongBody as e:
                raise self._wrong_protocol_error(e) from None
        if self._detected is not None:
            try:
                return self._ask(self._detected, queries, topk, start)
            except _WrongBody as e:
                raise self._wrong_protocol_error(e) from None
        rejected: list[_WrongBody] = []
        for protocol in ("drmas", "search_r1"):  # the reference's body first: the paper's presets use its server
            try:
                hits = self._ask(protocol, queries, topk, start)
            except _WrongBody as e:
                rejected.append(e)
                continue
            self._detected = protocol
            return hits
        raise RetrieverError(
            f"the retrieval server at {rejected[-1].url} rejected both request bodies, "
            + "; ".join(f"{_BODY[e.protocol]}: HTTP 422 {e.detail[:200]}" for e in rejected)
            + ". Is this URL a retrieval server's /retrieve endpoint (the reference's, Search-R1's or "
            "drmas retrieval-server)?"
        )

    def _wrong_protocol_error(self, e: _WrongBody) -> RetrieverError:
        wanted = e.wanted()
        if wanted is not None and wanted != e.protocol:
            return RetrieverError(
                f"the retrieval server at {e.url} does not take the body protocol={e.protocol!r} sends "
                f"({_BODY[e.protocol]}): it wants {_BODY[wanted]}, the body of {_SERVER[wanted]}. Set "
                f"retriever_kwargs.protocol: {wanted} (or auto) in the env kwargs."
            )
        return RetrieverError(
            f"the retrieval server at {e.url} rejected the request body of protocol={e.protocol!r} "
            f"({_BODY[e.protocol]}) with HTTP 422: {e.detail[:300]}. Set retriever_kwargs.protocol: auto to detect "
            "what it takes."
        )

    def _parse(self, reply: Any, n: int) -> list[list[Passage]]:
        if not isinstance(reply, dict) or not isinstance(reply.get("result"), list) or len(reply["result"]) != n:
            raise RetrieverError(
                f"retrieval server at {self.url} broke the protocol: expected {{'result': [{n} lists]}}, "
                f"got {str(reply)[:200]}"
            )
        out = []
        for i, hits in enumerate(reply["result"]):
            ranked = []
            for j, hit in enumerate(hits):
                where = f"reply result[{i}][{j}]"
                if isinstance(hit, dict) and "document" in hit:
                    ranked.append(passage_from_document(hit["document"], where=where).with_score(float(hit.get("score", 0.0))))
                else:
                    ranked.append(passage_from_document(hit, where=where))
            out.append(ranked)
        return out

    def close(self) -> None:
        """Close the connection pool (safe to call twice)."""
        self._client.close()

    def __repr__(self) -> str:
        url = self.urls[0] if len(self.urls) == 1 else list(self.urls)
        total = "" if self.total_timeout is None else f", total_timeout={self.total_timeout:g}"
        return (f"HTTPRetriever({url!r}, timeout={self.timeout:g}, max_retries={self.max_retries}, "
                f"backoff={self.backoff:g}{total}, protocol={self.protocol!r})")
