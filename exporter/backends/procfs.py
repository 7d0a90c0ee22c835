"""Read the node's CPU times and softirq counts from procfs.

Two files, both in the formats of ``fs/proc/stat.c`` and ``fs/proc/softirqs.c``:

``<procfs>/stat``
    ``cpu`` is the sum over every *possible* CPU (offline ones keep their past time in it),
    followed by one ``cpuN`` line per *online* CPU. Fields are in USER_HZ ticks: user, nice,
    system, idle, iowait, irq, softirq, steal, guest, guest_nice. Kernels before 2.6.11 print
    fewer fields (missing ones read as 0); guest and guest_nice are already counted in user
    and nice, so they are dropped here. The other lines (``intr``, ``ctxt``, ``btime``, ...)
    are not used.

``<procfs>/softirqs``
    A header with one ``CPUn`` column per possible CPU, then one row per vector
    (``NET_RX:`` followed by one count per column).

Nothing here knows Prometheus: the functions return dataclasses or raise :class:`ProcfsError`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

# user nice system idle: what every kernel since 2.4 prints on a cpu line.
_MIN_CPU_FIELDS = 4


class ProcfsError(ValueError):
    """A procfs file is missing, unreadable, truncated or not in the expected format."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclass(frozen=True)
class CpuTimes:
    """Time spent in each mode, in seconds, since boot."""

    user: float
    nice: float
    system: float
    idle: float
    iowait: float
    irq: float
    softirq: float
    steal: float

    @property
    def total(self) -> float:
        """All modes together: wall time the CPU(s) existed since boot."""
        return sum(self.by_mode().values())

    def by_mode(self) -> dict[str, float]:
        """Seconds keyed by mode name, in the order of :data:`MODES`."""
        return {
            "user": self.user,
            "nice": self.nice,
            "system": self.system,
            "idle": self.idle,
            "iowait": self.iowait,
            "irq": self.irq,
            "softirq": self.softirq,
            "steal": self.steal,
        }


@dataclass(frozen=True)
class CpuStat:
    """The CPU lines of ``<procfs>/stat``."""

    aggregate: CpuTimes
    per_cpu: dict[int, CpuTimes]  # online CPUs only, keyed by CPU number


@dataclass(frozen=True)
class Softirqs:
    """``<procfs>/softirqs`` summed over its columns."""

    possible_cpus: int
    counts: dict[str, int]  # vector (NET_RX, TIMER, ...) -> invocations on all CPUs


def clock_ticks() -> int:
    """USER_HZ, the unit of ``<procfs>/stat`` times."""
    return os.sysconf("SC_CLK_TCK")


def read_stat(proc_path: Path, *, clk_tck: int | None = None) -> CpuStat:
    """Parse ``<proc_path>/stat``; ``clk_tck`` defaults to :func:`clock_ticks`."""
    ticks = clock_ticks() if clk_tck is None else clk_tck
    if ticks <= 0:
        raise ValueError(f"clk_tck must be positive, not {ticks}")
    path = proc_path / "stat"
    aggregate: CpuTimes | None = None
    per_cpu: dict[int, CpuTimes] = {}
    for number, line in enumerate(_read_lines(path), start=1):
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu"):
            continue
        times = _parse_cpu_fields(path, number, rest.split(), ticks)
        suffix = name[len("cpu") :]
        if not suffix:
            aggregate = times
        elif suffix.isdecimal():
            per_cpu[int(suffix)] = times
        else:
            raise ProcfsError(path, f"line {number}: unexpected line name {name!r}")
    if aggregate is None:
        raise ProcfsError(path, "no aggregate 'cpu' line")
    if not per_cpu:
        raise ProcfsError(path, "no 'cpuN' lines")
    return CpuStat(aggregate=aggregate, per_cpu=per_cpu)


def read_softirqs(proc_path: Path) -> Softirqs:
    """Parse ``<proc_path>/softirqs``, summing each vector over all CPU columns."""
    path = proc_path / "softirqs"
    lines = _read_lines(path)
    columns = lines[0].split()
    if not columns or not all(_is_cpu_column(column) for column in columns):
        raise ProcfsError(path, f"line 1: expected a header of CPUn columns, got {lines[0]!r}")
    counts: dict[str, int] = {}
    for number, line in enumerate(lines[1:], start=2):
        vector, colon, rest = line.partition(":")
        vector = vector.strip()
        if not colon or not vector:
            raise ProcfsError(path, f"line {number}: expected 'VECTOR: counts', got {line!r}")
        values = rest.split()
        if len(values) != len(columns):
            raise ProcfsError(
                path,
                f"line {number}: {vector} has {len(values)} counts for {len(columns)} CPUs",
            )
        counts[vector] = sum(_parse_int(path, number, value) for value in values)
    if not counts:
        raise ProcfsError(path, "no softirq vectors after the header")
    return Softirqs(possible_cpus=len(columns), counts=counts)


def _read_lines(path: Path) -> list[str]:
    """Non-empty lines of a whole procfs file, refusing one whose last line was cut off."""
    try:
        text = path.read_bytes().decode("ascii")
    except OSError as exc:
        raise ProcfsError(path, f"cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ProcfsError(path, f"not ASCII text at byte {exc.start}") from exc
    if not text.strip():
        raise ProcfsError(path, "empty file")
    # The kernel ends every line with a newline; without one the last line (and possibly a
    # number in it) is incomplete, so nothing in it can be trusted.
    if not text.endswith("\n"):
        last = text.rsplit("\n", 1)[-1]
        raise ProcfsError(path, f"truncated: last line {_clip(last)!r} has no newline")
    return [line for line in text.splitlines() if line.strip()]


def _parse_cpu_fields(path: Path, number: int, fields: list[str], clk_tck: int) -> CpuTimes:
    if len(fields) < _MIN_CPU_FIELDS:
        raise ProcfsError(
            path, f"line {number}: {len(fields)} CPU time fields, expected at least 4"
        )
    # Only the first eight: guest and guest_nice are included in user and nice already.
    ticks = [_parse_int(path, number, field) for field in fields[: len(MODES)]]
    ticks += [0] * (len(MODES) - len(ticks))
    seconds = [tick / clk_tck for tick in ticks]
    return CpuTimes(*seconds)


def _parse_int(path: Path, number: int, value: str) -> int:
    if not value.isdecimal():
        raise ProcfsError(path, f"line {number}: {_clip(value)!r} is not a count")
    return int(value)


def _is_cpu_column(column: str) -> bool:
    return column.startswith("CPU") and column[len("CPU") :].isdecimal()


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
