"""The process collector against fake psutil processes, and once against a real child."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from prometheus_client import CollectorRegistry
from support.clock import FakeClock
from support.metrics import registry_of

from exporter.collectors import process as process_module
from exporter.collectors.process import MAX_NAMES, MAX_PROCESSES, ProcessCollector, short_name
from exporter.collectors.shared_state import EnginePids

CPU = "inference_engine_process_cpu_seconds_total"
COUNT = "inference_engine_processes"
HOTTEST = "inference_engine_hottest_thread_cpu_ratio"
SELF_PID = 4242


class FakeProcess:
    """The part of psutil.Process the collector uses; ``fail`` maps a method to its error."""

    def __init__(
        self,
        pid: int,
        cmdline: list[str],
        *,
        name: str = "python3",
        user: float = 0.0,
        system: float = 0.0,
        threads: dict[int, tuple[float, float]] | None = None,
        created: float = 100.0,
    ) -> None:
        self.pid = pid
        self.cmd = cmdline
        self.comm = name
        self.user = user
        self.system = system
        self.thread_times = threads or {}
        self.created = created
        self.fail: dict[str, Exception] = {}

    def _check(self, method: str) -> None:
        if method in self.fail:
            raise self.fail[method]

    def create_time(self) -> float:
        self._check("create_time")
        return self.created

    def cmdline(self) -> list[str]:
        self._check("cmdline")
        return self.cmd

    def name(self) -> str:
        self._check("name")
        return self.comm

    def cpu_times(self) -> SimpleNamespace:
        self._check("cpu_times")
        return SimpleNamespace(user=self.user, system=self.system, children_user=9.0)

    def threads(self) -> list[SimpleNamespace]:
        self._check("threads")
        return [
            SimpleNamespace(id=tid, user_time=user, system_time=system)
            for tid, (user, system) in self.thread_times.items()
        ]


class FakeProcesses:
    """What ``psutil.process_iter`` would list; tests edit ``procs`` between scrapes."""

    def __init__(self, *procs: FakeProcess) -> None:
        self.procs = list(procs)
        self.fail: Exception | None = None

    def __call__(self) -> Iterator[Any]:
        yield from self.procs
        if self.fail is not None:
            raise self.fail


def scrape(collector: ProcessCollector) -> CollectorRegistry:
    collection = collector.collect()
    assert (collection.success, collection.error) == (True, "")
    return registry_of(collection)


def make(
    procs: FakeProcesses, match: str = "vllm", clock: FakeClock | None = None
) -> ProcessCollector:
    return ProcessCollector(
        match, clock=clock or FakeClock(), process_iter=procs, self_pid=SELF_PID
    )


def cpu_of(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(CPU, {"process": name})


# --- naming --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cmdline", "name", "expected"),
    [
        (["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"], "python3", "vllm"),
        (["python3.11", "-u", "-m", "sglang.launch_server", "--port", "1"], "python3", "sglang"),
        (["python", "-uOmvllm.entrypoints.cli"], "python", "vllm"),
        (["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m"], "vllm", "vllm"),
        (["python3", "-W", "ignore", "-X", "dev", "server.py", "--x"], "python3", "server"),
        (["python3", "-Wignore", "/app/pkg/__main__.py"], "python3", "pkg"),
        (["python3", "-c", "import vllm"], "python3", "python"),
        (["python3", "-uc", "import vllm"], "python3", "python"),
        (["pypy3", "--check-hash-based-pycs", "always", "run.pyz"], "pypy3", "run"),
        (["python3"], "python3", "python"),
        (["python3", "-"], "python3", "python"),
        (
            ["/opt/tritonserver/bin/tritonserver", "--model-repository=/m"],
            "tritonserver",
            "tritonserver",
        ),
        (
            ["text-generation-launcher", "--model-id", "x"],
            "text-generation",
            "text-generation-launcher",
        ),
        (["VLLM::EngineCore"], "VLLM::EngineCor", "VLLM::EngineCore"),
        ([], "llama-server", "llama-server"),
        ([], "python3.12", "python"),
        (["/usr/bin/" + "x" * 100], "x", "x" * 64),
        ([""], "", "unknown"),
    ],
)
def test_short_name(cmdline: list[str], name: str, expected: str) -> None:
    assert short_name(cmdline, name) == expected


# --- matching ------------------------------------------------------------------------------


def test_matches_joined_cmdline_and_falls_back_to_name() -> None:
    denied = FakeProcess(13, ["ignored"], name="vllm-front", user=4.0)
    denied.fail["cmdline"] = psutil.AccessDenied(13)
    procs = FakeProcesses(
        FakeProcess(10, ["python3", "-m", "vllm.entrypoints.cli.main", "serve"], user=1.0),
        FakeProcess(11, ["python3", "other.py"], name="vllm", user=2.0),  # name is not matched
        FakeProcess(12, [], name="vllm-zombie", user=3.0),
        denied,
        FakeProcess(14, ["sleep", "infinity"], name="sleep", user=5.0),
    )
    registry = scrape(make(procs, match="cli.main serve|vllm-"))
    assert registry.get_sample_value(COUNT) == 3.0
    assert cpu_of(registry, "vllm") == 1.0
    assert cpu_of(registry, "vllm-zombie") == 3.0
    assert cpu_of(registry, "vllm-front") == 4.0
    assert cpu_of(registry, "other") is None
    assert cpu_of(registry, "sleep") is None


def test_never_matches_itself() -> None:
    procs = FakeProcesses(
        FakeProcess(SELF_PID, ["inference-bottleneck-exporter", "--process.match", "vllm"]),
        FakeProcess(7, ["vllm", "serve"], user=2.5),
    )
    registry = scrape(make(procs))
    assert registry.get_sample_value(COUNT) == 1.0
    assert cpu_of(registry, "vllm") == 2.5
    assert cpu_of(registry, "inference-bottleneck-exporter") is None


def test_matched_pids_are_handed_to_the_gpu_collector() -> None:
    board = EnginePids()
    procs = FakeProcesses(
        FakeProcess(SELF_PID, ["inference-bottleneck-exporter"]),
        FakeProcess(7, ["vllm", "serve"]),
        FakeProcess(8, ["VLLM::EngineCore"]),
        FakeProcess(9, ["bash"]),
    )
    collector = ProcessCollector(
        "vllm|VLLM", clock=FakeClock(), process_iter=procs, self_pid=SELF_PID, pids=board
    )
    assert board.get() is None  # not looked yet: unknown, not "no engine"
    scrape(collector)
    assert board.get() == frozenset({7, 8})
    procs.procs.pop(1)  # the API server exited
    scrape(collector)
    assert board.get() == frozenset({8})


def test_default_self_pid_is_this_process() -> None:
    me = psutil.Process()
    collector = ProcessCollector(".", process_iter=lambda: [me])
    assert scrape(collector).get_sample_value(COUNT) == 0.0


def test_no_match_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    procs = FakeProcesses(FakeProcess(3, ["bash"], name="bash"))
    collector = make(procs)
    with caplog.at_level(logging.INFO, logger="exporter.collectors.process"):
        for _ in range(3):
            registry = scrape(collector)
            assert registry.get_sample_value(COUNT) == 0.0
            assert registry.get_sample_value(CPU, {"process": "bash"}) is None
            assert registry.get_sample_value(HOTTEST) is None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "no engine processes are visible" in messages[0]
    assert "shareProcessNamespace" in messages[0]


def test_no_log_once_engine_was_seen(caplog: pytest.LogCaptureFixture) -> None:
    procs = FakeProcesses(FakeProcess(3, ["vllm"], user=1.0))
    collector = make(procs)
    scrape(collector)
    procs.procs.clear()
    with caplog.at_level(logging.INFO, logger="exporter.collectors.process"):
        registry = scrape(collector)
    assert registry.get_sample_value(COUNT) == 0.0
    assert cpu_of(registry, "vllm") == 1.0
    assert caplog.records == []


# --- CPU counter -----------------------------------------------------------------------------


def test_sums_per_short_name() -> None:
    procs = FakeProcesses(
        FakeProcess(
            20, ["/usr/bin/python3", "/usr/local/bin/vllm", "serve"], user=10.0, system=2.5
        ),
        FakeProcess(21, ["python3", "-m", "vllm.worker"], user=3.25, system=0.25),
        FakeProcess(22, ["VLLM::EngineCore"], user=40.0, system=1.0),
    )
    registry = scrape(make(procs, match="vllm|VLLM::"))
    assert registry.get_sample_value(COUNT) == 3.0
    assert cpu_of(registry, "vllm") == 16.0  # children's CPU is not counted
    assert cpu_of(registry, "VLLM::EngineCore") == 41.0


def test_monotonic_across_exit_and_pid_reuse() -> None:
    a = FakeProcess(30, ["vllm", "a"], user=10.0)
    b = FakeProcess(31, ["vllm", "b"], user=5.0)
    procs = FakeProcesses(a, b)
    collector = make(procs)
    assert cpu_of(scrape(collector), "vllm") == 15.0

    a.user = 12.0
    procs.procs = [a]  # b exited after 5 s of CPU
    assert cpu_of(scrape(collector), "vllm") == 17.0

    # PID 31 comes back as a new process: its 1 s is added, b's 5 s stay.
    procs.procs = [a, FakeProcess(31, ["vllm", "c"], user=1.0, created=200.0)]
    registry = scrape(collector)
    assert registry.get_sample_value(COUNT) == 2.0
    assert cpu_of(registry, "vllm") == 18.0

    procs.procs = []
    registry = scrape(collector)
    assert registry.get_sample_value(COUNT) == 0.0
    assert cpu_of(registry, "vllm") == 18.0


def test_process_that_stops_matching_keeps_its_cpu() -> None:
    proc = FakeProcess(32, ["vllm"], user=4.0)
    procs = FakeProcesses(proc)
    collector = make(procs)
    scrape(collector)
    proc.cmd, proc.user = ["bash"], 6.0
    registry = scrape(collector)
    assert registry.get_sample_value(COUNT) == 0.0
    assert cpu_of(registry, "vllm") == 4.0


def test_renamed_process_keeps_cpu_under_old_name() -> None:
    proc = FakeProcess(40, ["python3", "-c", "from multiprocessing.spawn import spawn_main"])
    proc.user = 2.0
    procs = FakeProcesses(proc)
    collector = make(procs, match="spawn_main|VLLM")
    assert cpu_of(scrape(collector), "python") == 2.0

    proc.cmd, proc.user = ["VLLM::EngineCore"], 7.0  # setproctitle after start-up
    registry = scrape(collector)
    assert cpu_of(registry, "python") == 2.0
    assert cpu_of(registry, "VLLM::EngineCore") == 5.0

    proc.user = 9.0
    registry = scrape(collector)
    assert cpu_of(registry, "python") == 2.0
    assert cpu_of(registry, "VLLM::EngineCore") == 7.0


def test_cpu_never_goes_backwards_for_one_process() -> None:
    proc = FakeProcess(41, ["vllm"], user=3.0)
    procs = FakeProcesses(proc)
    collector = make(procs)
    scrape(collector)
    proc.user = 2.5
    assert cpu_of(scrape(collector), "vllm") == 3.0


@pytest.mark.parametrize("method", ["cpu_times", "cmdline_and_name"])
def test_access_denied_keeps_last_value_without_double_counting(method: str) -> None:
    proc = FakeProcess(50, ["vllm"], name="vllm", user=6.0)
    other = FakeProcess(51, ["vllm", "x"], user=1.0)
    procs = FakeProcesses(proc, other)
    collector = make(procs)
    assert cpu_of(scrape(collector), "vllm") == 7.0

    proc.user = 8.0
    methods = ["cmdline", "name"] if method == "cmdline_and_name" else [method]
    for name in methods:
        proc.fail[name] = psutil.AccessDenied(50)
    assert cpu_of(scrape(collector), "vllm") == 7.0

    proc.fail.clear()
    assert cpu_of(scrape(collector), "vllm") == 9.0


@pytest.mark.parametrize(
    ("method", "error"),
    [
        ("create_time", psutil.NoSuchProcess(60)),
        ("cmdline", psutil.NoSuchProcess(60)),
        ("cmdline", psutil.ZombieProcess(60)),
        ("cpu_times", psutil.NoSuchProcess(60)),
        ("cpu_times", psutil.ZombieProcess(60)),
    ],
)
def test_vanishing_process_is_skipped(method: str, error: Exception) -> None:
    proc = FakeProcess(60, ["vllm"], user=3.0)
    procs = FakeProcesses(proc, FakeProcess(61, ["vllm", "y"], user=1.0))
    collector = make(procs)
    assert cpu_of(scrape(collector), "vllm") == 4.0

    proc.user = 5.0
    proc.fail[method] = error
    registry = scrape(collector)
    assert cpu_of(registry, "vllm") == 4.0  # its 3 s are remembered, not its unseen 2 s


def test_access_denied_on_first_sight_is_skipped() -> None:
    proc = FakeProcess(62, ["vllm"], user=3.0)
    proc.fail["cpu_times"] = psutil.AccessDenied(62)
    registry = scrape(make(FakeProcesses(proc)))
    assert registry.get_sample_value(COUNT) == 1.0
    assert cpu_of(registry, "vllm") is None


def test_failing_threads_still_count_cpu() -> None:
    proc = FakeProcess(63, ["vllm"], user=3.0, threads={1: (3.0, 0.0)})
    proc.fail["threads"] = psutil.AccessDenied(63)
    clock = FakeClock()
    collector = make(FakeProcesses(proc), clock=clock)
    scrape(collector)
    clock.now += 1.0
    registry = scrape(collector)
    assert cpu_of(registry, "vllm") == 3.0
    assert registry.get_sample_value(HOTTEST) is None


def test_listing_failure_is_unsuccessful() -> None:
    procs = FakeProcesses(FakeProcess(70, ["vllm"], user=1.0))
    procs.fail = psutil.AccessDenied(msg="/proc unreadable")
    collection = make(procs).collect()
    assert collection.success is False
    assert collection.error.startswith("listing processes:")
    assert collection.metrics == []


def test_caps_processes_and_prefers_followed_ones(caplog: pytest.LogCaptureFixture) -> None:
    procs = FakeProcesses(
        *(FakeProcess(1000 + i, ["vllm"], user=1.0) for i in range(MAX_PROCESSES + 6))
    )
    collector = make(procs)
    with caplog.at_level(logging.INFO, logger="exporter.collectors.process"):
        registry = scrape(collector)
        scrape(collector)
    assert registry.get_sample_value(COUNT) == MAX_PROCESSES + 6
    assert cpu_of(registry, "vllm") == float(MAX_PROCESSES)
    assert len(caplog.records) == 1

    # Lower PIDs appear: the followed processes keep their places, so nothing is counted twice.
    procs.procs[:0] = [FakeProcess(i, ["vllm"], user=100.0) for i in range(1, 4)]
    assert cpu_of(scrape(collector), "vllm") == float(MAX_PROCESSES)


def test_distinct_names_are_capped() -> None:
    procs = FakeProcesses(
        *(FakeProcess(i, [f"vllm-{i}"], user=1.0) for i in range(1, MAX_NAMES + 4))
    )
    registry = scrape(make(procs))
    assert cpu_of(registry, "vllm-1") == 1.0
    assert cpu_of(registry, f"vllm-{MAX_NAMES}") == 1.0
    assert cpu_of(registry, f"vllm-{MAX_NAMES + 1}") is None
    assert cpu_of(registry, "other") == 3.0


# --- hottest thread --------------------------------------------------------------------------


def test_hottest_thread_ratio_is_exact() -> None:
    api = FakeProcess(80, ["vllm", "serve"], threads={80: (10.0, 1.0), 81: (2.0, 0.0)})
    core = FakeProcess(90, ["VLLM::EngineCore"], threads={90: (50.0, 5.0), 91: (1.0, 1.0)})
    clock = FakeClock()
    collector = make(FakeProcesses(api, core), match="vllm|VLLM", clock=clock)
    assert scrape(collector).get_sample_value(HOTTEST) is None

    clock.now += 2.0
    api.thread_times = {80: (11.25, 1.25), 81: (2.5, 0.0)}  # 1.5 s of 2 s
    core.thread_times = {90: (50.5, 5.0), 91: (1.0, 1.0), 92: (9.0, 0.0)}  # 92 is new
    assert scrape(collector).get_sample_value(HOTTEST) == 0.75


def test_hottest_thread_ratio_is_capped_at_one_and_skips_reused_ids() -> None:
    proc = FakeProcess(81, ["vllm"], threads={1: (5.0, 0.0), 2: (0.0, 0.0)})
    clock = FakeClock()
    collector = make(FakeProcesses(proc), clock=clock)
    scrape(collector)
    clock.now += 1.0
    proc.thread_times = {1: (0.5, 0.0), 2: (1.0, 0.25)}  # 1 reused; 2 slightly over 1 s
    assert scrape(collector).get_sample_value(HOTTEST) == 1.0


def test_idle_threads_give_zero() -> None:
    proc = FakeProcess(82, ["vllm"], threads={1: (5.0, 0.0)})
    clock = FakeClock()
    collector = make(FakeProcesses(proc), clock=clock)
    scrape(collector)
    clock.now += 1.0
    assert scrape(collector).get_sample_value(HOTTEST) == 0.0


def test_thread_of_a_new_process_with_a_reused_pid_is_not_compared() -> None:
    clock = FakeClock()
    procs = FakeProcesses(FakeProcess(83, ["vllm"], threads={83: (1.0, 0.0)}))
    collector = make(procs, clock=clock)
    scrape(collector)
    clock.now += 1.0
    procs.procs = [FakeProcess(83, ["vllm"], threads={83: (1.5, 0.0)}, created=300.0)]
    assert scrape(collector).get_sample_value(HOTTEST) is None


def test_window_rules() -> None:
    proc = FakeProcess(84, ["vllm"], threads={1: (0.0, 0.0)})
    clock = FakeClock(1000.0)
    collector = make(FakeProcesses(proc), clock=clock)

    def read(at: float, busy: float) -> float | None:
        clock.now = at
        proc.thread_times = {1: (busy, 0.0)}
        return scrape(collector).get_sample_value(HOTTEST)

    assert read(1000.0, 0.0) is None  # first read: no window
    assert read(1000.5, 0.5) is None  # younger than min_window
    assert read(1001.0, 0.5) == 0.5  # against 1000.0: 0.5 s of 1 s
    # Against the newest read at least 1 s old (1000.5, busy 0.5), not the oldest.
    assert read(1001.75, 1.25) == 0.6
    # Closer than a quarter window to the last kept read (1001.75): compared, but not kept.
    assert read(1001.8, 1.3) == pytest.approx(0.8 / 1.3)
    # So the baseline here is 1001.75 (1.1 s old), not 1001.8 (1.05 s old).
    assert read(1002.85, 1.8) == pytest.approx(0.55 / 1.1)


def test_min_window_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="min_window"):
        ProcessCollector("x", min_window=-1.0)


def test_threads_per_process_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_module, "MAX_THREADS", 2)
    threads = {1: (1.0, 0.0), 2: (5.0, 0.0), 3: (3.0, 0.0)}
    proc = FakeProcess(85, ["vllm"], threads=threads)
    clock = FakeClock()
    collector = make(FakeProcesses(proc), clock=clock)
    scrape(collector)
    clock.now += 1.0
    # Thread 1 had the least CPU and was not kept, so its 1 s burst is not seen.
    proc.thread_times = {1: (2.0, 0.0), 2: (5.5, 0.0), 3: (3.25, 0.0)}
    assert scrape(collector).get_sample_value(HOTTEST) == 0.5


# --- a real process ------------------------------------------------------------------------

_BUSY_CHILD = """
import threading, time
marker = {marker!r}
def spin():
    end = time.monotonic() + 2.5
    while time.monotonic() < end:
        pass
