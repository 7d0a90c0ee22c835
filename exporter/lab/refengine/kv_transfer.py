"""The KV-cache hand-over of a disaggregated pair: prefill keeps, decode pulls, over loopback TCP.

As with vLLM's NixlConnector, the decode server reads the KV cache from the prefill server
(a one-sided read: the prefill side only serves what it holds), and the prefill side keeps a
finished request's cache until it has been read or its lease runs out (vLLM's
``kv_lease_duration``; an expired request counts in ``vllm:nixl_num_kv_expired_reqs`` on the
prefill server). The bytes are the request's real cache: every layer's keys and values of
every prompt position, ``layers x 2 x kv_heads x head_dim x tokens x element size`` bytes,
laid out ``[layers, 2, heads, tokens, head_dim]``.

Wire format (one request per connection)::

    decode  -> prefill   b"PULL <request id>\\n"
    prefill -> decode    b"E"                                     (not held: expired, unknown)
                      or b"K" <u32 header length> <JSON header> <u64 payload length> <payload>
    decode  -> prefill   b"D"                           (read whole: NIXL's completion notice)

The prefill side lets go of a cache only on the decode side's notice; a reader that drops the
connection before it leaves the cache held until its lease expires, as a NIXL read that never
completes does. A notice that cannot be sent counts as a failed notification on the decode
side (``vllm:nixl_num_failed_notifications``).

The header carries the cache's shape (``tokens``, ``layers``, ``heads``, ``head_dim``,
``element_size``). ``kv-transfer-slow`` throttles the link: the sender writes, and the
receiver reads, at most ``rate`` bytes a second in 64 KiB pieces, sleeping between them, so
the time a transfer takes is the link's, as on a congested network.

No torch here: the model worker serialises and loads the tensors
(:meth:`exporter.lab.refengine.torch_model.Model.export_kv`).
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CHUNK = 64 * 1024
HEADER = struct.Struct("!I")
LENGTH = struct.Struct("!Q")
MAX_HEADER = 64 * 1024
MAX_PAYLOAD = 8 * 1024**3
SWEEP_S = 0.25


DONE = b"D"
ACK_TIMEOUT_S = 10.0


class TransferError(RuntimeError):
    """The KV cache did not arrive whole."""


@dataclass(frozen=True)
class KVMeta:
    tokens: int
    layers: int
    heads: int
    head_dim: int
    element_size: int

    @property
    def nbytes(self) -> int:
        return self.layers * 2 * self.heads * self.head_dim * self.tokens * self.element_size

    def descriptors(self, block_size: int) -> int:
        """NIXL's descriptors of the transfer: one per KV block, per layer, for keys and for
        values (each a registered memory region of its own)."""
        return self.layers * 2 * math.ceil(self.tokens / max(1, block_size))

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> KVMeta:
        data: dict[str, Any] = json.loads(raw)
        return cls(**{k: int(data[k]) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Pulled:
    meta: KVMeta
    payload: bytes
    post_seconds: float  # connect and post the read request
    xfer_seconds: float  # from the posted request to the last byte
    notified: bool = True  # the completion notice reached the prefill side


class Throttle:
    """At most ``rate`` bytes a second over a transfer (0: unlimited)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.moved = 0

    def account(self, n: int) -> None:
        self.moved += n
        if self.rate <= 0:
            return
        ahead = self.start + self.moved / self.rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)


# --- prefill side --------------------------------------------------------------------------------


@dataclass
class _Held:
    meta: KVMeta
    payload: bytes
    expires: float


