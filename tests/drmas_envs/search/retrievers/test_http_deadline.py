"""The http retriever's deadlines are wall-clock (issue 14 item 4b): a server on 127.0.0.1 that trickles its reply
one byte at a time fails inside ``timeout`` per attempt and inside ``total_timeout`` per call, retries included; a
reply that completes in time is still read.

No assert reads a clock: the trickled reply never ends (a ``Content-Length`` of 10**12 bytes at 10 bytes/s), or
ends long after the attempt's deadline, and each byte arrives well within httpx's per-read timeout, so only the
deadlines can end the call; the evidence is the error, the connections made, and the server seeing the client hang
up mid-reply (the abandoned attempt stops reading). How close to the deadline the call returns is measured by
``benchmarks/perf/time_bounds.py``."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

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
    """Accepts connections; answers each with HTTP headers, then the JSON body one byte every ``gap`` seconds.

    ``endless``: announce 10**12 bytes and, after the JSON, trickle spaces until the client hangs up
    (``hung_up`` is set then) or the server closes.
    """

    def __init__(self, gap: float, endless: bool = False) -> None:
        self.gap, self.endless = gap, endless
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.stop = threading.Event()
        self.hung_up = threading.Event()
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

    def _body(self) -> Iterator[bytes]:
        body = REPLY.encode()
        yield from (body[i : i + 1] for i in range(len(body)))
        while self.endless:
            yield b" "

    def _answer(self, conn: socket.socket) -> None:
        length = 10**12 if self.endless else len(REPLY.encode())
        try:
            _read_request(conn)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % length)  # fmt: skip
            for byte in self._body():
                if self.stop.is_set():
                    break
                conn.sendall(byte)
                time.sleep(self.gap)
        except OSError:  # the client closed the connection: a send fails (EPIPE / ECONNRESET)
            self.hung_up.set()
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


@pytest.fixture
def trickle():
    servers = []

    def start(gap, endless=False):
        servers.append(TricklingServer(gap, endless))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def test_trickling_server_fails_inside_the_deadline(trickle):
    # 10 bytes/s without end: each byte arrives well within httpx's per-read timeout
    server = trickle(0.1, endless=True)
    client = HTTPRetriever(server.url, timeout=1.0, max_retries=3, backoff=0.05, total_timeout=1.0)
    with pytest.raises(RetrieverUnavailableError, match=r"is unavailable: (ReadTimeout|TimeoutException): .*deadline.*"
                                                        r"1 s per attempt.*1 s in all"):  # fmt: skip
        client.search(["capital of France"], 1)
    # the deadline covers the retries: no second attempt once it is spent (and none at all only if the machine
    # froze for the whole 1 s between computing the deadline and sending the first request)
    assert server.connections <= 1
    # the abandoned attempt hangs up at its next byte past the deadline, ~0.1 s later (the 60 s wait is a hang
    # guard, 600x that); were it left reading, the reply would keep trickling for 10**11 s
    assert server.hung_up.wait(60) or server.connections == 0


def test_each_attempt_has_its_own_deadline(trickle):
    """Without total_timeout (the reference's budget), every attempt still ends at ``timeout``: the endless reply
    would otherwise hold the first attempt for ever."""
    server = trickle(0.1, endless=True)
    client = HTTPRetriever(server.url, timeout=0.5, max_retries=1, backoff=0.0)
    with pytest.raises(RetrieverUnavailableError, match=r"ReadTimeout|TimeoutException") as err:
        client.search(["capital of France"], 1)
    assert "2 attempt(s)" in err.value.reason and server.connections == 2


def test_slow_but_complete_reply_within_the_deadline_is_read(trickle):
    # ~1 s for the whole reply, one byte at a time; the 60 s budget leaves 60x for load
    server = trickle(0.01)
    client = HTTPRetriever(server.url, timeout=60.0, max_retries=0)
    (hits,) = client.search(["capital of France"], 1)
    assert [(p.title, p.score) for p in hits] == [("Paris", 2.0)]
    assert not server.hung_up.is_set()
