"""A small HTTP proxy on 127.0.0.1 in front of the test S3 server that injects network faults into chosen requests.

Every client prl uses (delta-rs, pyarrow's S3 filesystem, boto3) is pointed at the proxy through
``AWS_ENDPOINT_URL``. Each connection carries one request: the proxy reads the whole request, forwards it with
``Connection: close`` and relays the whole answer, also marked ``Connection: close``, so every request can be told
apart without parsing keep-alive streams. A :class:`Fault` picks requests by method and a regular expression on
the path and does one of:

- ``drop_answer``: forward the request (the server applies it), read the answer, then close the client's
  connection without sending it, as when a link drops after the server committed;
- ``reset``: read the request head and part of its body, then reset the connection (nothing reaches the server);
- ``stall``: hold the request until :meth:`FaultyProxy.release` (or ``stall_seconds``), then forward it.

Usage::

    with FaultyProxy(moto_endpoint) as proxy:
        proxy.add(Fault("PUT", r"/traces/_delta_log/\\d{20}\\.json$", "drop_answer"))
        env = {**environ, "AWS_ENDPOINT_URL": proxy.url}
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["drop_answer", "reset", "stall"]


@dataclass
class Fault:
    """Apply ``kind`` to the next ``times`` requests whose method is ``method`` and whose path (without the
    query) matches ``path`` (``re.search``), after letting the first ``skip`` of them through untouched."""

    method: str
    path: str
    kind: Kind
    times: int = 1
    stall_seconds: float = 60.0
    skip: int = 0
    hits: list[str] = field(default_factory=list)
    """The request lines this fault was applied to."""
    passed: list[str] = field(default_factory=list)
    """The matching request lines let through before the fault began (``skip``)."""

    def matches(self, method: str, path: str, line: str = "") -> bool:
        if self.times <= len(self.hits) or method != self.method or re.search(self.path, path) is None:
            return False
        if len(self.passed) < self.skip:
            self.passed.append(line)
            return False
        return True


class FaultyProxy:
    """The proxy; a context manager that starts it on a free port of 127.0.0.1 and stops it."""

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.faults: list[Fault] = []
        self.requests: list[str] = []
        """Every request line seen, in order."""
        self._mutex = threading.Lock()
        self._released = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="faulty-proxy", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.getsockname()[:2]
        return f"http://{host}:{port}"

    def add(self, fault: Fault) -> Fault:
        with self._mutex:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        """Disarm every fault (requests already picked keep theirs)."""
        with self._mutex:
            self.faults.clear()

    def release(self) -> None:
        """Let stalled requests through (and every later one that a stall fault picks)."""
        self._released.set()

    def __enter__(self) -> FaultyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._released.set()
        with contextlib.suppress(OSError):  # closing a listening socket does not wake a thread blocked in accept()
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._thread.join(timeout=5)
        assert not self._thread.is_alive(), "the proxy's accept loop did not stop"

    # --- serving ------------------------------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _pick(self, method: str, path: str, line: str) -> Fault | None:
        with self._mutex:
            self.requests.append(line)
            for fault in self.faults:
                if fault.matches(method, path, line):
                    fault.hits.append(line)
                    return fault
        return None

    def _handle(self, client: socket.socket) -> None:
        with client:
            try:
                head, body_start = _read_head(client)
            except (OSError, ValueError):
                return
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, target = line.split(" ")[:2]
            fault = self._pick(method, urllib.parse.urlsplit(target).path, line)
            if fault is not None and fault.kind == "reset":
                _reset(client)
                return
            headers = _headers(head)
            if headers.get("expect", "").lower() == "100-continue":
                client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                body = _read_body(client, headers, body_start)
            except (OSError, ValueError):
                return
            if fault is not None and fault.kind == "stall":
                self._released.wait(fault.stall_seconds)
            answer = self._forward(_with_close(head, drop=("expect",)), body)
            if answer is None or (fault is not None and fault.kind == "drop_answer"):
                _reset(client)
                return
            answer_head, _, answer_body = answer.partition(b"\r\n\r\n")
            client.sendall(_with_close(answer_head + b"\r\n\r\n") + answer_body)

    def _forward(self, head: bytes, body: bytes) -> bytes | None:
        """Send one request upstream and read its whole answer (the server closes after it)."""
        try:
            with socket.create_connection(self.upstream, timeout=60) as upstream:
                upstream.sendall(head + body)
                chunks = []
                while chunk := upstream.recv(1 << 16):
                    chunks.append(chunk)
                return b"".join(chunks)
        except OSError:
            return None


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The request head (through its blank line) and the bytes read past it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ValueError("connection closed before the request head ended")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _headers(head: bytes) -> dict[str, str]:
    out = {}
    for raw in head.split(b"\r\n")[1:]:
        name, sep, value = raw.decode("latin-1").partition(":")
        if sep:
            out[name.strip().lower()] = value.strip()
    return out


def _read_body(sock: socket.socket, headers: dict[str, str], data: bytes) -> bytes:
    """The request body, framed by ``Content-Length`` or chunked transfer encoding (kept as sent)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while not _chunked_complete(data):
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise ValueError("connection closed inside a chunked body")
            data += chunk
        return data
    length = int(headers.get("content-length", "0") or 0)
    while len(data) < length:
        chunk = sock.recv(min(1 << 16, length - len(data)))
        if not chunk:
            raise ValueError("connection closed inside the body")
        data += chunk
    return data


def _chunked_complete(data: bytes) -> bool:
    position = 0
    while True:
        end = data.find(b"\r\n", position)
        if end < 0:
            return False
        size = int(data[position:end].split(b";")[0] or b"0", 16)
        if size == 0:
            rest = data[end + 2 :]
            return rest.startswith(b"\r\n") or b"\r\n\r\n" in rest
        position = end + 2 + size + 2
        if position > len(data):
            return False


def _with_close(head: bytes, drop: tuple[str, ...] = ()) -> bytes:
    """The head with ``Connection: close`` (and without the headers named in ``drop``)."""
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    kept = [lines[0]]
    for raw in lines[1:]:
        name = raw.split(b":", 1)[0].strip().lower().decode("latin-1")
        if name not in ("connection", "keep-alive", *drop):
            kept.append(raw)
    kept.append(b"Connection: close")
    return b"\r\n".join(kept) + b"\r\n\r\n"


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (no orderly shutdown), as a dropped link looks to the client."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
