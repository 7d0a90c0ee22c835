"""Child processes of the lab and the tests: start, wait for, stop; and the one launcher of
Prometheus and Alertmanager.

Every child is bound to 127.0.0.1, has its log in a work directory, is waited for with a
deadline (a child that exits early fails the wait with its log's tail) and is stopped by
:func:`stop_process` (SIGTERM, then SIGKILL). :func:`start_prometheus` and
:func:`start_alertmanager` are how the demo, the drills and every test start the real servers;
:class:`PagerDutyCapture` stands in for PagerDuty's Events API v2. No torch is imported here.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import yaml


class StackError(RuntimeError):
    """A component did not start; the message names it and points at its log."""


def free_port(preferred: int = 0) -> int:
    """``preferred`` when it is free on 127.0.0.1, else a free port the kernel picks."""
    for port in (preferred, 0) if preferred else (0,):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise StackError("no free TCP port on 127.0.0.1")


def find_binary(*names: str) -> str | None:
    """The first of ``names`` on ``PATH`` (Debian names Alertmanager
    ``prometheus-alertmanager``)."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def stop_process(
    proc: subprocess.Popen[Any], timeout: float = 10.0, sig: int = signal.SIGTERM
) -> int:
    """Ask ``proc`` to stop with ``sig``, wait up to ``timeout`` seconds, then kill it; returns
    its exit code. The one way every child of the lab and the tests is stopped."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return int(proc.returncode)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


@dataclass
class Child:
    """One child process with its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.proc, timeout)
        # A child is the leader of its own session (spawn): what it started and left behind
        # (Triton's server and its backend stubs, when PyTriton's process is killed) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait for the block (a teardown) to finish, then act as before: a
    second Ctrl-C while the lab stops its children must not leave the rest running. Only the
    main thread handles signals; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    old = {sig: signal.signal(sig, lambda n, _f: held.append(n)) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[0])


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# util-linux's setpriv sets the parent-death signal and execs the command (same PID): a
# child of the lab gets SIGTERM when the process that started it dies, however it dies
# (SIGKILL included), instead of living on in its own session.
_SETPRIV = shutil.which("setpriv")


def _die_with_parent(cmd: Sequence[str]) -> list[str]:
    """``cmd`` with the parent-death signal set, when setpriv is there and the caller is the
    main thread (the signal follows the thread that started the child, not the process: a
    child started by a short-lived thread would die with it)."""
    if _SETPRIV is None or threading.current_thread() is not threading.main_thread():
        return list(cmd)
    return [_SETPRIV, "--pdeathsig", "TERM", "--", *cmd]


def package_root() -> str:
    """The directory that holds this ``exporter`` package (for children's PYTHONPATH)."""
    import exporter  # noqa: PLC0415

    return str(Path(exporter.__file__).resolve().parent.parent)


def child_pythonpath() -> str:
    path = os.environ.get("PYTHONPATH", "")
    return package_root() + (os.pathsep + path if path else "")


def spawn(name: str, cmd: Sequence[str], workdir: Path, env: dict[str, str] | None = None) -> Child:
    """Start ``cmd`` in ``workdir`` with its output in ``<workdir>/<name>.log``; this package
    is importable in the child whether or not it is installed. The child leads a session of
    its own (Ctrl-C reaches the lab, which stops its children in order) and gets SIGTERM
    when the lab dies without stopping it (``_die_with_parent``)."""
    log_path = workdir / f"{name}.log"
    pythonpath = child_pythonpath()
    log = log_path.open("wb")
    proc = subprocess.Popen(
        _die_with_parent(cmd),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath, **(env or {})},
        start_new_session=True,  # Ctrl-C reaches the parent only, which stops us in order
    )
    return Child(name, proc, log_path, log)


