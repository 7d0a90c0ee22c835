"""Hostile and careless clients against every listener the project runs: the sidecar, the node
agent and the admission webhook, each the real CLI in a child process.

The child starts with a file limit (``RLIMIT_NOFILE``) of :data:`START_FILES`; once it listens
the limit is lowered to :data:`FILES` under it (as a smaller ``ulimit -n`` would be, or
descriptors taken by something else), so the connection cap it fitted at start no longer fits
and the flood runs it out of descriptors. Two waves of :data:`WAVE` connections each, more than
the file limit, half sending half a request header and then nothing, half sending one request
and then idling on the kept-alive connection (for the webhook: half never starting the TLS
handshake). Throughout, a normal client scrapes ``/metrics`` on a new connection every
:data:`SCRAPE_EVERY_S`: each answer must come within a second. Then: every attacking connection
was closed by the server within its timeout (:data:`TIMEOUT`) and some slack, the child wrote
at most :data:`MAX_LOG_LINES` log lines (one says it ran out of descriptors, one that it
recovered), its CPU stayed near idle, and once the attack stops it serves new clients as
before. Loopback only; every loop is bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import resource
import selectors
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.metrics import metric_value
from support.paths import ROOT, TRACE
from support.tls import Pki

START_FILES = 256
FILES = 96
WAVE = 160
WAVES = 2
TIMEOUT = 1.0
# How late after its timeout a connection may be closed on a loaded 2-core CI machine.
SLACK = 2.0
SCRAPE_EVERY_S = 0.25
MAX_LOG_LINES = 12
# Child CPU seconds per second of attack.
MAX_CPU_SHARE = 0.25
_LISTEN = re.compile(r"listening on 127\.0\.0\.1:(\d+)")
_LIMITS = [
    f"--web.read-header-timeout={TIMEOUT:g}s",
    f"--web.idle-timeout={TIMEOUT:g}s",
    "--log.format=json",
]
_SIDECAR = [
    "--web.listen-address=127.0.0.1:0",
    f"--gpu.replay-file={TRACE}",
    "--engine.url=http://127.0.0.1:9/metrics",  # nothing listens: the engine is unreachable
    "--no-collector.tokenizer",
    "--no-collector.process",
]
_NODE_AGENT = [
    "--web.listen-address=127.0.0.1:0",
    f"--gpu.replay-file={TRACE}",
    "--collector.podresources",
    "--podresources.interval=1s",
    "--podresources.deadline=500ms",
    "--no-collector.engine",
    "--no-collector.tokenizer",
    "--no-collector.process",
    "--no-collector.model",
]


class Child:
    """The CLI with a file limit, its log lines counted."""

    def __init__(self, argv: list[str]) -> None:
        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (START_FILES, START_FILES))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli", *argv],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=limit,  # noqa: PLW1509 - the test process starts no threads before it
        )
        self.lines: list[str] = []
        self.port = 0
        seen = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line)
                if (found := _LISTEN.search(line)) and not self.port:
                    self.port = int(found.group(1))
                    seen.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + 30
        while not seen.wait(0.1):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.lines

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def messages(self, since: int = 0) -> list[str]:
        """The log lines' messages; a line that is not one (a traceback) fails the test."""
        out = []
        for line in self.lines[since:]:
            try:
                out.append(json.loads(line)["msg"])
            except ValueError:
                raise AssertionError(f"not a log line: {''.join(self.lines)}") from None
        return out

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@dataclass
class Attacker:
    sock: socket.socket
    opened: float
    closed: float | None = None


@dataclass
class Target:
    argv: list[str]
    tls: ssl.SSLContext | None = None
    scrapes: list[tuple[int, float]] = field(default_factory=list)

    def get(self, port: int, path: str) -> tuple[int, bytes]:
        conn: http.client.HTTPConnection
        if self.tls is not None:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=self.tls, timeout=1)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def scrape(self, port: int) -> str:
        """/metrics on a new connection, as Prometheus after a reconnect; within a second."""
        start = time.monotonic()
        try:
            status, body = self.get(port, "/metrics")
        except OSError as err:
            took = time.monotonic() - start
            raise AssertionError(f"/metrics failed after {took:.2f}s: {err}") from None
        took = time.monotonic() - start
        self.scrapes.append((status, took))
        assert status == 200 and took < 1.0, (status, took)
        return body.decode()


