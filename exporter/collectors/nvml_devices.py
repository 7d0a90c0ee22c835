"""Which GPUs and MIG devices the ``nvml`` collector watches (``--gpu.devices``, else the
UUIDs of ``NVIDIA_VISIBLE_DEVICES``), and the peak figures of each, from identity-time facts."""

from __future__ import annotations

from collections.abc import Iterable

from exporter.backends.gpu_reader import GpuIdentity, MigSlice, read_identity, read_mig_slices
from exporter.backends.nvml_api import NvmlApi
from exporter.hardware.gpus import Peaks, peaks_of, slice_peaks


class DeviceFilter:
    """Which GPUs and MIG devices to watch, from ``--gpu.devices`` (or the UUIDs of
    ``NVIDIA_VISIBLE_DEVICES``). Entries: a GPU index (``0``), a GPU UUID, a MIG UUID
    (``MIG-<uuid>``, or the pre-R470 ``MIG-GPU-<uuid>/<gi>/<ci>``), a MIG index
    (``<gpu>:<slot>``). A listed GPU brings all its MIG devices; a listed MIG device brings
    its GPU (power, temperature, clocks are the GPU's). Empty: everything NVML shows."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        # Kubernetes device IDs may carry a "::<replica>" suffix (time-sliced replicas).
        self.entries = frozenset(e.strip().split("::")[0] for e in entries if e.strip())

    def __bool__(self) -> bool:
        return bool(self.entries)

    @property
    def names_mig_devices(self) -> bool:
        return any(e.startswith("MIG-") or ":" in e for e in self.entries)

    def gpu(self, index: int, uuid: str) -> bool:
        return not self.entries or str(index) in self.entries or uuid in self.entries

    def mig(self, piece: MigSlice, uuid: str) -> bool:
        legacy = f"MIG-{piece.parent_uuid}/{piece.gpu_instance_id}/{piece.compute_instance_id}"
        names = {uuid, legacy, f"{piece.parent_index}:{piece.slot}"}
        return self.gpu(piece.parent_index, piece.parent_uuid) or bool(names & self.entries)


def visible_device_uuids(value: str) -> frozenset[str]:
    """The GPU and MIG UUIDs of an ``NVIDIA_VISIBLE_DEVICES`` value. Indices are left out: they
    number the host's GPUs, not the ones NVML shows inside the container; ``all``, ``none``,
    ``void`` name no device."""
    items = (item.strip().split("::")[0] for item in value.split(","))
    return frozenset(i for i in items if i.startswith(("GPU-", "MIG-")))


def devices_to_watch(
    api: NvmlApi, index: int, handle: object, wanted: DeviceFilter
) -> list[tuple[GpuIdentity, object]]:
    """The GPU at ``index`` and its MIG devices that ``wanted`` names, each with its handle,
    the GPU first; empty to skip it."""
    if wanted and not wanted.names_mig_devices and not wanted.gpu(index, api.uuid(handle)):
        return []  # not listed, and no MIG device could be
    identity = read_identity(api, index, handle)
    slices = read_mig_slices(api, identity, handle) if identity.mig_mode == "enabled" else []
    kept = [(i, h) for i, h in slices if i.mig is not None and wanted.mig(i.mig, i.uuid)]
    if not kept and not wanted.gpu(index, identity.uuid):
        return []
    return [(identity, handle), *kept]


def device_peaks(identity: GpuIdentity) -> Peaks:
    """A device's peak bandwidth and FLOPs: the GPU's, or a MIG device's share of its GPU's
    (by SMs and memory slices)."""
    piece = identity.mig
    if piece is None:
        return peaks_of(identity.name, identity.facts)
    attributes = piece.attributes
    return slice_peaks(
        peaks_of(piece.parent_name, identity.facts),
        sms=attributes.multiprocessor_count if attributes is not None else None,
        memory_fraction=piece.memory_fraction,
    )
