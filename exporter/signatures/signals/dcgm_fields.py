"""dcgm-exporter's names for each quantity the ``dcgm`` layout reads, in every current release.

dcgm-exporter 4.9.0 renamed the 23 default and profiling fields that DCGM 4.7 deprecates to
their DCGM 4.7 names, eleven of them in base units (utilisation a 0-1 ratio instead of a
percentage, framebuffer bytes instead of MiB, clocks hertz instead of MHz, energy joules
instead of millijoules, NVLink bytes instead of MB per second), and renamed the driver-version
label (``DCGM_FI_DRIVER_VERSION`` to ``DCGM_FI_SYSTEM_DRIVER_VERSION``); 4.10.0 renamed
``DCGM_FI_PROF_{PCIE,NVLINK}_{TX,RX}_BYTES`` to ``..._BYTES_PER_SECOND`` (the pack reads the
NVLink pair). Sources: the release notes of dcgm-exporter 4.9.0 and 4.10.0, and DCGM's field header
(``dcgm_fields.h``: the deprecated names and the base-unit fields that replace them).

A quantity is one :class:`DcgmQuantity`: every name it has had, newest first, each with the
factor that turns its unit into the quantity's. :func:`dcgm_quantity` reads them all, so one
rule file serves a fleet of either generation, or both while it upgrades; where a GPU shows
under two names at once, the newest wins. A name not listed here is read by nothing: the
``InferenceGPUMetricsMissing`` alert and ``diagnose``'s missing inputs say so, never an empty
signal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.signatures.promql_text import num
from exporter.signatures.signals.dcgm_join import dcgm_series

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext


@dataclass(frozen=True)
class DcgmName:
    """One name of a quantity: the metric, the factor to the quantity's unit, the releases."""

    metric: str
    factor: float
    releases: str


@dataclass(frozen=True)
class DcgmQuantity:
    """One quantity dcgm-exporter reports, under every name it has had (newest first)."""

    title: str
    unit: str
    names: tuple[DcgmName, ...]
    #: In dcgm-exporter's default counters (else a counters file of one's own adds it).
    default: bool = True

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(name.metric for name in self.names)

    def described(self) -> str:
        """``DCGM_FI_DEV_GPU_UTIL_RATIO (4.9 and later), DCGM_FI_DEV_GPU_UTIL (%, 4.8 and
        before)``: every name with what tells them apart."""
        return ", ".join(f"{name.metric} ({name.releases})" for name in self.names)


_NEW = "dcgm-exporter 4.9 and later"
_OLD = "dcgm-exporter 4.8 and before"
MIB = 1024.0 * 1024.0

