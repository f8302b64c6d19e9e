"""Client of the retrieval-server protocol of Search-R1 (``search_r1/search/retrieval_server.py``) and Dr. MAS.

Protocol (one endpoint)::

    POST <url>            (conventionally http://127.0.0.1:8000/retrieve)
    request  {"queries": [str, ...], "topk": int, "return_scores": bool}     protocol="search_r1" (one batch)
             {"query": str, "topk": int, "return_scores": bool}            protocol="drmas" (one request per query:
             the Dr. MAS reference server, langfengQ/DrMAS examples/search/retriever/retrieval_server.py:304-307,
             takes a single query)
    response {"result": [per query: [{"document": {"id": str, "contents": '"Title"\\ntext'}, "score": float}, ...]]}
             (with "return_scores": false each per-query list holds the documents themselves)

Timeouts and bounded retries with exponential backoff come from httpx and tenacity. The whole ``search`` call,
retries and backoff included, is bounded by ``timeout`` seconds of wall-clock time, however the server sends
its reply: httpx's own timeouts are per network operation, so a server trickling one byte every 0.5 s would hold
a call for minutes. Each attempt therefore streams the reply in a helper thread that checks the deadline after
every chunk, and the caller waits for it no longer than the deadline (a late attempt is abandoned: its thread
ends at its next chunk or read timeout). Past the deadline :class:`RetrieverUnavailableError` says which URL
failed, how, and how to start a server.
"""

from __future__ import annotations

import concurrent.futures
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

#: Request bodies this client can send (see the module doc).
PROTOCOLS = ("search_r1", "drmas")

#: Where Search-R1's ``retrieval_launch.sh`` and ``drmas retrieval-server`` listen by default.
DEFAULT_URL = "http://127.0.0.1:8000/retrieve"


class _Retryable(Exception):
    """A transport failure or a 5xx reply: worth another attempt."""


class HTTPRetriever:
    """Retriever backed by a remote (usually local) retrieval server.

    Args:
        url: the ``/retrieve`` endpoint.
        timeout: wall-clock budget in seconds for one ``search`` call, retries and backoff included (> 0).
        max_retries: extra attempts after the first on connection errors, timeouts and 5xx replies (>= 0).
        backoff: first backoff in seconds; doubles per retry (tenacity ``wait_exponential``), capped at 2 s.
        protocol: the request body the server takes: ``"search_r1"`` (a ``queries`` batch; Search-R1's server and
            ``drmas retrieval-server``) or ``"drmas"`` (one ``query`` per request; the Dr. MAS reference server).

    Raises:
        ValueError: bad ``url``/``timeout``/``max_retries``/``protocol``.
    """

    name = "http"

    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = 10.0, max_retries: int = 3, backoff: float = 0.1,
                 protocol: str = "search_r1") -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL such as {DEFAULT_URL!r}, got {url!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        self.protocol = protocol
        self.url = url
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff = float(backoff)
        self._client = httpx.Client(trust_env=False)

    def _post(self, payload: dict[str, Any], deadline: float) -> Any:
        """One attempt, bounded by ``deadline`` (time.monotonic) however slowly the server sends its reply."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Retryable(httpx.TimeoutException("deadline reached before the request"))
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        threading.Thread(target=self._attempt, args=(payload, deadline, future), daemon=True,
                         name="drmas-http-retriever").start()  # fmt: skip
        try:
            return future.result(timeout=remaining)
        except concurrent.futures.TimeoutError:
            raise _Retryable(httpx.TimeoutException(
                f"no complete reply within the {self.timeout:g} s deadline (server too slow or trickling bytes)"
            )) from None  # fmt: skip

    def _attempt(self, payload: dict[str, Any], deadline: float, future: concurrent.futures.Future[Any]) -> None:
        """Runs in a helper thread: POST, stream the reply checking ``deadline`` per chunk, set ``future``."""
        try:
            future.set_result(self._read_reply(payload, deadline))
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            future.set_exception(err)

    def _read_reply(self, payload: dict[str, Any], deadline: float) -> Any:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Retryable(httpx.TimeoutException("deadline reached before the request"))
        body = bytearray()
        try:
            with self._client.stream("POST", self.url, json=payload, timeout=remaining) as resp:
                for chunk in resp.iter_bytes():
                    body += chunk
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout(f"reply still incomplete at the {self.timeout:g} s deadline")
        except httpx.TransportError as e:  # connect refused, timeouts, resets
            raise _Retryable(e) from e
        text = body.decode("utf-8", errors="replace")
        if resp.status_code >= 500:
            raise _Retryable(RetrieverError(f"HTTP {resp.status_code}: {text[:200]}"))
        if resp.status_code != 200:
            raise RetrieverError(f"retrieval server at {self.url} answered HTTP {resp.status_code}: {text[:300]}")
        try:
            return json.loads(body)
        except ValueError as e:
            raise RetrieverError(f"retrieval server at {self.url} sent non-JSON: {text[:200]!r}") from e

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """POST the batch; per query the server's ranked passages.

        Raises:
            RetrieverUnavailableError: no successful reply within ``timeout`` seconds / ``max_retries`` retries.
            RetrieverError: the server replied with a 4xx status or a reply that breaks the protocol.
        """
        queries = check_search_args(queries, topk)
        if not queries:
            return []
        start = time.monotonic()
        deadline = start + self.timeout
        if self.protocol == "drmas":  # one request per query, all within the same deadline
            return [hits for q in queries
                    for hits in self._request({"query": q, "topk": topk, "return_scores": True}, 1, start, deadline)]
        return self._request({"queries": queries, "topk": topk, "return_scores": True}, len(queries), start, deadline)

    def _request(self, payload: dict[str, Any], n: int, start: float, deadline: float) -> list[list[Passage]]:
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retryable),
            stop=tenacity.stop_after_attempt(self.max_retries + 1) | tenacity.stop_before_delay(self.timeout),
            wait=tenacity.wait_exponential(multiplier=self.backoff, max=2.0),
            reraise=True,
        )
        try:
            reply = retrying(self._post, payload, deadline)
        except _Retryable as e:
            cause = e.args[0] if e.args else e
            attempts = retrying.statistics.get("attempt_number", 1)
            raise RetrieverUnavailableError(
                f"retrieval server at {self.url} is unavailable: {type(cause).__name__}: {cause} "
                f"({attempts} attempt(s) in {time.monotonic() - start:.2f} s, timeout {self.timeout:g} s). "
                "Start one with: drmas retrieval-server --corpus <corpus.jsonl> --retriever bm25 --port <port>"
            ) from cause
        return self._parse(reply, n)

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
        return (f"HTTPRetriever({self.url!r}, timeout={self.timeout:g}, max_retries={self.max_retries}, "
                f"protocol={self.protocol!r})")
