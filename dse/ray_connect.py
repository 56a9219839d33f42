"""Joining a Ray cluster without hanging: the address is checked with a bounded wait before
`ray.init` (a gRPC call the GCS itself answers, framed by hand on HTTP/2 because plain Ray brings
no gRPC client), and Ray's C++ core log, which it writes to standard error while it retries, is
kept off the terminal."""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from dse.evaluate import one_line
from simcore.errors import ConfigError

_CONNECT_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""An HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS and its client
server both are) answers with a SETTINGS frame of its own (RFC 9113, section 3.4)."""

_GCS_PROBE_PATH = "/ray.rpc.NodeInfoGcsService/GetClusterId"
"""The first call `ray.init(address=...)` makes on a cluster's GCS (an empty request)."""

_H2_DATA, _H2_HEADERS, _H2_RST_STREAM, _H2_SETTINGS, _H2_GOAWAY = 0, 1, 3, 4, 7
_HPACK_STATUS = {0x88: "200", 0x89: "204", 0x8a: "206", 0x8b: "304", 0x8c: "400", 0x8d: "404",
                 0x8e: "500"}
"""The `:status` values of HPACK's static table (RFC 7541, appendix A), as one indexed byte."""


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") \
        + payload


def _hpack_literal(name: str, value: str) -> bytes:
    """A header field as an HPACK literal without indexing, name and value as plain strings
    (each shorter than 127 bytes)."""
    n, v = name.encode(), value.encode()
    return bytes([0, len(n)]) + n + bytes([len(v)]) + v


def _gcs_call(host: str, port: int) -> bytes:
    """A gRPC call of `_GCS_PROBE_PATH` on stream 1 after the connection preface: HEADERS
    (POST, http, the path, the authority, content-type application/grpc, te trailers), then DATA
    holding one empty gRPC message and ending the stream (RFC 9113; gRPC over HTTP/2)."""
    block = bytes([0x83, 0x86]) + b"".join(
        _hpack_literal(k, v) for k, v in ((":path", _GCS_PROBE_PATH),
                                          (":authority", f"{host}:{port}"),
                                          ("content-type", "application/grpc"),
                                          ("te", "trailers")))
    return (_CONNECT_PREFACE + _h2_frame(_H2_HEADERS, 0x4, 1, block)
            + _h2_frame(_H2_DATA, 0x1, 1, bytes(5)))


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the connection was closed")
        out += chunk
    return out


def _gcs_answer(conn: socket.socket) -> str | None:
    """Read frames until the answer to the call on stream 1 begins: None for a gRPC answer
    (`:status` 200), else what came instead, in words."""
    while True:
        head = _recv_exact(conn, 9)
        length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        payload = _recv_exact(conn, length)
        if kind == _H2_SETTINGS and not flags & 0x1:
            conn.sendall(_h2_frame(_H2_SETTINGS, 0x1, 0, b""))       # acknowledge them
        elif kind == _H2_GOAWAY:
            return "it closed the connection (HTTP/2 GOAWAY)"
        elif kind == _H2_RST_STREAM and stream == 1:
            return "it reset the call (HTTP/2 RST_STREAM)"
        elif kind == _H2_HEADERS and stream == 1:
            if flags & 0x8:                    # PADDED: the pad length comes first
                payload = payload[1:]
            if flags & 0x20:                   # PRIORITY: 5 bytes before the header block
                payload = payload[5:]
            status = _HPACK_STATUS.get(payload[0]) if payload else None
            return None if status == "200" else f"it answered HTTP status {status or '?'}, " \
                                                "not a gRPC reply"


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) that `ray.init(address)` will connect to; None for "auto" with no cluster
    recorded on this machine and no RAY_ADDRESS (Ray then says so itself, at once)."""
    if address.startswith("ray://"):
        host, _, port = address[len("ray://"):].partition(":")
        return host, int(port or 10001)
    try:
        # What ray.init does with the address: "auto" read from RAY_ADDRESS or the cluster
        # this machine last started, localhost replaced by the node's IP.
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:                       # moved in another Ray: read it as host:port
        if address == "auto":
            return None
        resolved = address
    else:
        try:
            resolved = canonicalize_bootstrap_address(address)
        except ConnectionError:
            return None
        if resolved is None:
            return None
    host, sep, port = resolved.rpartition(":")
    if not sep:
        host, port = resolved, ""
    return host.strip("[]"), int(port or 6379)


def probe_ray_address(address: str, timeout_s: float) -> None:
    """Raise ConfigError unless a Ray cluster answers at the address within `timeout_s`.

    `ray.init(address=...)` retries for minutes when nothing answers, and waits for ever on a
    server that accepts connections but never replies, so the driver asks first, with a bounded
    wait: a GCS address must answer a gRPC call of the GCS's own (`_GCS_PROBE_PATH`) with HTTP
    status 200; a Ray client address (ray://) must at least speak HTTP/2.
    """
    try:
        endpoint = ray_endpoint(address)
    except ValueError as err:
        raise ConfigError(f"execution.ray_address: {address!r} is not host:port, 'auto' or "
                          f"ray://host:port ({one_line(err)})") from None
    if endpoint is None:
        return
    where = f"execution.ray_address: no Ray cluster answers at {address}"
    deadline = time.monotonic() + timeout_s
    client = address.startswith("ray://")
    try:
        with socket.create_connection(endpoint, timeout=timeout_s) as conn:
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            if client:
                conn.sendall(_CONNECT_PREFACE)
                header = conn.recv(9)
                wrong = None if len(header) == 9 and header[3] == _H2_SETTINGS else \
                    "not a gRPC server"
            else:
                conn.sendall(_gcs_call(*endpoint))
                wrong = _gcs_answer(conn)
    except socket.timeout:
        raise ConfigError(f"{where} (no answer within {timeout_s:g} s); start it (`ray start "
                          f"--head`), fix the address, or raise execution.connect_timeout_s"
                          ) from None
    except OSError as err:
        raise ConfigError(f"{where} ({err.strerror or one_line(err)}); start it (`ray start "
                          f"--head`) or fix the address") from None
    if wrong:
        raise ConfigError(f"{where}: something else listens on {endpoint[0]}:{endpoint[1]} "
                          f"({wrong}); check the port")


@contextmanager
def stderr_kept(lines: list[str]) -> Iterator[None]:
    """Keep what is written to file descriptor 2 meanwhile (Ray's C++ core logs there while it
    tries to reach a cluster) off the terminal, and append its lines to `lines`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())


def last_ray_complaint(lines: list[str]) -> str:
    """The last warning or error Ray's core logged, without its timestamp and source prefix."""
    for line in reversed(lines):
        m = re.match(r"^\[[^]]*\s[WEF]\s[^]]*\]\s*(?:[\w.]+:\d+:\s*)?(.+)$", line.strip())
        if m:
            return m.group(1)
    return ""
