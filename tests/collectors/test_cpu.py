"""The cpu collector against procfs fixtures, read back through a real CollectorRegistry."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from support.clock import FakeClock
from support.metrics import registry_of

from exporter.backends.procfs import MODES, CpuTimes
from exporter.collectors.cpu import CpuCollector, hottest_softirq_ratio

FIXTURES = Path(__file__).parent.parent / "fixtures" / "proc"
HOTTEST = "inference_cpu_softirq_hottest_core_ratio"


def use(proc: Path, fixture: str) -> None:
    """Make ``proc`` hold exactly the files of ``fixture``, like a procfs that moved on."""
    shutil.rmtree(proc, ignore_errors=True)
    shutil.copytree(FIXTURES / fixture, proc)


def test_two_cpu() -> None:
    collection = CpuCollector(FIXTURES / "two-cpu", clk_tck=100).collect()
    assert (collection.success, collection.error) == (True, "")
    registry = registry_of(collection)

    # cpu  233457 1000 86000 4705678 5000 40 10000 200 800 0, USER_HZ 100
    expected_seconds = {
        "user": 2334.57,
        "nice": 10.0,
        "system": 860.0,
        "idle": 47056.78,
        "iowait": 50.0,
        "irq": 0.4,
        "softirq": 100.0,
        "steal": 2.0,
    }
    for mode, seconds in expected_seconds.items():
        assert registry.get_sample_value("inference_cpu_seconds_total", {"mode": mode}) == seconds
    assert registry.get_sample_value("inference_cpu_seconds_total", {"mode": "guest"}) is None
    # The modes' sum in one series, for the softirq share's denominator.
    all_modes = registry.get_sample_value("inference_cpu_all_modes_seconds_total")
    assert all_modes == pytest.approx(sum(expected_seconds.values()))
    assert registry.get_sample_value("inference_cpu_online") == 2.0

    expected_softirqs = {
        "HI": 1,
        "TIMER": 1611110,
        "NET_TX": 46,
        "NET_RX": 169134,
        "BLOCK": 23801,
        "IRQ_POLL": 0,
        "TASKLET": 134,
        "SCHED": 1266666,
        "HRTIMER": 3,
        "RCU": 888889,
    }
    for vector, count in expected_softirqs.items():
        value = registry.get_sample_value("inference_softirqs_total", {"vector": vector})
        assert value == count
    # The first read has nothing to compare with.
    assert registry.get_sample_value(HOTTEST) is None


def test_family_names_and_types() -> None:
    collection = CpuCollector(FIXTURES / "two-cpu", clk_tck=100).collect()
    assert {(f.name, f.type) for f in collection.metrics} == {
        ("inference_cpu_seconds", "counter"),
        ("inference_cpu_all_modes_seconds", "counter"),
        ("inference_cpu_online", "gauge"),
        ("inference_softirqs", "counter"),
    }
    seconds = next(f for f in collection.metrics if f.name == "inference_cpu_seconds")
    assert [s.labels["mode"] for s in seconds.samples] == list(MODES)


def test_offline_cpus() -> None:
    registry = registry_of(CpuCollector(FIXTURES / "offline-cpu", clk_tck=100).collect())
    # cpu3 and cpu5 are offline: 6 cpuN lines out of 8 possible CPUs.
    assert registry.get_sample_value("inference_cpu_online") == 6.0
    # Offline CPUs keep their softirq columns, and their counts stay in the sum.
    assert registry.get_sample_value("inference_softirqs_total", {"vector": "NET_RX"}) == 144000


def test_hottest_core_between_many_cpu_snapshots(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    clock = FakeClock(1000.0)
    collector = CpuCollector(proc, clock=clock, clk_tck=100)

    use(proc, "many-cpu")
    assert registry_of(collector.collect()).get_sample_value(HOTTEST) is None

    use(proc, "many-cpu-later")
    clock.now = 1005.0
    collection = collector.collect()
    assert collection.success
    # cpu17:  30304 -> 30614 softirq ticks (+310); user +40, system +60, idle +90: +500 in all.
    # Every other core gains at most 5 softirq ticks of about 500.
    ratio = registry_of(collection).get_sample_value(HOTTEST)
    assert ratio == pytest.approx(310 / 500, rel=1e-9)


def test_hottest_core_needs_min_window(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    clock = FakeClock(1000.0)
    collector = CpuCollector(proc, clock=clock, clk_tck=100, min_window=1.0)

    use(proc, "many-cpu")
    collector.collect()

    use(proc, "many-cpu-later")
    clock.now = 1000.5
    assert registry_of(collector.collect()).get_sample_value(HOTTEST) is None

    # 1.2 s after the first read, 0.7 s after the second: compared with the first.
    clock.now = 1001.2
    ratio = registry_of(collector.collect()).get_sample_value(HOTTEST)
    assert ratio == pytest.approx(0.62, rel=1e-9)

    # 1.5 s later the newest read old enough is the one at 1000.5, with the same counters:
    # no CPU time passed, so there is no ratio.
    clock.now = 1002.7
    assert registry_of(collector.collect()).get_sample_value(HOTTEST) is None


def test_hottest_core_survives_fast_scrapes(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    clock = FakeClock(0.0)
    collector = CpuCollector(proc, clock=clock, clk_tck=100, min_window=1.0)
    use(proc, "many-cpu")
    # Scrapes every 10 ms for 3 s: the bounded history must still span a full window.
    for step in range(300):
        clock.now = step * 0.01
        if step == 150:
            use(proc, "many-cpu-later")
        ratio = registry_of(collector.collect()).get_sample_value(HOTTEST)
        if step < 100:
            assert ratio is None
        elif 150 <= step < 250:
            assert ratio == pytest.approx(0.62, rel=1e-9), step


def test_truncated(tmp_path: Path) -> None:
    collection = CpuCollector(FIXTURES / "truncated", clk_tck=100).collect()
    assert not collection.success
    assert collection.metrics == []
    stat, softirqs = collection.error.split("; ")
    assert stat.startswith(f"{FIXTURES / 'truncated' / 'stat'}: truncated: last line 'cpu1 ")
    assert softirqs.startswith(f"{FIXTURES / 'truncated' / 'softirqs'}: cannot read")


def test_truncated_stat_keeps_softirqs(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "truncated" / "stat", tmp_path / "stat")
    shutil.copy(FIXTURES / "two-cpu" / "softirqs", tmp_path / "softirqs")
    collection = CpuCollector(tmp_path, clk_tck=100).collect()
    assert not collection.success
    assert collection.error.startswith(f"{tmp_path / 'stat'}: truncated")
    registry = registry_of(collection)
    assert registry.get_sample_value("inference_softirqs_total", {"vector": "NET_RX"}) == 169134
    assert registry.get_sample_value("inference_cpu_online") is None


def test_missing_softirqs_keeps_cpu_metrics(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "two-cpu" / "stat", tmp_path / "stat")
    collection = CpuCollector(tmp_path, clk_tck=100).collect()
    assert not collection.success
    assert collection.error.startswith(f"{tmp_path / 'softirqs'}: cannot read")
    registry = registry_of(collection)
    assert registry.get_sample_value("inference_cpu_seconds_total", {"mode": "user"}) == 2334.57
    assert registry.get_sample_value("inference_cpu_online") == 2.0
    assert registry.get_sample_value("inference_softirqs_total", {"vector": "NET_RX"}) is None


def test_missing_procfs_never_raises(tmp_path: Path) -> None:
    collection = CpuCollector(tmp_path / "nowhere", clk_tck=100).collect()
    assert not collection.success
    assert "nowhere/stat: cannot read" in collection.error
    assert collection.metrics == []


def test_negative_min_window_is_refused() -> None:
    with pytest.raises(ValueError, match="min_window"):
        CpuCollector(FIXTURES / "two-cpu", min_window=-1.0)


def _times(softirq: float, idle: float, iowait: float = 0.0) -> CpuTimes:
    return CpuTimes(
        user=10.0,
        nice=0.0,
        system=5.0,
        idle=idle,
        iowait=iowait,
        irq=0.0,
        softirq=softirq,
        steal=0.0,
    )


def test_ratio_picks_the_hottest_core() -> None:
    before = {0: _times(1.0, 100.0), 1: _times(1.0, 100.0)}
    after = {0: _times(1.25, 100.75), 1: _times(1.5, 100.5)}
    assert hottest_softirq_ratio(before, after) == 0.5


def test_ratio_skips_hotplugged_cores() -> None:
    before = {0: _times(1.0, 100.0), 2: _times(1.0, 100.0)}
    # cpu1 came online, cpu2 went offline: only cpu0 is in both reads.
    after = {0: _times(1.25, 100.75), 1: _times(9.0, 100.0)}
    assert hottest_softirq_ratio(before, after) == 0.25
    assert hottest_softirq_ratio({2: before[2]}, {1: after[1]}) is None


def test_ratio_skips_cores_that_went_backwards() -> None:
    before = {0: _times(1.0, 100.0), 1: _times(5.0, 100.0)}
    after = {0: _times(1.25, 100.75), 1: _times(4.0, 101.0)}
    assert hottest_softirq_ratio(before, after) == 0.25
    # Total time going backwards (a counter reset) is skipped too.
    assert hottest_softirq_ratio({0: _times(1.0, 100.0)}, {0: _times(1.5, 50.0)}) is None


def test_ratio_tolerates_iowait_dropping() -> None:
    before = {0: _times(1.0, 100.0, iowait=2.0)}
    after = {0: _times(1.5, 101.0, iowait=1.75)}
    # Δsoftirq 0.5 / Δtotal (0.5 + 1.0 - 0.25)
    assert hottest_softirq_ratio(before, after) == 0.5 / 1.25


def test_ratio_absent_when_no_time_passed() -> None:
    same = {0: _times(1.0, 100.0), 1: _times(2.0, 100.0)}
    assert hottest_softirq_ratio(same, dict(same)) is None
    assert hottest_softirq_ratio({}, {}) is None


def test_ratio_is_at_most_one() -> None:
    before = {0: _times(1.0, 100.0, iowait=5.0)}
    after = {0: replace(before[0], softirq=2.0, iowait=4.5)}
    assert hottest_softirq_ratio(before, after) == 1.0
