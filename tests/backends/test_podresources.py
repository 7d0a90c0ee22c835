"""The PodResources client against a kubelet speaking the real protocol (tests/support/kubelet)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.kubelet import (
    MIG_UUID,
    SHARED_GPU,
    device_plugin_node,
    device_plugin_offer,
    gpu_uuid,
)

from exporter.backends.podresources_client import (
    Assignment,
    Device,
    PodResourcesClient,
    PodResourcesError,
)
from exporter.lab.layouts import Kubelet, serve_kubelet


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # A unix socket path must fit in 108 bytes; pytest's tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture
def kubelet(short_dir: Path) -> Iterator[tuple[Kubelet, Path]]:
    fake = Kubelet(device_plugin_node(), device_plugin_offer())
    with serve_kubelet(fake, short_dir / "kubelet.sock") as socket:
        yield fake, socket


def test_list_names_every_device_of_every_container(kubelet: tuple[Kubelet, Path]) -> None:
    _, socket = kubelet
    client = PodResourcesClient(socket, deadline=2.0)
    got = client.list_devices()
    client.close()
    gpu = "nvidia.com/gpu"
    assert Assignment("serving", "vllm-0", "vllm", gpu, gpu_uuid(0)) in got
    assert [a.device_id for a in got if a.pod == "vllm-tp2"] == [gpu_uuid(8), gpu_uuid(9)]
    assert Assignment("batch", "embed-mig", "tei", "nvidia.com/mig-1g.10gb", MIG_UUID) in got
    shared = {a.pod: a.device_id for a in got if a.device_id.startswith(gpu_uuid(SHARED_GPU))}
    assert shared == {
        "notebook-a": f"{gpu_uuid(SHARED_GPU)}::0",
        "notebook-b": f"{gpu_uuid(SHARED_GPU)}::3",
    }
    # A container without devices, a device-less resource: nothing to list.
    assert not [
        a for a in got if a.pod == "coredns-1" or (a.container != "vllm" and a.pod == "vllm-tp2")
    ]
    assert len(got) == 8 + 2 + 1 + 2


def test_allocatable_lists_the_device_plugins_offer(kubelet: tuple[Kubelet, Path]) -> None:
    _, socket = kubelet
    offer = PodResourcesClient(socket).allocatable()
    assert Device("nvidia.com/mig-1g.10gb", MIG_UUID) in offer
    assert Device("nvidia.com/gpu", f"{gpu_uuid(SHARED_GPU)}::3") in offer
    assert len(offer) == 11 + 4 + 1


def test_get_and_its_fallback_to_list(kubelet: tuple[Kubelet, Path]) -> None:
    fake, socket = kubelet
    client = PodResourcesClient(socket)
    assert [a.device_id for a in client.get("serving", "vllm-3")] == [gpu_uuid(3)]
    fake.without_get = True
    with pytest.raises(PodResourcesError) as err:
        client.get("serving", "vllm-3")
    assert err.value.kind == "unimplemented"
    assert [a.device_id for a in client.pod_devices("serving", "vllm-3")] == [gpu_uuid(3)]
    assert fake.calls[-1] == "List"


def test_missing_socket_is_named_without_waiting(short_dir: Path) -> None:
    client = PodResourcesClient(short_dir / "kubelet.sock", deadline=5.0)
    started = time.monotonic()
    with pytest.raises(PodResourcesError) as err:
        client.list_devices()
    assert err.value.kind == "missing"
    assert "does not exist" in str(err.value)
    assert time.monotonic() - started < 1.0


def test_deadline_bounds_a_kubelet_that_hangs(kubelet: tuple[Kubelet, Path]) -> None:
    fake, socket = kubelet
    fake.hang = 1.5
    client = PodResourcesClient(socket, deadline=0.2)
    started = time.monotonic()
    with pytest.raises(PodResourcesError) as err:
        client.list_devices()
    assert err.value.kind == "deadline"
    assert time.monotonic() - started < 1.0
    client.close()


def test_grpc_error_status_is_one_line(kubelet: tuple[Kubelet, Path]) -> None:
    fake, socket = kubelet
    fake.fail = grpc.StatusCode.INTERNAL
    with pytest.raises(PodResourcesError) as err:
        PodResourcesClient(socket).list_devices()
    assert err.value.kind == "error"
    assert str(err.value) == "List: INTERNAL (a fault injected into the stand-in kubelet)"


def test_a_socket_that_is_not_a_kubelet(short_dir: Path) -> None:
    """Something else listens there (no gRPC): unavailable, within the deadline."""
    import socket as sockets  # noqa: PLC0415

    path = short_dir / "kubelet.sock"
    listener = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    try:
        started = time.monotonic()
        with pytest.raises(PodResourcesError) as err:
            PodResourcesClient(path, deadline=0.5).list_devices()
        assert err.value.kind in ("deadline", "unavailable")
        assert time.monotonic() - started < 2.0
    finally:
        listener.close()


def test_permission_denied_names_the_socket(kubelet: tuple[Kubelet, Path]) -> None:
    """A client the socket's mode refuses is told so at once. The client runs as root without
    any capability (setpriv drops the bounding set), so mode 0000 refuses it as a file mode
    refuses a non-root user, and it still reads the checkout and the virtualenv wherever CI
    cloned them (another user may not traverse a 0700 parent)."""
    assert os.geteuid() == 0, "the tests run as root (as CI does) to drop the capabilities"
    _, socket = kubelet
    socket.chmod(0o000)
    site = str(Path(grpc.__file__).parent.parent)
    path = os.pathsep.join([str(Path(__file__).parents[2]), site])
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from exporter.backends.podresources_client import PodResourcesClient, PodResourcesError\n"
        "try:\n"
        f"    PodResourcesClient(Path({str(socket)!r}), deadline=2.0).list_devices()\n"
        "except PodResourcesError as err:\n"
        "    print(err.kind, err)\n"
    )
    done = subprocess.run(
        ["setpriv", "--bounding-set=-all", "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PYTHONPATH": path, "PATH": os.environ.get("PATH", "")},
        check=False,
    )
    assert done.stdout.startswith("permission "), done.stdout + done.stderr
    assert "permission denied" in done.stdout
