"""Parsing of <procfs>/stat and <procfs>/softirqs against fixtures in the kernel's formats."""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import pytest

from exporter.backends.procfs import (
    MODES,
    CpuTimes,
    ProcfsError,
    read_softirqs,
    read_stat,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "proc"


def write_proc(tmp_path: Path, **files: str) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="ascii", newline="")
    return tmp_path


def test_fixtures_match_their_generator(tmp_path: Path) -> None:
    generator = runpy.run_path(str(FIXTURES / "make_fixtures.py"), run_name="make_fixtures")
    generator["write"](tmp_path)
    expected = {
        str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
    }
    committed = {
        str(p.relative_to(FIXTURES)): p.read_bytes()
        for p in FIXTURES.rglob("*")
        if p.is_file() and p.name != "make_fixtures.py" and "__pycache__" not in p.parts
    }
    assert committed == expected, "run tests/fixtures/proc/make_fixtures.py"


def test_two_cpu_aggregate_in_seconds() -> None:
    stat = read_stat(FIXTURES / "two-cpu", clk_tck=100)
    # cpu  233457 1000 86000 4705678 5000 40 10000 200 800 0  (guest 800 is inside user)
    assert stat.aggregate == CpuTimes(
        user=2334.57,
        nice=10.0,
        system=860.0,
        idle=47056.78,
        iowait=50.0,
        irq=0.4,
        softirq=100.0,
        steal=2.0,
    )
    assert list(stat.aggregate.by_mode()) == list(MODES)


def test_two_cpu_per_cpu() -> None:
    stat = read_stat(FIXTURES / "two-cpu", clk_tck=100)
    assert sorted(stat.per_cpu) == [0, 1]
    # cpu1 110001 211 40322 2360000 1544 23 7655 80 300 0
    assert stat.per_cpu[1] == CpuTimes(
        user=1100.01,
        nice=2.11,
        system=403.22,
        idle=23600.0,
        iowait=15.44,
        irq=0.23,
        softirq=76.55,
        steal=0.8,
    )
    assert stat.per_cpu[0].softirq == 23.45


def test_clk_tck_defaults_to_user_hz() -> None:
    stat = read_stat(FIXTURES / "two-cpu")
    assert stat.aggregate.user == 233457 / os.sysconf("SC_CLK_TCK")


def test_clk_tck_must_be_positive() -> None:
    with pytest.raises(ValueError, match="clk_tck"):
        read_stat(FIXTURES / "two-cpu", clk_tck=0)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # 2.4: user nice system idle
        ("100 2 30 400", (1.0, 0.02, 0.3, 4.0, 0.0, 0.0, 0.0, 0.0)),
        # 2.6.0 - 2.6.10: + iowait irq softirq
        ("100 2 30 400 5 6 7", (1.0, 0.02, 0.3, 4.0, 0.05, 0.06, 0.07, 0.0)),
        # 2.6.11: + steal
        ("100 2 30 400 5 6 7 8", (1.0, 0.02, 0.3, 4.0, 0.05, 0.06, 0.07, 0.08)),
        # a future kernel with an eleventh field: ignored like guest and guest_nice
        ("100 2 30 400 5 6 7 8 9 10 11", (1.0, 0.02, 0.3, 4.0, 0.05, 0.06, 0.07, 0.08)),
    ],
)
def test_old_and_new_kernels(tmp_path: Path, line: str, expected: tuple[float, ...]) -> None:
    proc = write_proc(tmp_path, stat=f"cpu  {line}\ncpu0 {line}\nctxt 1\n")
    stat = read_stat(proc, clk_tck=100)
    assert stat.aggregate == CpuTimes(*expected)
    assert stat.per_cpu == {0: CpuTimes(*expected)}


def test_softirqs_summed_over_cpus() -> None:
    softirqs = read_softirqs(FIXTURES / "two-cpu")
    assert softirqs.possible_cpus == 2
    assert softirqs.counts == {
        "HI": 1,
        "TIMER": 812345 + 798765,
        "NET_TX": 12 + 34,
        "NET_RX": 45678 + 123456,
        "BLOCK": 23456 + 345,
        "IRQ_POLL": 0,
        "TASKLET": 56 + 78,
        "SCHED": 654321 + 612345,
        "HRTIMER": 3,
        "RCU": 432100 + 456789,
    }


