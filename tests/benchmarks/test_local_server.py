"""benchmarks/perf/local_server.py: an app served in a thread answers at the yielded URL, the port is closed once
the ``with`` block ends, and a server that cannot start is an error, not a hang."""

from __future__ import annotations

import socket

import pytest

from helpers.scripts import load_script

fastapi = pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

local_server = load_script("benchmarks/perf/local_server.py", "perf_local_server")


def test_the_app_answers_at_the_yielded_url_until_the_block_ends():
    app = fastapi.FastAPI()

    @app.get("/v1/ping")
    def ping() -> dict:
        return {"pong": True}

    with local_server.serve_in_thread(app) as base:
        assert base.startswith("http://127.0.0.1:")
        with httpx.Client(trust_env=False) as client:
            assert client.get(f"{base}/v1/ping").json() == {"pong": True}
    port = int(base.rsplit(":", 1)[1])
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_server_that_cannot_start_raises():
    # uvicorn imports the app in the server thread: the import fails and the thread ends (SystemExit, the warning)
    # before ``started``
    with pytest.raises(RuntimeError, match="uvicorn server did not start"):
        with local_server.serve_in_thread("drmas_no_such_module_xyz:app"):
            pytest.fail("yielded without a server")
