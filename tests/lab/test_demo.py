"""``demo``: everything starts, the view shows it, Ctrl-C stops every process it started."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from exporter.lab.processes import child_pythonpath, find_binary


def _started_by(workdir: Path) -> list[psutil.Process]:
    """Processes running in the demo's work directory or started with its configs."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.cwd() == str(workdir) or any(str(workdir) in a for a in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.timeout(200)
def test_demo_runs_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    if not (find_binary("prometheus") and find_binary("alertmanager", "prometheus-alertmanager")):
        pytest.fail("prometheus and alertmanager not found: run `make tools`")
    workdir = tmp_path / "demo"
    log = tmp_path / "demo.out"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "exporter.cli", "demo", "--inject", "softirq",
                "--plain", "--refresh", "1s", "--workdir", str(workdir), "--duration", "150s",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 150
        # The second block has rates (two samples of the sidecar).
        while time.monotonic() < deadline and " host CPU " not in log.read_text():
            assert proc.poll() is None, log.read_text()
            time.sleep(0.5)
        text = log.read_text()
        assert " host CPU " in text, text
        children = _started_by(workdir)
        assert len(children) >= 4, text  # engine, sidecar, Prometheus, Alertmanager
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text()
    assert proc.returncode == 0, text
    for needle in (
        "injected: softirq",
        " engine     http://127.0.0.1:",
        " sidecar    http://127.0.0.1:",
        " Prometheus http://127.0.0.1:",
        " Alertmanager http://127.0.0.1:",
        "replay of the 'starved' drill trace",
        " load       2 req/s offered",
        " host CPU   softirq",
        "stopped.",
        "requests: ",
    ):
        assert needle in text, f"{needle!r} missing from:\n{text}"
    gone = psutil.wait_procs(children, timeout=10)[1]
    assert not gone, [p.cmdline() for p in gone]
    assert not _started_by(workdir)
