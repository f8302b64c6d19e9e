"""The http retriever's deadlines are wall-clock (issue 14 item 4b): a server on 127.0.0.1 that trickles its reply
one byte at a time fails inside ``timeout`` per attempt and inside ``total_timeout`` per call, retries included; a
reply that completes in time is still read."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from drmas_envs.search.retrievers.base import RetrieverUnavailableError
from drmas_envs.search.retrievers.http import HTTPRetriever

REPLY = json.dumps({"result": [[{"document": {"id": "1", "contents": '"Paris"\nCapital of France.'}, "score": 2.0}]]})


def _read_request(conn: socket.socket) -> None:
    """Read one whole HTTP request (headers + Content-Length body): closing with unread data would reset."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += conn.recv(65536)


class TricklingServer:
    """Accepts connections; answers each with HTTP headers, then the JSON body one byte every ``gap`` seconds."""

    def __init__(self, gap: float) -> None:
        self.gap = gap
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.stop = threading.Event()
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/retrieve"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        body = REPLY.encode()
        try:
            _read_request(conn)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body))  # fmt: skip
            for i in range(len(body)):
                if self.stop.is_set():
                    break
                conn.sendall(body[i : i + 1])
                time.sleep(self.gap)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


@pytest.fixture
def trickle():
    servers = []

    def start(gap):
        servers.append(TricklingServer(gap))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def test_trickling_server_fails_inside_the_deadline(trickle):
    server = trickle(0.1)  # ~10 bytes/s: the reply (~90 bytes) takes ~9 s; each byte arrives well within a read timeout
    client = HTTPRetriever(server.url, timeout=1.0, max_retries=3, backoff=0.05, total_timeout=1.0)
    start = time.monotonic()
    with pytest.raises(RetrieverUnavailableError, match=r"is unavailable: (ReadTimeout|TimeoutException): .*deadline.*"
                                                        r"1 s per attempt.*1 s in all"):  # fmt: skip
        client.search(["capital of France"], 1)
    elapsed = time.monotonic() - start
    assert elapsed < 1.0 + 0.3, elapsed  # the deadline, not ~9 s per attempt (httpx's timeouts are per read)
    assert server.connections >= 1


def test_each_attempt_has_its_own_deadline(trickle):
    """Without total_timeout (the reference's budget), every attempt still ends at ``timeout``: the ~9 s reply
    would otherwise complete and the search succeed."""
    server = trickle(0.1)
    client = HTTPRetriever(server.url, timeout=0.5, max_retries=1, backoff=0.0)
    with pytest.raises(RetrieverUnavailableError, match=r"ReadTimeout|TimeoutException") as err:
        client.search(["capital of France"], 1)
    assert "2 attempt(s)" in err.value.reason and server.connections == 2


def test_slow_but_complete_reply_within_the_deadline_is_read(trickle):
    server = trickle(0.01)  # ~1 s for the whole reply, one byte at a time
    client = HTTPRetriever(server.url, timeout=5.0, max_retries=0)
    (hits,) = client.search(["capital of France"], 1)
    assert [(p.title, p.score) for p in hits] == [("Paris", 2.0)]
