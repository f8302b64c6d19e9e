"""A uvicorn server in a thread of the test process, for the tests that talk HTTP to an ASGI app (the OpenAI-compatible
server, the OpenAI client, ``drmas eval`` against an endpoint)."""

from __future__ import annotations

import socket
import threading
import time


class LocalServer:
    """A uvicorn server in a thread on a socket bound here first (port 0: no race for a free port with other
    processes); ``with`` yields its ``/v1`` URL once uvicorn reports ``started``."""

    start_limit_s = 300.0  # start-up on a bound socket takes well under a second: a roomy limit, never a race

    def __init__(self, app):
        import uvicorn  # an optional test dependency: callers importorskip it first

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + self.start_limit_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.sock.close()
                raise RuntimeError(f"test server did not start (thread alive: {self.thread.is_alive()})")
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=300)
        self.sock.close()