def test_offline_cpus_absent_from_stat_but_counted_in_softirqs() -> None:
    stat = read_stat(FIXTURES / "offline-cpu", clk_tck=100)
    assert sorted(stat.per_cpu) == [0, 1, 2, 4, 6, 7]
    softirqs = read_softirqs(FIXTURES / "offline-cpu")
    assert softirqs.possible_cpus == 8
    # NET_RX: 21000 18500 30250 4000 25125 3500 19000 22625 (CPU3 and CPU5 offline)
    assert softirqs.counts["NET_RX"] == 144000


def test_many_cpu() -> None:
    stat = read_stat(FIXTURES / "many-cpu", clk_tck=100)
    assert sorted(stat.per_cpu) == list(range(96))
    # Three days at 100 ticks a second on every CPU.
    assert all(t.total == pytest.approx(259200.0) for t in stat.per_cpu.values())
    assert stat.aggregate.total == pytest.approx(96 * 259200.0)
    assert read_softirqs(FIXTURES / "many-cpu").possible_cpus == 96


def test_truncated_stat() -> None:
    with pytest.raises(ProcfsError, match=r"truncated/stat: truncated: last line 'cpu1 ") as info:
        read_stat(FIXTURES / "truncated", clk_tck=100)
    assert info.value.path == FIXTURES / "truncated" / "stat"


def test_missing_softirqs() -> None:
    with pytest.raises(ProcfsError, match=r"truncated/softirqs: cannot read: No such file"):
        read_softirqs(FIXTURES / "truncated")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty file"),
        ("cpu0 1 2 3 4\n", "no aggregate 'cpu' line"),
        ("cpu  1 2 3 4\nctxt 5\n", "no 'cpuN' lines"),
        ("cpu  1 2 3 4\ncpu0 1 2 3\n", "line 2: 3 CPU time fields, expected at least 4"),
        ("cpu  1 2 3 4\ncpu0 1 2 x 4\n", "line 2: 'x' is not a count"),
        ("cpu  1 2 3 4\ncpu0 1 2 -3 4\n", "line 2: '-3' is not a count"),
        ("cpu  1 2 3 4\ncpux 1 2 3 4\n", "line 2: unexpected line name 'cpux'"),
        ("cpu  1 2 3 4\ncpu0 1 2 3 4\xe9\n", "not ASCII text at byte 25"),
    ],
)
def test_garbled_stat(tmp_path: Path, text: str, problem: str) -> None:
    (tmp_path / "stat").write_bytes(text.encode("latin-1"))
    with pytest.raises(ProcfsError) as info:
        read_stat(tmp_path, clk_tck=100)
    assert str(info.value) == f"{tmp_path / 'stat'}: {problem}"
    assert info.value.problem == problem


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("   CPU0  CPU1\n", "no softirq vectors after the header"),
        ("   CPU0  CPU1\nNET_RX: 1\n", "line 2: NET_RX has 1 counts for 2 CPUs"),
        ("   CPU0  CPU1\nNET_RX: 1 2 3\n", "line 2: NET_RX has 3 counts for 2 CPUs"),
        ("   CPU0  CPU1\nNET_RX 1 2\n", "line 2: expected 'VECTOR: counts', got 'NET_RX 1 2'"),
        ("   CPU0  CPU1\nNET_RX: 1 two\n", "line 2: 'two' is not a count"),
        ("HI: 1 2\n", "line 1: expected a header of CPUn columns, got 'HI: 1 2'"),
        ("   CPU0  CPU1\nHI: 1 2", "truncated: last line 'HI: 1 2' has no newline"),
    ],
)
def test_garbled_softirqs(tmp_path: Path, text: str, problem: str) -> None:
    proc = write_proc(tmp_path, softirqs=text)
    with pytest.raises(ProcfsError) as info:
        read_softirqs(proc)
    assert str(info.value) == f"{tmp_path / 'softirqs'}: {problem}"
