"""Fixtures shared by every test; helpers to import live in :mod:`support`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from support.process import ExporterProcess


@pytest.fixture
def exporter_process() -> Iterator[Callable[..., ExporterProcess]]:
    started: list[ExporterProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ExporterProcess:
        proc = ExporterProcess(["--web.listen-address", "127.0.0.1:0", *args], env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()