worker = threading.Thread(target=spin)
worker.start()
worker.join()
"""


def test_real_busy_child_has_a_hot_thread() -> None:
    marker = f"ibe-busy-{uuid.uuid4().hex}"
    child = subprocess.Popen([sys.executable, "-c", _BUSY_CHILD.format(marker=marker)])
    try:
        # Wait for the spinning thread: it must be in the first read to be compared.
        deadline = time.monotonic() + 10.0
        while psutil.Process(child.pid).num_threads() < 2:
            assert time.monotonic() < deadline, "child never started its thread"
            assert child.poll() is None, "child exited early"
            time.sleep(0.01)
        collector = ProcessCollector(marker)
        first = scrape(collector)
        assert first.get_sample_value(COUNT) == 1.0
        assert first.get_sample_value(HOTTEST) is None
        time.sleep(1.05)
        registry = scrape(collector)
        assert registry.get_sample_value(COUNT) == 1.0
        ratio = registry.get_sample_value(HOTTEST)
        assert ratio is not None
        # One spinning thread gets most of a core, less on a busy 2-core CI machine (0.43 was
        # seen under load); an idle child stays near 0.
        assert ratio > 0.25
        cpu = cpu_of(registry, "python")
        assert cpu is not None
        assert cpu > 0.25
    finally:
        child.kill()
        child.wait(10)


def test_background_scans_serve_scrapes_without_listing() -> None:
    calls = {"n": 0}
    procs = FakeProcesses(FakeProcess(20, ["vllm", "serve"], user=10.0, system=2.0))

    def counting() -> Iterator[Any]:
        calls["n"] += 1
        yield from procs()

    collector = ProcessCollector("vllm", process_iter=counting, self_pid=SELF_PID, interval=3600.0)
    assert collector.collect().error == "first process scan still running"
    collector.start()
    try:
        assert collector.wait_ready(5)
        for _ in range(5):
            registry = scrape(collector)
        assert cpu_of(registry, "vllm") == 12.0
        assert calls["n"] == 1  # five scrapes, one listing of the node's processes
    finally:
        collector.stop(2)
