"""An ASGI app served by uvicorn in a thread of the benchmark's own process, on a socket bound first.

Binding port 0 before uvicorn starts leaves no race for a free port with other processes. openai_server.py and
time_bounds.py load this file by path (``benchmarks`` is no package); uvicorn is imported only when a server
starts, so a script can load this file without it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) in a daemon thread; yields ``http://127.0.0.1:<port>`` once
    uvicorn reports it has started.

    On exit uvicorn is asked to stop (``should_exit``), its thread joined (60 s at most) and the socket closed;
    requests still running hold the shutdown up, so release them before leaving the ``with`` block.

    Raises:
        RuntimeError: the server thread ended before uvicorn started.
        ImportError: uvicorn is not installed.
    """
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the benchmark's uvicorn server did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
