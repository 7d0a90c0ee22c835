"""The reference engine as a subprocess on a free loopback port, for tests."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from exporter.lab.processes import child_pythonpath, stop_process

LISTEN = re.compile(r"listening on (http://\S+)")


class Engine:
    def __init__(self, log: Path, *args: str) -> None:
        self.log = log
        # Where the engine writes its model's description (--model-dir), if it was asked to.
        self.model_dir = (
            Path(args[args.index("--model-dir") + 1]) if "--model-dir" in args else None
        )
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter.lab.refengine", "--port", "0", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin"},
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            match = LISTEN.search(log.read_text(errors="replace"))
            if match:
                self.url = match.group(1)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"engine did not start:\n{log.read_text(errors='replace')}")

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 30
    ) -> tuple[int, bytes]:
        data = (
            None
            if body is None
            else (body if isinstance(body, bytes) else json.dumps(body).encode())
        )
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as err:
            return int(err.code), err.read()

    def stop(self) -> float:
        start = time.monotonic()
        stop_process(self.proc, 20)
        self._log.close()
        return time.monotonic() - start
