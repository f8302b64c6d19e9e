"""A stand-in for the Dr. MAS reference's retrieval server, for tests and dress rehearsals.

The paper's search runs query the reference's server (``langfengQ/DrMAS
examples/search/retriever/retrieval_server.py``), which needs the 60+ GB e5 index of wiki-18 and a GPU.
:class:`ReferenceProtocolServer` speaks exactly its HTTP interface over any drmas retriever, on 127.0.0.1:

* request model ``{"query": str, "topk": int | None = None, "return_scores": bool = False}`` (``:304-307``): one
  query per request; a Search-R1 ``{"queries": [...]}`` body is answered HTTP 422 (``query`` missing), as by the
  real server;
* a missing or zero ``topk`` means the server's default (``:324-325``);
* reply ``{"result": [[{"document": {"id", "contents"}, "score": float}, ...]]}`` (one list; documents alone
  without ``return_scores``, ``:335-345``).

So a client, a preset or a rehearsal that works against it works against the reference's server. Example::

    >>> import drmas_envs
    >>> from drmas_envs.search.retrievers import make_retriever
    >>> from drmas_envs.search.synthetic import EncyclopediaConfig, generate_encyclopedia
    >>> bm25 = make_retriever("bm25", generate_encyclopedia(EncyclopediaConfig()).passages)
    >>> with ReferenceProtocolServer(bm25) as server:                           # doctest: +SKIP
    ...     env = drmas_envs.make("search-orchestrator-v0", retriever="http", retriever_kwargs={"url": server.url})

Needs fastapi and uvicorn (``pip install 'drmas[server]'``).
"""

from typing import Any

from drmas_envs.search.retrievers.base import Retriever
from drmas_envs.search.server import ServerThread, _require_server_deps

__all__ = ["ReferenceProtocolServer", "create_reference_protocol_app"]


def create_reference_protocol_app(retriever: Retriever, *, default_topk: int = 3,
                                  requests: list[dict[str, Any]] | None = None) -> Any:  # fmt: skip
    """A FastAPI app with the reference server's ``/retrieve`` (module doc) over ``retriever``; every accepted
    request body is appended to ``requests`` when given."""
    fastapi, _ = _require_server_deps()
    from pydantic import BaseModel

    # the reference's request model, field for field (retrieval_server.py:304-307)
    class QueryRequest(BaseModel):
        query: str
        topk: int | None = None
        return_scores: bool = False

    app = fastapi.FastAPI(title="Dr. MAS reference retrieval protocol (drmas stand-in)")
    # (no ``from __future__ import annotations`` in this module: FastAPI must see the local QueryRequest class)

    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> dict[str, Any]:
        if requests is not None:
            requests.append(request.model_dump())
        hits = retriever.search([request.query], request.topk or default_topk)[0]
        if request.return_scores:
            return {"result": [[{"document": p.to_document(), "score": float(p.score)} for p in hits]]}
        return {"result": [[p.to_document() for p in hits]]}

    return app


class ReferenceProtocolServer(ServerThread):
    """:func:`create_reference_protocol_app` over ``retriever`` in a background thread; a context manager.

    Attributes:
        url: ``http://127.0.0.1:<port>/retrieve`` once started (``port=0``: a free port).
        requests: the bodies it accepted, in order (``{"query", "topk", "return_scores"}``).

    Raises:
        RetrieverError: fastapi / uvicorn missing, or the server did not start within ``start_timeout`` s.
    """

    def __init__(self, retriever: Retriever, *, host: str = "127.0.0.1", port: int = 0, default_topk: int = 3,
                 start_timeout: float = 20.0) -> None:  # fmt: skip
        self.requests: list[dict[str, Any]] = []
        app = create_reference_protocol_app(retriever, default_topk=default_topk, requests=self.requests)
        super().__init__(host=host, port=port, start_timeout=start_timeout, app=app)
