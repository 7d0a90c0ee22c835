"""Collector ``process``: CPU of the engine's own processes and of its busiest thread.

Emits (see ``docs/metrics.md``)::

    inference_engine_processes                    processes whose command line matches
                                                  --process.match (the exporter excluded)
    inference_engine_process_cpu_seconds_total{process}
                                                  user + system CPU of the matched processes,
                                                  summed by short process name
    inference_engine_hottest_thread_cpu_ratio     CPU share of the single busiest thread of
                                                  all matched processes over the last window
                                                  (>= min_window); absent until one exists

Example (vLLM's API server pegging its event-loop thread, engine core busy on the GPU)::

    inference_engine_processes 2.0
    inference_engine_process_cpu_seconds_total{process="vllm"} 5321.4
    inference_engine_process_cpu_seconds_total{process="VLLM::EngineCore"} 8710.2
    inference_engine_hottest_thread_cpu_ratio 0.97

Which processes: every process the sidecar can see (in Kubernetes only with
``shareProcessNamespace: true`` on the pod) whose command line, joined with spaces, contains a
match of the regular expression (``re.search``); when the command line is empty or unreadable
(zombies, kernel threads) the process name is matched instead. The exporter never matches
itself. At most :data:`MAX_PROCESSES` matched processes are read per scrape (those already
followed first, then by PID) and at most :data:`MAX_THREADS` threads of each (the ones with the
most CPU time), so a misconfigured pattern costs a bounded scrape. The PIDs of every matched
process are handed to the ``nvml`` collector after each scan: they tell the engine's own share
of a shared GPU (:mod:`exporter.backends.pidns`).

The ``process`` label (:func:`short_name`) is low-cardinality by construction:

* a Python interpreter (``python``, ``python3.11``, ``pypy3``) is named after what it runs:
  the top-level package of ``-m`` (``python -m vllm.entrypoints.openai.api_server`` ->
  ``vllm``), else the script's file name without ``.py`` (console scripts such as
  ``/usr/bin/python3 /usr/local/bin/vllm serve`` -> ``vllm``), else ``python`` (``-c``,
  interactive, stdin);
* anything else is the base name of ``argv[0]`` (``/opt/tritonserver/bin/tritonserver`` ->
  ``tritonserver``; a title set with setproctitle such as ``VLLM::EngineCore`` stays as it is);
* an empty or unreadable command line falls back to the process name;
* names are cut to 64 characters, and after :data:`MAX_NAMES` distinct names every new one is
  counted as ``other``.

Counters stay monotonic: CPU of processes that exited (or stopped matching) is remembered per
name, a process whose name changes (setproctitle after fork) keeps the CPU it had under the old
name there, and a process that is only unreadable for one scrape keeps its last value. Per-process
psutil errors (gone, zombie, access denied) skip that process; only failing to list processes at
all makes the collector unsuccessful.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import psutil
from prometheus_client.metrics_core import Metric

from exporter import metrics as m
from exporter.collectors.base import BackgroundThread, Collection, Collector, WindowHistory
from exporter.collectors.shared_state import EnginePids, Shared
from exporter.config import Settings, flag, section
from exporter.engines import process_match
from exporter.priority import SCRAPES, no_pause

log = logging.getLogger(__name__)

MAX_PROCESSES = 64
MAX_THREADS = 256
MAX_NAMES = 32
OTHER = "other"
_MAX_NAME_LEN = 64


_PYTHON = re.compile(r"(?:python|pypy)(?:\d+(?:\.\d+)*)?[dmu]*")
_SCRIPT_SUFFIXES = (".py", ".pyc", ".pyz", ".pyw")

# (pid, create time): a PID reused by a new process is a new process.
_Key = tuple[int, float]
_ThreadKey = tuple[int, float, int]


@dataclass(frozen=True)
class ProcessOptions:
    """The flags of the ``process`` collector."""

    match: str = flag(
        "process.match",
        process_match(),
        "Regular expression matched against process command lines to find the engine "
        "(default: the processes of every supported engine; in Kubernetes the pod needs "
        "shareProcessNamespace: true).",
        kind="regex",
        metavar="REGEX",
    )


def short_name(cmdline: Sequence[str], name: str) -> str:
    """The ``process`` label for a process with this command line and process name."""
    if cmdline and cmdline[0].strip():
        exe = os.path.basename(cmdline[0].strip().rstrip("/"))
        label = _python_target(cmdline[1:]) if _PYTHON.fullmatch(exe) else exe
    else:
        label = "python" if _PYTHON.fullmatch(name) else name
    label = label.strip()[:_MAX_NAME_LEN]
    return label or "unknown"


def _python_target(args: Sequence[str]) -> str:
    """What a Python interpreter runs: ``-m`` package, script name, or ``python``."""
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            return _script_name(args[index + 1]) if index + 1 < len(args) else "python"
        if arg.startswith("--"):
            # --check-hash-based-pycs takes a value; other long options are flags.
            index += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        if arg == "-" or not arg.startswith("-"):
            return "python" if arg == "-" else _script_name(arg)
        # A cluster of short options such as -uOm: -c and -m end it, -W and -X take a value.
        for pos, option in enumerate(arg[1:], start=1):
            rest = arg[pos + 1 :]
            if option == "c":
                return "python"
            if option == "m":
                module = rest or (args[index + 1] if index + 1 < len(args) else "")
                return module.split(".")[0] or "python"
            if option in "WX":
                if not rest:
                    index += 1
                break
        index += 1
    return "python"


def _script_name(path: str) -> str:
    base = os.path.basename(path.rstrip("/"))
    for suffix in _SCRIPT_SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    if base == "__main__":
        # python path/to/pkg/__main__.py runs the package: name it after the package.
        base = os.path.basename(os.path.dirname(path.rstrip("/"))) or base
    return base or "python"


def hottest_thread_ratio(
    before: Mapping[_ThreadKey, float], after: Mapping[_ThreadKey, float], elapsed: float
) -> float | None:
    """Highest Δcpu / ``elapsed`` of any thread in both reads, capped at 1; None when none is.

    Threads whose CPU time went backwards (a reused thread ID) are skipped.
    """
    if elapsed <= 0:
        return None
    hottest: float | None = None
    for thread, now in after.items():
        then = before.get(thread)
        if then is None or now < then:
            continue
        ratio = min(1.0, (now - then) / elapsed)
        if hottest is None or ratio > hottest:
            hottest = ratio
    return hottest


@dataclass(frozen=True)
class _Reading:
    at: float
    threads: dict[_ThreadKey, float]


@dataclass
class _Followed:
    """A process counted in the CPU counter: its label, CPU when it got it, latest CPU."""

    label: str
    base: float
    last: float


@dataclass
class _Candidate:
    key: _Key
    proc: psutil.Process
    name: str


@dataclass
class _Scan:
    """One pass over the visible processes."""

    matched: list[_Candidate] = field(default_factory=list)
    # Followed processes still there but unreadable this time: they keep their last value.
    unreadable: set[_Key] = field(default_factory=set)
    cpu: dict[_Key, tuple[str, float]] = field(default_factory=dict)
    threads: dict[_ThreadKey, float] = field(default_factory=dict)


class ProcessCollector(Collector):
    """Lists processes through ``process_iter``.

    With ``interval`` set (as the exporter does), a background thread scans every ``interval``
    seconds and :meth:`collect` serves the latest scan: listing every process of the node
    costs milliseconds, too much for each scrape. Without it, each :meth:`collect` scans.
    """

    name = "process"

    def __init__(
        self,
        match: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        min_window: float = 1.0,
        process_iter: Callable[[], Iterable[psutil.Process]] = psutil.process_iter,
        self_pid: int | None = None,
        interval: float | None = None,
        pids: EnginePids | None = None,
    ) -> None:
        if min_window < 0:
            raise ValueError(f"min_window must not be negative, not {min_window}")
        self._pattern = re.compile(match)
        self._clock = clock
        self._min_window = min_window
        self._process_iter = process_iter
        self._self_pid = os.getpid() if self_pid is None else self_pid
        self._followed: dict[_Key, _Followed] = {}
        self._exited: dict[str, float] = {}
        # Every label ever emitted, in order of first sight; its series never disappears.
        self._labels: dict[str, None] = {}
        self._window: WindowHistory[dict[_ThreadKey, float]] = WindowHistory(min_window)
        self._ever_matched = False
        self._said_none = False
        self._said_capped = False
        # Overlapping scrapes must not interleave updates of the remembered CPU.
        self._lock = threading.Lock()
        self._interval = interval
        self.blocking = interval is None
        self._latest: Collection | None = None
        self._background = BackgroundThread()
        # Where the matched PIDs go for the nvml collector's per-process GPU shares.
        self._pids = pids

    def start(self) -> None:
        if self._interval is None:
            return
        self._background.start_thread(self._loop, "process-scan")

    def stop(self, timeout: float) -> None:
        self._background.stop_thread(timeout)

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._interval is not None and self._latest is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def _loop(self) -> None:
        assert self._interval is not None
        while True:
            self._latest = self.scan(pause=SCRAPES.step_aside)
            if self._background.stopping.wait(self._interval):
                return

    def collect(self) -> Collection:
        if self._interval is None:
            return self.scan()
        latest = self._latest
        if latest is None:
            return Collection(success=False, error="first process scan still running")
        return latest

    def scan(self, pause: Callable[[], None] = no_pause) -> Collection:
        """List, match and read the engine's processes now; ``pause`` is called before each
        process (the background scan passes :meth:`exporter.priority.ScrapeGate.step_aside`)."""
        with self._lock:
            try:
                scan = self._scan(pause)
            except (psutil.Error, OSError) as exc:
                return Collection(success=False, error=f"listing processes: {exc}")
            now = self._clock()
            if self._pids is not None:
                self._pids.publish(frozenset(c.key[0] for c in scan.matched))
            self._log_visibility(len(scan.matched))
            totals = self._update_cpu(scan)
            ratio = self._hottest_ratio(_Reading(now, scan.threads))
        return Collection(metrics=_families(len(scan.matched), totals, ratio))

    # --- reading ---------------------------------------------------------------------------

    def _scan(self, pause: Callable[[], None]) -> _Scan:
        scan = _Scan()
        for proc in self._process_iter():
            pause()
            if proc.pid == self._self_pid:
                continue
            candidate = self._match(proc, scan)
            if candidate is not None:
                scan.matched.append(candidate)
        # Followed processes first, so the cap never drops one and re-adds it later.
        considered = sorted(scan.matched, key=lambda c: (c.key not in self._followed, c.key))
        for candidate in considered[:MAX_PROCESSES]:
            pause()
            self._read(candidate, scan)
        return scan

    def _match(self, proc: psutil.Process, scan: _Scan) -> _Candidate | None:
        try:
            key = (proc.pid, proc.create_time())
        except psutil.Error:
            return None
        try:
            try:
                cmdline = proc.cmdline()
            except psutil.AccessDenied:
                cmdline = []
            name = "" if cmdline else proc.name()
        except psutil.NoSuchProcess:
            return None
        except psutil.Error:
            if key in self._followed:
                scan.unreadable.add(key)
            return None
        text = " ".join(cmdline) if cmdline else name
        if not self._pattern.search(text):
            return None
        return _Candidate(key, proc, short_name(cmdline, name))

    def _read(self, candidate: _Candidate, scan: _Scan) -> None:
        proc, key = candidate.proc, candidate.key
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            return
        except psutil.Error:
            if key in self._followed:
                scan.unreadable.add(key)
            return
        scan.cpu[key] = (candidate.name, times.user + times.system)
        try:
            threads = proc.threads()
        except psutil.Error:
            return
        busiest = sorted(threads, key=lambda t: t.user_time + t.system_time, reverse=True)
        for thread in busiest[:MAX_THREADS]:
            scan.threads[(*key, thread.id)] = thread.user_time + thread.system_time

    def _log_visibility(self, matched: int) -> None:
        if matched:
            self._ever_matched = True
            if matched > MAX_PROCESSES and not self._said_capped:
                self._said_capped = True
                log.info(
                    "%d processes match --process.match %r; reading CPU of %d of them only",
                    matched,
                    self._pattern.pattern,
                    MAX_PROCESSES,
                )
        elif not self._ever_matched and not self._said_none:
            self._said_none = True
            log.info(
                "no engine processes are visible (none matches --process.match %r); in "
                "Kubernetes the sidecar sees the engine only with shareProcessNamespace: true",
                self._pattern.pattern,
            )

    # --- state -----------------------------------------------------------------------------

    def _label(self, name: str) -> str:
        if name not in self._labels:
            if len(self._labels) >= MAX_NAMES:
                name = OTHER
            self._labels[name] = None
        return name

    def _retire(self, followed: _Followed) -> None:
        self._exited[followed.label] = (
            self._exited.get(followed.label, 0.0) + followed.last - followed.base
        )

    def _update_cpu(self, scan: _Scan) -> dict[str, float]:
        """Fold this scan into the remembered CPU; returns the counter value per label."""
        for key in list(self._followed):
            if key not in scan.cpu and key not in scan.unreadable:
                self._retire(self._followed.pop(key))
        for key, (name, read) in scan.cpu.items():
            label = self._label(name)
            followed = self._followed.get(key)
            if followed is None:
                # A newly seen process brings all its CPU so far: none of it was counted.
                self._followed[key] = _Followed(label, 0.0, read)
                continue
            cpu = max(read, followed.last)
            if followed.label != label:
                self._retire(followed)
                self._followed[key] = _Followed(label, followed.last, cpu)
            else:
                followed.last = cpu
        totals = {label: self._exited.get(label, 0.0) for label in self._labels}
        for followed in self._followed.values():
            totals[followed.label] += followed.last - followed.base
        return totals

    def _hottest_ratio(self, current: _Reading) -> float | None:
        """Compare ``current`` with the newest kept read old enough, then remember it."""
        baseline = self._window.push(current.at, current.threads)
        if baseline is None:
            return None
        at, threads = baseline
        return hottest_thread_ratio(threads, current.threads, current.at - at)


def _families(processes: int, totals: Mapping[str, float], ratio: float | None) -> list[Metric]:
    count = m.gauge("inference_engine_processes")
    count.add_metric([], processes)
    families: list[Metric] = [count]
    if totals:
        cpu = m.counter("inference_engine_process_cpu_seconds_total")
        for label in sorted(totals):
            cpu.add_metric([label], totals[label])
        families.append(cpu)
    if ratio is not None:
        hottest = m.gauge("inference_engine_hottest_thread_cpu_ratio")
        hottest.add_metric([], ratio)
        families.append(hottest)
    return families


# --- construction -----------------------------------------------------------------------------

# Seconds between scans of the node's processes in the exporter (listing every process of the
# node on each scrape cost ~7 ms).
SCAN_INTERVAL = 5.0


def check(settings: Settings) -> None:
    """Nothing to check across flags (the regex is checked when parsed)."""


def build(settings: Settings, shared: Shared) -> ProcessCollector:
    return ProcessCollector(
        section(ProcessOptions, settings).match, interval=SCAN_INTERVAL, pids=shared.engine_pids
    )
