"""The real CLI process, started on a loopback port with its log captured."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from support.paths import ROOT

_LISTEN = re.compile(r"listening on (127\.0\.0\.1|\[::1\]):(\d+)")


class ExporterProcess:
    """A running ``inference-bottleneck-exporter`` with its log captured."""

    def __init__(
        self, args: list[str], env: dict[str, str] | None = None, *, module: str = "exporter.cli"
    ) -> None:
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--log.format", "json", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            cwd=ROOT,
        )
        self.logs: list[dict[str, str]] = []
        self._port: int | None = None
        self._host = "127.0.0.1"
        self._seen = threading.Event()
        self._reader = threading.Thread(target=self._read_logs, daemon=True)
        self._reader.start()

    def _read_logs(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                entry = {"level": "raw", "msg": line.rstrip()}
            self.logs.append(entry)
            match = _LISTEN.search(entry.get("msg", ""))
            if match and self._port is None:
                self._host = match.group(1)
                self._port = int(match.group(2))
                self._seen.set()

    @property
    def base(self) -> str:
        if not self._seen.wait(30):
            raise AssertionError(f"exporter did not report its address; logs: {self.logs}")
        return f"http://{self._host}:{self._port}"

    def get(
        self, path: str, headers: dict[str, str] | None = None, timeout: float = 10.0
    ) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"exporter exited {self.proc.returncode}: {self.logs}")
            try:
                if self.get("/-/ready", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"not ready after {timeout}s; logs: {self.logs}")

    def wait_for(self, check: Callable[[], bool], timeout: float = 20.0, step: float = 0.1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"exporter exited {self.proc.returncode}: {self.logs}")
            time.sleep(step)
        raise AssertionError(f"condition not met in {timeout}s; logs: {self.logs[-10:]}")

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> float:
        """Send ``sig`` and wait; returns seconds until exit."""
        start = time.monotonic()
        self.proc.send_signal(sig)
        self.proc.wait(timeout)
        took = time.monotonic() - start
        self._reader.join(5)  # the last log lines, up to EOF
        return took

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