class KVStore:
    """Finished prefills' caches, held until read or expired (thread-safe)."""

    def __init__(self, lease_s: float, on_expired: Callable[[int], None]) -> None:
        self.lease_s = lease_s
        self.on_expired = on_expired
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()

    def put(self, rid: str, meta: KVMeta, payload: bytes) -> None:
        if len(payload) != meta.nbytes:
            raise ValueError(f"KV payload of {len(payload)} bytes, the shape says {meta.nbytes}")
        with self._lock:
            self._held[rid] = _Held(meta, payload, time.monotonic() + self.lease_s)

    def take(self, rid: str) -> _Held | None:
        with self._lock:
            return self._held.pop(rid, None)

    def give_back(self, rid: str, held: _Held) -> None:
        """A read that failed half-way: the cache stays held until its lease runs out."""
        with self._lock:
            self._held.setdefault(rid, held)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def sweep(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        with self._lock:
            gone = [rid for rid, h in self._held.items() if h.expires <= now]
            for rid in gone:
                del self._held[rid]
        if gone:
            self.on_expired(len(gone))
        return len(gone)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    store: KVStore
    rate: float


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        line = self.rfile.readline(256)
        if not line.startswith(b"PULL "):
            return
        rid = line[5:].strip().decode("ascii", "replace")
        store = self.server.store
        held = store.take(rid)
        if held is None:
            with contextlib.suppress(OSError):
                self.connection.sendall(b"E")
            return
        try:
            _send(self.connection, held.meta, held.payload, self.server.rate)
            self.connection.settimeout(ACK_TIMEOUT_S)
            done = self.connection.recv(1) == DONE
        except OSError:
            done = False
        if not done:
            store.give_back(rid, held)


def _send(sock: socket.socket, meta: KVMeta, payload: bytes, rate: float) -> None:
    head = meta.to_json()
    sock.sendall(b"K" + HEADER.pack(len(head)) + head + LENGTH.pack(len(payload)))
    throttle = Throttle(rate)
    view = memoryview(payload)
    for offset in range(0, len(payload), CHUNK):
        piece = view[offset : offset + CHUNK]
        sock.sendall(piece)
        throttle.account(len(piece))


class KVServer:
    """The prefill server's side of the link: serves held caches on ``host:port``."""

    def __init__(self, store: KVStore, host: str = "127.0.0.1", port: int = 0, rate: float = 0.0):
        self.store = store
        self._server = _Server((host, port), _Handler)
        self._server.store = store
        self._server.rate = rate
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def rate(self) -> float:
        """The link's bytes per second (0: unthrottled); a transfer starting later uses a new
        value."""
        return float(self._server.rate)

    @rate.setter
    def rate(self, value: float) -> None:
        self._server.rate = value

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        serve = threading.Thread(
            target=self._server.serve_forever, args=(0.2,), name="kv-server", daemon=True
        )
        sweep = threading.Thread(target=self._sweep, name="kv-lease", daemon=True)
        self._threads = [serve, sweep]
        for thread in self._threads:
            thread.start()

    def _sweep(self) -> None:
        while not self._stop.wait(SWEEP_S):
            self.store.sweep()

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()


# --- decode side ---------------------------------------------------------------------------------


def _read_exact(sock: socket.socket, n: int, throttle: Throttle | None = None) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(CHUNK, n - got))
        if k == 0:
            raise TransferError(f"the prefill side closed the connection after {got} of {n} bytes")
        got += k
        if throttle is not None:
            throttle.account(k)
    return bytes(buf)


def pull(host: str, port: int, rid: str, *, rate: float = 0.0, timeout: float = 30.0) -> Pulled:
    """Read request ``rid``'s KV cache from the prefill server at ``host:port``."""
    began = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(f"PULL {rid}\n".encode("ascii"))
            posted = time.monotonic()
            status = _read_exact(sock, 1)
            if status != b"K":
                raise TransferError(f"the prefill side does not hold request {rid}")
            (head_len,) = HEADER.unpack(_read_exact(sock, HEADER.size))
            if head_len > MAX_HEADER:
                raise TransferError(f"KV header of {head_len} bytes")
            meta = KVMeta.from_json(_read_exact(sock, head_len))
            (length,) = LENGTH.unpack(_read_exact(sock, LENGTH.size))
            if length != meta.nbytes or length > MAX_PAYLOAD:
                raise TransferError(f"KV payload of {length} bytes, the shape says {meta.nbytes}")
            payload = _read_exact(sock, length, Throttle(rate))
            done = time.monotonic()
            try:
                sock.sendall(DONE)
                notified = True
            except OSError:
                notified = False
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise TransferError(f"KV transfer from {host}:{port} failed: {err}") from None
    return Pulled(meta, payload, posted - began, done - posted, notified)