def connect(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    sock.connect_ex(("127.0.0.1", port))
    return sock


def idle_tls(port: int, context: ssl.SSLContext, count: int) -> list[Attacker]:
    """``count`` TLS connections that make one request and then idle, kept alive."""
    out = []
    for _ in range(count):
        sock = context.wrap_socket(
            socket.create_connection(("127.0.0.1", port), timeout=1), server_hostname="127.0.0.1"
        )
        sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sock.setblocking(False)
        out.append(Attacker(sock, time.monotonic()))
    return out


def open_wave(port: int, tls: bool) -> list[Attacker]:
    """WAVE connections: half slow (half a request header; with TLS half a ClientHello, or
    nothing), half idle (one complete request, then nothing on the kept-alive connection)."""
    socks = [connect(port) for _ in range(WAVE)]
    time.sleep(0.05)  # the kernel completes the connects (into the backlog past the accepts)
    for i, sock in enumerate(socks):
        if tls:
            payload = b"\x16\x03\x01\x00\x05\x01\x00" if i % 2 else b""  # a ClientHello's start
        elif i % 2:
            payload = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-"
        else:
            payload = b"GET /-/healthy HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        with contextlib.suppress(OSError):  # refused or reset already
            sock.send(payload)
    now = time.monotonic()
    return [Attacker(sock, now) for sock in socks]


class Watcher:
    """Records when the server closes each attacking connection (EOF or reset)."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.attackers: list[Attacker] = []

    def add(self, attackers: list[Attacker]) -> None:
        for attacker in attackers:
            self.selector.register(attacker.sock, selectors.EVENT_READ, attacker)
        self.attackers += attackers

    def poll(self, seconds: float) -> None:
        """Watch for ``seconds``, or until every connection is closed."""
        end = time.monotonic() + seconds
        while self.selector.get_map() and (left := end - time.monotonic()) > 0:
            for key, _ in self.selector.select(timeout=min(left, 0.02)):
                attacker: Attacker = key.data
                try:
                    data = attacker.sock.recv(65536)
                except (BlockingIOError, ssl.SSLWantReadError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    attacker.closed = time.monotonic()
                    self.selector.unregister(attacker.sock)
        if not self.selector.get_map():
            time.sleep(max(0.0, end - time.monotonic()))

    def close(self) -> None:
        self.selector.close()
        for attacker in self.attackers:
            attacker.sock.close()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


def attack(target: Target) -> None:
    child = Child([*target.argv, *_LIMITS])
    watcher = Watcher()
    try:
        target.scrape(child.port)
        resource.prlimit(child.proc.pid, resource.RLIMIT_NOFILE, (FILES, FILES))
        lines, cpu, start = len(child.lines), child.cpu(), time.monotonic()
        if target.tls is not None:  # idle ones that finished a handshake and a request
            watcher.add(idle_tls(child.port, target.tls, 20))
        for _ in range(WAVES):
            watcher.add(open_wave(child.port, target.tls is not None))
            wave_end = time.monotonic() + TIMEOUT * 1.5
            while time.monotonic() < wave_end:
                target.scrape(child.port)
                watcher.poll(SCRAPE_EVERY_S)
        watcher.poll(TIMEOUT + SLACK)
        wall, used = time.monotonic() - start, child.cpu() - cpu
        attackers = watcher.attackers
        late = [a.closed - a.opened if a.closed else None for a in attackers]
        held = [t for t in late if t is None or t > TIMEOUT + SLACK]
        assert not held, f"{len(held)} of {len(attackers)} connections held: {held[:5]}"
        assert used < MAX_CPU_SHARE * wall, f"{used:.2f} CPU seconds in {wall:.1f}s"
        # recovered: new clients are served as before, nothing is held
        for _ in range(5):
            assert target.get(child.port, "/-/healthy")[0] == 200
        deadline = time.monotonic() + 2
        while (
            metric_value(text := target.scrape(child.port), "inference_exporter_http_connections")
            != 1
        ):
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
        closed = "inference_exporter_http_connections_closed_total"
        for reason in ("header_timeout", "evicted"):
            assert (metric_value(text, closed, {"reason": reason}) or 0) > 0, reason
        refused = "inference_exporter_http_connections_refused_total"
        assert (metric_value(text, refused, {"reason": "out_of_files"}) or 0) >= 1
        # the shortage said once, and its end once (no accept fails for a while)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            m.startswith("accepts succeed again") for m in child.messages(lines)
        ):
            time.sleep(0.1)
        messages = child.messages(lines)
        assert sum(m.startswith("out of file descriptors") for m in messages) == 1, messages
        assert sum(m.startswith("accepts succeed again") for m in messages) == 1, messages
        assert len(messages) <= MAX_LOG_LINES, messages
    finally:
        watcher.close()
        child.close()


def test_sidecar_survives_a_flood_of_slow_and_idle_connections() -> None:
    attack(Target(_SIDECAR))


def test_node_agent_survives_a_flood_of_slow_and_idle_connections(tmp_path: Path) -> None:
    attack(Target([*_NODE_AGENT, f"--podresources.socket={tmp_path / 'kubelet.sock'}"]))


def test_webhook_survives_a_flood_of_slow_and_idle_connections(pki: Pki, tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text(
        f"tls_server_config:\n  cert_file: {tmp_path}/server.crt\n"
        f"  key_file: {tmp_path}/server.key\n"
    )
    argv = [
        "webhook",
        "--web.listen-address=127.0.0.1:0",
        f"--web.config.file={config}",
        "--review.timeout=1s",
    ]
    attack(Target(argv, tls=pki.client()))
