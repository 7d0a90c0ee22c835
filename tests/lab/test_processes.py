"""The launcher of Prometheus and Alertmanager (:mod:`exporter.lab.processes`)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

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
