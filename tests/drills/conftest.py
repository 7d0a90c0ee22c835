"""Drill fixtures: the tools every drill needs, and the drill report from the session's results.

The report goes to ``build/drills/drills.md`` (ignored by git), so a test run never changes a
tracked file; ``make drills`` and ``make drills-slow`` copy it to ``docs/drills.md`` on purpose.
It holds this run's speed and, from the committed ``docs/drills.md``, the other one's.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator

import pytest
from drills.harness import (
    DisaggResult,
    DrillResult,
    dump_results,
    has_gpu,
    machine,
    slowdown,
    speed,
)
from drills.report import Session, save, write
from drills.scenarios import CPU_SCENARIOS
from support.paths import ROOT

from exporter.lab.processes import find_binary

REPORT = ROOT / "build" / "drills" / "drills.md"
# The matrix's time counts from the session's start: the disaggregated drills run first.
SESSION_BEGAN, SESSION_WHEN = time.monotonic(), time.time()
PUBLISHED = ROOT / "docs" / "drills.md"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without an NVIDIA GPU the GPU drills are deselected, not skipped: they cannot run
    here whatever is installed (``bench/gpu/run.sh`` runs them on a GPU machine), and a CI
    run reports them as deselected rather than as a missing tool. With ``DRILL_SLOWDOWN``
    the third-party engines' drills are deselected too: the slowdown is the reference
    engine's flag, they run at their own speed only."""
    try:
        factor = slowdown()
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None
    drop = set()
    if not has_gpu():
        drop.add("test_gpu_drill")
    if factor > 1.0:
        drop.add("test_external_drill")
    keep = [item for item in items if getattr(item, "originalname", "") not in drop]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep


@pytest.fixture(scope="session")
def drill_tools() -> None:
    """Prometheus, Alertmanager, torch and tokenizers: a drill fails (never skips) without."""
    missing = [
        what
        for what, found in (
            ("prometheus (make tools)", find_binary("prometheus")),
            ("alertmanager (make tools)", find_binary("alertmanager", "prometheus-alertmanager")),
            ("torch (make install-dev)", importlib.util.find_spec("torch")),
            ("tokenizers (make install-dev)", importlib.util.find_spec("tokenizers")),
        )
        if not found
    ]
    if missing:
        pytest.fail("drills need " + ", ".join(missing))


@pytest.fixture(scope="session")
def external_tools() -> None:
    """llama-server and PyTriton in the lab's cache: a drill fails (never skips) without."""
    from exporter.lab import thirdparty  # noqa: PLC0415

    missing = [
        f"{what} at {path} (make thirdparty)"
        for what, path in (
            ("llama-server", thirdparty.llama_server_binary()),
            ("PyTriton", thirdparty.pytriton_python()),
        )
        if not path.exists()
    ]
    if missing:
        pytest.fail("third-party drills need " + ", ".join(missing))


@pytest.fixture(scope="session")
def disagg_results() -> dict[str, DisaggResult]:
    """The disaggregated drills' results by scenario, for the report."""
    return {}


@pytest.fixture(scope="session")
def drill_results(disagg_results: dict[str, DisaggResult]) -> Iterator[dict[str, DrillResult]]:
    """Results by scenario; writes the report (with the disaggregated drills that ran) when
    the whole CPU matrix has run."""
    results: dict[str, DrillResult] = {}
    began = SESSION_BEGAN
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(SESSION_WHEN))
    yield results
    dump_results(results)
    factor = slowdown()
    session = Session(
        machine=machine(),
        total_s=time.monotonic() - began,
        when=when,
        factor=factor,
        results=results,
        disagg=disagg_results,
    )
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    # Every run's results for `python -m drills.report` to render again; a run of a few drills
    # beside the whole matrix's, which it leaves alone.
    whole = all(s.name in results for s in CPU_SCENARIOS)
    save(session, REPORT.parent / f"results-{speed(factor)}{'' if whole else '-part'}.json")
    if whole:
        write(REPORT, session, previous=PUBLISHED.read_text("utf-8") if PUBLISHED.exists() else "")