UTILIZATION = DcgmQuantity(
    "GPU utilisation",
    "ratio",
    (
        DcgmName("DCGM_FI_DEV_GPU_UTIL_RATIO", 1.0, f"0-1, {_NEW}"),
        DcgmName("DCGM_FI_DEV_GPU_UTIL", 0.01, f"%, {_OLD}"),
    ),
)
FB_USED = DcgmQuantity(
    "framebuffer used",
    "bytes",
    (
        DcgmName("DCGM_FI_DEV_FB_USED_BYTES", 1.0, f"bytes, {_NEW}"),
        DcgmName("DCGM_FI_DEV_FB_USED", MIB, f"MiB, {_OLD}"),
    ),
)
FB_FREE = DcgmQuantity(
    "framebuffer free",
    "bytes",
    (
        DcgmName("DCGM_FI_DEV_FB_FREE_BYTES", 1.0, f"bytes, {_NEW}"),
        DcgmName("DCGM_FI_DEV_FB_FREE", MIB, f"MiB, {_OLD}"),
    ),
)
DRAM_ACTIVE = DcgmQuantity(
    "DRAM-interface activity",
    "ratio",
    (
        DcgmName("DCGM_FI_PROF_DRAM_UTIL_RATIO", 1.0, _NEW),
        DcgmName("DCGM_FI_PROF_DRAM_ACTIVE", 1.0, _OLD),
    ),
)
SM_ACTIVE = DcgmQuantity(
    "SM activity",
    "ratio",
    (
        DcgmName("DCGM_FI_PROF_SM_UTIL_RATIO", 1.0, _NEW),
        DcgmName("DCGM_FI_PROF_SM_ACTIVE", 1.0, _OLD),
    ),
    default=False,
)
XID = DcgmQuantity(
    "last Xid",
    "Xid",
    (
        DcgmName("DCGM_FI_DEV_XID_ERROR", 1.0, _NEW),
        DcgmName("DCGM_FI_DEV_XID_ERRORS", 1.0, _OLD),
    ),
)
CLOCK_REASONS = DcgmQuantity(
    "clock event reasons",
    "bitmask",
    (
        DcgmName("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0, "DCGM 3.3 and later"),
        DcgmName("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1.0, "before DCGM 3.3"),
    ),
    default=False,
)
GPU_TEMPERATURE = DcgmQuantity(
    "GPU temperature",
    "celsius",
    (
        DcgmName("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1.0, _NEW),
        DcgmName("DCGM_FI_DEV_GPU_TEMP", 1.0, _OLD),
    ),
)
SM_CLOCK = DcgmQuantity(
    "SM clock",
    "hertz",
    (
        DcgmName("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1.0, f"Hz, {_NEW}"),
        DcgmName("DCGM_FI_DEV_SM_CLOCK", 1e6, f"MHz, {_OLD}"),
    ),
)

NVLINK_TX = DcgmQuantity(
    "NVLink transmitted",
    "bytes_per_second",
    (
        DcgmName("DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND", 1.0, "dcgm-exporter 4.10 and later"),
        DcgmName("DCGM_FI_PROF_NVLINK_TX_BYTES", 1.0, "dcgm-exporter 4.9 and before"),
    ),
    default=False,
)
NVLINK_RX = DcgmQuantity(
    "NVLink received",
    "bytes_per_second",
    (
        DcgmName("DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND", 1.0, "dcgm-exporter 4.10 and later"),
        DcgmName("DCGM_FI_PROF_NVLINK_RX_BYTES", 1.0, "dcgm-exporter 4.9 and before"),
    ),
    default=False,
)
ENERGY = DcgmQuantity(
    "GPU energy since boot",
    "joules",
    (
        DcgmName("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1.0, f"J, {_NEW}"),
        DcgmName("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0.001, f"mJ, {_OLD}"),
    ),
)
POWER = DcgmQuantity(
    "board power draw",
    "watts",
    (
        DcgmName("DCGM_FI_DEV_BOARD_POWER_WATTS", 1.0, _NEW),
        DcgmName("DCGM_FI_DEV_POWER_USAGE", 1.0, _OLD),
    ),
)
#: Not among the fields DCGM 4.7 deprecates: one name in every release.
POWER_LIMIT = DcgmQuantity(
    "enforced power limit",
    "watts",
    (DcgmName("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 1.0, "every release"),),
    default=False,
)

#: Every quantity the dcgm layout reads.
QUANTITIES = (
    UTILIZATION,
    FB_USED,
    FB_FREE,
    DRAM_ACTIVE,
    SM_ACTIVE,
    XID,
    CLOCK_REASONS,
    GPU_TEMPERATURE,
    SM_CLOCK,
    NVLINK_TX,
    NVLINK_RX,
    ENERGY,
    POWER,
    POWER_LIMIT,
)


def scaled(expr: str, factor: float) -> str:
    """``expr`` times ``factor`` (a division where that reads better: ``/ 100``)."""
    if factor == 1:
        return expr
    inverse = 1 / factor
    if factor < 1 and inverse == round(inverse):
        return f"{expr} / {num(round(inverse))}"
    return f"{expr} * {num(factor)}"


def dcgm_quantity(
    ctx: SignalContext,
    quantity: DcgmQuantity,
    around: Callable[[str], str] = lambda series: series,
    *matchers: str,
    scale: bool = True,
) -> str:
    """``quantity`` in its unit under every name, newest first: ``around`` (a function of
    one series selector, e.g. a range function) applied to each name's attributed series and
    scaled (unless ``scale`` is false: a reader of which GPUs have it, not of its value),
    joined by ``or`` (a GPU under two names at once keeps the newest)."""
    parts = [
        scaled(around(dcgm_series(ctx, name.metric, *matchers)), name.factor if scale else 1.0)
        for name in quantity.names
    ]
    return parts[0] if len(parts) == 1 else "(\n" + "\nor\n".join(parts) + "\n)"
