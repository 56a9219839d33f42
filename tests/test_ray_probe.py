"""The bounded check of `execution.ray_address` made before `ray.init`, against servers that answer
as a Ray GCS would, as something else would, or not at all; and Ray's core log kept off the
terminal while it tries to join."""

import os
import socket
import threading
import time

import pytest

from dse.ray_connect import last_ray_complaint, probe_ray_address, stderr_kept
from simcore.errors import ConfigError

SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _headers(first_byte: int) -> bytes:
    """A response HEADERS frame on stream 1 whose header block starts with `first_byte`."""
    block = bytes([first_byte])
    return len(block).to_bytes(3, "big") + bytes([1, 0x4]) + (1).to_bytes(4, "big") + block


class FakeServer:
    """Accepts connections on every interface (Ray swaps localhost for the node's address),
    sends its HTTP/2 SETTINGS, then `reply` once the client's call arrived (or nothing)."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply
        self.received = b""
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(SETTINGS)
                while b"/ray.rpc.NodeInfoGcsService/GetClusterId" not in self.received:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    self.received += chunk
                if self.reply is not None:
                    conn.sendall(self.reply)
                time.sleep(5)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server(request):
    s = FakeServer(request.param)
    yield s
    s.close()


@pytest.mark.parametrize("server", [_headers(0x88)], indirect=True)
def test_a_grpc_reply_to_the_gcs_call_passes(server):
    probe_ray_address(f"127.0.0.1:{server.port}", 5)
    assert server.received.startswith(b"PRI * HTTP/2.0")


@pytest.mark.parametrize("server", [_headers(0x8d)], indirect=True)
def test_an_http_server_that_is_not_ray_is_named(server):
    with pytest.raises(ConfigError, match=r"something else listens on .*answered HTTP status 404"):
        probe_ray_address(f"127.0.0.1:{server.port}", 5)


@pytest.mark.parametrize("server", [None], indirect=True)
def test_a_server_that_never_replies_fails_within_the_timeout(server):
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"no answer within 1 s.*connect_timeout_s"):
        probe_ray_address(f"127.0.0.1:{server.port}", 1.0)
    assert time.monotonic() - start < 3


def test_nothing_listening_is_refused_at_once():
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(ConfigError, match="no Ray cluster answers at .*Connection refused"):
        probe_ray_address(f"127.0.0.1:{port}", 5)


@pytest.mark.slow
def test_a_real_gcs_passes(ray_address):
    probe_ray_address(ray_address, 5)


def test_what_ray_core_writes_to_stderr_is_kept_and_its_last_complaint_read():
    kept: list[str] = []
    with stderr_kept(kept):
        os.write(2, b"[2026-12-02 00:41:42,103 W 20075 20075] gcs_client.cc:210: Failed to get "
                    b"cluster ID from GCS server: RpcError: 404\n")
    assert len(kept) == 1
    assert last_ray_complaint(kept) == "Failed to get cluster ID from GCS server: RpcError: 404"
    assert last_ray_complaint(["plain text"]) == ""