def wait_until(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    *,
    child: Child | None = None,
    step: float = 0.2,
) -> None:
    """Poll ``check`` every ``step`` seconds until it is true; :class:`StackError` after
    ``timeout`` seconds, or as soon as ``child`` (the process being waited for) exits. A check
    that raises OSError or ValueError (a refused connection, a half-written file) is false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and not child.alive():
            raise StackError(
                f"{child.name} exited (code {child.proc.returncode}) before {what}; "
                f"log {child.log_path}:\n{child.log_tail()}"
            )
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        time.sleep(step)
    where = f"; log {child.log_path}" if child is not None else ""
    name = f"{child.name}: " if child is not None else ""
    raise StackError(f"{name}no {what} after {timeout:g}s{where}")


def log_match(child: Child, pattern: re.Pattern[str]) -> re.Match[str] | None:
    try:
        text = child.log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return pattern.search(text)


# --- PagerDuty capture ---------------------------------------------------------------------------


@dataclass
class Page:
    at: float  # time.monotonic() when received
    path: str
    body: dict[str, Any]

    @property
    def alertname(self) -> str:
        details = self.body.get("payload", {}).get("custom_details", {})
        return str(details.get("alertname", ""))

    @property
    def action(self) -> str:
        return str(self.body.get("event_action", ""))

    @property
    def receiver(self) -> str:
        return self.path.strip("/")


def reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
    """Answer a request of one of the lab's HTTP stand-ins."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class LocalServer:
    """An HTTP server on 127.0.0.1 (a port the kernel picks) in a daemon thread of this
    process: the lab's stand-ins for PagerDuty and kube-state-metrics."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], name: str) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self.url = f"http://{self.address}"
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class PagerDutyCapture:
    """A local stand-in for the PagerDuty Events API v2: records every event it is sent."""

    def __init__(self) -> None:
        self.pages: list[Page] = []
        self._lock = threading.Lock()
        capture = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(min(length, 1 << 20))
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    self.send_response(400)
                    self.end_headers()
                    return
                with capture._lock:
                    capture.pages.append(Page(time.monotonic(), self.path, body))
                answer = {
                    "status": "success",
                    "message": "Event processed",
                    "dedup_key": body.get("dedup_key"),
                }
                reply(self, 202, json.dumps(answer).encode(), "application/json")

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._http = LocalServer(Handler, "pagerduty-capture")
        self.url = self._http.url

    def snapshot(self) -> list[Page]:
        with self._lock:
            return list(self.pages)

    def events(self, path: str | None = None, alertname: str | None = None) -> list[dict[str, Any]]:
        """The bodies received, on ``path`` (a receiver's URL path) and for ``alertname``."""
        return [
            page.body
            for page in self.snapshot()
            if (path is None or page.path == path)
            and (alertname is None or page.alertname == alertname)
        ]

    def close(self) -> None:
        self._http.close()


# --- Prometheus and Alertmanager -----------------------------------------------------------------


@dataclass
class Server:
    """A running Prometheus or Alertmanager: the child and its URL."""

    child: Child
    url: str

    def stop(self) -> None:
        self.child.stop()

    def get_json(self, path: str, **params: str) -> Any:
        """A JSON API answer (``path`` like ``/api/v1/query``); raises on an HTTP error."""
        query = "?" + urllib.parse.urlencode(params) if params else ""
        status, body = http_get(self.url + path + query)
        if status != 200:
            raise StackError(f"{self.child.name} {path}: HTTP {status}: {body[:200]!r}")
        return json.loads(body)

    def reload(self, timeout: float = 30.0) -> None:
        """Prometheus: load the configuration and rule files again (SIGHUP), and wait until it
        has. Rule groups whose rules are unchanged keep their state (pending alerts stay
        pending); :class:`StackError` when the reload fails or takes longer than ``timeout``."""
        before = self._last_config_time()
        # The time Prometheus reports has whole seconds: a reload in the second of the last
        # would look like none.
        with contextlib.suppress(ValueError):
            last = datetime.datetime.fromisoformat(before.replace("Z", "+00:00")).timestamp()
            time.sleep(max(0.0, last + 1.05 - time.time()))
        self.child.proc.send_signal(signal.SIGHUP)
        wait_until(
            lambda: self._last_config_time() not in ("", before),
            timeout,
            "the reload of its configuration",
            child=self.child,
        )

    def _last_config_time(self) -> str:
        """When Prometheus last loaded its configuration successfully ("" while it failed)."""
        try:
            info = self.get_json("/api/v1/status/runtimeinfo")["data"]
        except StackError:
            return ""
        return str(info["lastConfigTime"]) if info.get("reloadConfigSuccess") else ""

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector; :class:`StackError` for any other result type."""
        data = self.get_json("/api/v1/query", query=expr)["data"]
        if data["resultType"] != "vector":
            raise StackError(f"{expr}: a {data['resultType']}, not a vector")
        result: list[dict[str, Any]] = data["result"]
        return result


def _write_config(path: Path, config: Mapping[str, Any] | str) -> None:
    text = config if isinstance(config, str) else yaml.safe_dump(dict(config), sort_keys=False)
    path.write_text(text, encoding="utf-8")


_ADDRESS_IN_USE = re.compile(r"address already in use", re.IGNORECASE)
_PORT_TRIES = 3


def _ready(url: str) -> Callable[[], bool]:
    return lambda: http_get(url + "/-/ready", 2)[0] == 200


def _start_server(
    name: str, binary: str, args: Sequence[str], *, workdir: Path, port: int, timeout: float
) -> Server:
    """The server on ``port`` if free, else on one the kernel picks. A picked port can be taken
    between the pick and the child's bind (tests run side by side, ``pytest -n``): a child
    that exits with "address already in use" is started again on a new pick."""
    for attempt in range(1, _PORT_TRIES + 1):
        chosen = free_port(port)
        child = spawn(name, [binary, *args, f"--web.listen-address=127.0.0.1:{chosen}"], workdir)
        url = f"http://127.0.0.1:{chosen}"
        try:
            wait_until(_ready(url), timeout, "readiness", child=child)
        except StackError:
            child.stop()
            if attempt < _PORT_TRIES and log_match(child, _ADDRESS_IN_USE):
                continue
            raise
        except BaseException:
            child.stop()
            raise
        return Server(child, url)
    raise AssertionError("unreachable: the last try returns or raises")


def start_prometheus(
    workdir: Path,
    config: Mapping[str, Any] | str,
    *,
    port: int = 0,
    args: Sequence[str] = ("--log.level=warn",),
    timeout: float = 60.0,
    name: str = "prometheus",
    data: Path | None = None,
) -> Server:
    """Prometheus with ``config`` (a mapping or YAML text), ready; its TSDB in ``data``
    (default: a new directory in ``workdir``, which also holds its config and log).

    Raises :class:`StackError` when the binary is missing or the server does not get ready."""
    binary = find_binary("prometheus")
    if binary is None:
        raise StackError("prometheus not found on PATH (make tools installs it)")
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{name}.yml"
    _write_config(path, config)
    if data is None:
        data = workdir / f"{name}-data"
    data.mkdir(exist_ok=True)
    flags = [f"--config.file={path}", f"--storage.tsdb.path={data}", *args]
    return _start_server(name, binary, flags, workdir=workdir, port=port, timeout=timeout)


def start_alertmanager(
    workdir: Path,
    config: Mapping[str, Any] | str,
    *,
    port: int = 0,
    timeout: float = 30.0,
    name: str = "alertmanager",
) -> Server:
    """Alertmanager (Debian's ``prometheus-alertmanager`` or ``alertmanager``) with ``config``,
    clustering off, ready. Raises :class:`StackError` as :func:`start_prometheus` does."""
    binary = find_binary("alertmanager", "prometheus-alertmanager")
    if binary is None:
        raise StackError("alertmanager not found on PATH (make tools installs it)")
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{name}.yml"
    _write_config(path, config)
    data = workdir / f"{name}-data"
    data.mkdir(exist_ok=True)
    flags = [
        f"--config.file={path}",
        f"--storage.path={data}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    return _start_server(name, binary, flags, workdir=workdir, port=port, timeout=timeout)


# What the exporter logs once it listens (the port the kernel picked for ``:0``).
EXPORTER_LISTEN = re.compile(r"listening on (127\.0\.0\.1|\[::1\]):(\d+)")


def start_exporter(
    name: str, args: Sequence[str], workdir: Path, *, timeout: float = 30.0
) -> tuple[Child, str]:
    """The exporter's CLI (a sidecar or a node agent) with ``args``, listening and ready: the
    child and its URL. Raises :class:`StackError` (the child stopped) when it is not."""
    child = spawn(name, [sys.executable, "-m", "exporter.cli", *args], workdir)
    try:
        wait_until(
            lambda: log_match(child, EXPORTER_LISTEN) is not None,
            timeout,
            "listen address",
            child=child,
        )
        match = log_match(child, EXPORTER_LISTEN)
        assert match is not None
        url = f"http://{match.group(1)}:{match.group(2)}"
        wait_until(
            lambda: http_get(url + "/-/ready", 2)[0] == 200, timeout, "readiness", child=child
        )
    except BaseException:
        child.stop()
        raise
    return child, url


def fast_sidecar_flags(
    *,
    gpu_poll: str = "1s",
    engine_poll: str = "500ms",
    engine_timeout: str = "500ms",
    probe: str = "1s",
    scrape_timeout: str = "800ms",
) -> list[str]:
    """The sidecar's polls at the fastest useful rates, as the tests, the drills and the demo
    run it (the defaults poll every 3-15 s, too slow to watch an alert fire in a minute)."""
    return [
        "--gpu.poll-interval",
        gpu_poll,
        "--engine.poll-interval",
        engine_poll,
        "--engine.timeout",
        engine_timeout,
        "--tokenizer.probe-interval",
        probe,
        "--scrape.timeout",
        scrape_timeout,
    ]
