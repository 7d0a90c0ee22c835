"""The launcher of Prometheus and Alertmanager, and how every child of the lab ends
(:mod:`exporter.lab.processes`)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from exporter.lab import processes


def test_a_port_taken_after_the_pick_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process binds the picked port before Alertmanager does (tests side by side):
    Alertmanager exits with "address already in use" and starts again on a new pick."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        picks: list[int] = []
        real = processes.free_port

        def pick(preferred: int = 0) -> int:
            port = busy if not picks else real(preferred)
            picks.append(port)
            return port

        monkeypatch.setattr(processes, "free_port", pick)
        server = processes.start_alertmanager(
            tmp_path, {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
        )
        try:
            assert picks[0] == busy and len(picks) == 2
            assert server.url == f"http://127.0.0.1:{picks[1]}"
            assert server.get_json("/api/v2/status")["cluster"]["status"] == "disabled"
        finally:
            server.stop()


def test_a_child_that_fails_otherwise_is_not_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad configuration is not a taken port: one try, the error names the child."""
    picks: list[int] = []
    real = processes.free_port

    def pick(preferred: int = 0) -> int:
        picks.append(real(preferred))
        return picks[-1]

    monkeypatch.setattr(processes, "free_port", pick)
    with pytest.raises(processes.StackError, match="alertmanager exited"):
        processes.start_alertmanager(tmp_path, "route: [not a route\n")
    assert len(picks) == 1


# A lab that starts a child (spawn, as the Stack does), says its PID, then waits to be killed.
LAB = """
import sys, time
from pathlib import Path
from exporter.lab.processes import spawn
child = spawn("sleeper", ["sleep", "120"], Path(sys.argv[1]))
print(child.proc.pid, flush=True)
time.sleep(120)
"""


def test_a_child_dies_with_a_lab_killed_without_stopping_it(tmp_path: Path) -> None:
    """SIGKILL to the lab (a test's timeout, the OOM killer) leaves no child running in its
    own session: the parent-death signal ends it."""
    lab = subprocess.Popen(
        [sys.executable, "-c", LAB, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": processes.child_pythonpath()},
    )
    assert lab.stdout is not None
    child = psutil.Process(int(lab.stdout.readline()))
    try:
        assert child.ppid() == lab.pid
        # setpriv has set the signal once it has become the command
        deadline = time.monotonic() + 10
        while child.cmdline()[:1] != ["sleep"] and time.monotonic() < deadline:
            time.sleep(0.05)
        lab.kill()
        lab.wait(10)
        gone, alive = psutil.wait_procs([child], timeout=10)
        assert gone and not alive
    finally:
        processes.stop_process(lab, 5)
        lab.stdout.close()
        with contextlib.suppress(psutil.Error):
            child.kill()


def test_a_signal_during_a_teardown_waits_for_it_to_finish() -> None:
    """Ctrl-C and SIGTERM inside ``uninterrupted`` (a Stack stopping its children) act only
    once the block is done, as they would have."""
    done = []
    # raise_signal delivers to this (the main) thread and runs the Python handler before it
    # returns; os.kill on the process may land on one of pytest-xdist's threads, whose handler
    # then runs whenever the main thread next looks (it once ran only after the block).
    # "As before" is whatever handler was there: the test sets Python's own for Ctrl-C, since
    # an earlier test in the same worker may have left another (the fresh-clone CI check saw
    # no KeyboardInterrupt twice, the raise_signal fix in between).
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda n, _f: seen.append(n))
    try:
        with pytest.raises(KeyboardInterrupt), processes.uninterrupted():
            signal.raise_signal(signal.SIGINT)
            done.append("stopped")
        assert done == ["stopped"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with processes.uninterrupted():
            signal.raise_signal(signal.SIGTERM)
            assert seen == []
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def test_prometheus_reloads_its_rules(tmp_path: Path) -> None:
    """A drill rewrites its rule files once it has measured its engine (its objectives) and has
    Prometheus load them: the new rules answer, and the old one is gone."""
    rules = tmp_path / "rules.yaml"

    def write(record: str) -> None:
        group = {"name": "g", "interval": "1s", "rules": [{"record": record, "expr": "vector(1)"}]}
        rules.write_text(yaml.safe_dump({"groups": [group]}), encoding="utf-8")

    write("before_reload")
    server = processes.start_prometheus(tmp_path, {"rule_files": [str(rules)]})
    try:
        write("after_reload")
        server.reload(timeout=20)
        loaded = server.get_json("/api/v1/rules")["data"]["groups"]
        assert [r["name"] for g in loaded for r in g["rules"]] == ["after_reload"]
        rules.write_text("groups: [{name: g, rules: [{record: x, expr: 'sum('}]}]\n", "utf-8")
        with pytest.raises(processes.StackError, match="reload"):
            server.reload(timeout=3)  # a broken rule file: Prometheus keeps the old rules
    finally:
        server.stop()
