"""Builds the image for real and runs it the way Kubernetes would run the sidecar.

build-tools/build-image.sh debootstraps a Debian base (no registry is reachable here; once per
version of build-base-image.sh) and builds the Dockerfile with `buildah bud --isolation=chroot`; podman then runs the image's own
ENTRYPOINT with a read-only root filesystem, every capability dropped and no privilege
escalation, as the image's user. Needs root, buildah, podman, runc and debootstrap
(`make tools`); about two minutes on two cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import exporter

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/inference-bottleneck-exporter:test"
BASE = "localhost/inference-bottleneck-exporter-base:bookworm"  # build-image.sh's local base
RECIPE = "io.inference-bottleneck-exporter.base.recipe"
SIZE_BUDGET = 200 * 1000 * 1000  # bytes, uncompressed
ENTRYPOINT = ["/opt/exporter/bin/inference-bottleneck-exporter"]

pytestmark = pytest.mark.timeout(1200)

# podman with runc and plain cgroupfs: crun refuses this machine's hybrid cgroup layout. The
# rlimits are lowered because podman's defaults (1048576 files) exceed the hard limits here
# and raising them needs CAP_SYS_RESOURCE, which this machine's root lacks; a kubelet leaves
# rlimits alone.
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
RESTRICTED = [
    "--read-only",
    "--read-only-tmpfs=false",  # nothing writable at all, as readOnlyRootFilesystem
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
    "--ulimit=nofile=4096:4096",
    "--ulimit=nproc=4096:4096",
    "--network=host",
]


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    result = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {result.returncode}\n{result.stderr}")
    return result.stdout


@pytest.fixture(scope="module")
def image() -> dict[str, Any]:
    """Build the image from scratch, on the base the current build-base-image.sh builds (built
    now unless an earlier run built it with the same script: its sha256 is the base's label);
    the image's `podman image inspect`."""
    missing = [t for t in ("buildah", "podman", "runc", "debootstrap") if not shutil.which(t)]
    assert not missing, f"{missing} not installed: `make tools` installs them"
    assert os.geteuid() == 0, "building images needs root here"
    start = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("BASE_IMAGE", "REBUILD_BASE")}
    result = subprocess.run(
        [str(ROOT / "build-tools" / "build-image.sh"), IMAGE],
        env=env,
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    print(result.stdout.strip(), f"({time.monotonic() - start:.0f}s in all)")
    (base,) = json.loads(podman("image", "inspect", BASE))
    script = (ROOT / "build-tools" / "build-base-image.sh").read_bytes()
    assert base["Labels"][RECIPE] == hashlib.sha256(script).hexdigest()
    (inspect,) = json.loads(podman("image", "inspect", IMAGE))
    return dict(inspect)


def test_image_fits_the_size_budget(image: dict[str, Any]) -> None:
    assert image["Size"] <= SIZE_BUDGET, f"{image['Size'] / 1e6:.0f} MB uncompressed"


def test_image_config(image: dict[str, Any]) -> None:
    config = image["Config"]
    assert config["User"] == "65534:65534"
    assert config["Entrypoint"] == ENTRYPOINT  # exec form: no shell in between
    assert not config.get("Cmd")
    assert "Healthcheck" not in config
    assert "10960/tcp" in config["ExposedPorts"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == exporter.__version__
    assert labels["org.opencontainers.image.title"] == "inference-bottleneck-exporter"
    for key in ("source", "revision", "created", "licenses", "description"):
        assert labels[f"org.opencontainers.image.{key}"], key


def run_python(code: str) -> str:
    return podman(
        "run", "--rm", *RESTRICTED, "--entrypoint", "/opt/exporter/bin/python", IMAGE, "-c", code
    ).strip()


def test_image_has_no_torch_and_no_installers(image: dict[str, Any]) -> None:
    found = run_python(
        "import importlib.util as u; print([m for m in ('torch', 'pip', 'setuptools') "
        "if u.find_spec(m)])"
    )
    assert found == "[]"


def test_image_holds_the_sidecar_and_no_lab(image: dict[str, Any]) -> None:
    """The installed package, file by file: the sidecar's parts are there, the lab's are not
    (reference engine, load generator, demo), and the lab's subcommands say so in one line."""
    listing = run_python(
        "import exporter, pathlib; root = pathlib.Path(exporter.__file__).parent; "
        "print('\\n'.join(sorted(str(p.relative_to(root.parent)) for p in root.rglob('*') "
        "if p.is_file())))"
    ).splitlines()
    assert "exporter/cli.py" in listing
    assert "exporter/server/app.py" in listing
    assert "exporter/collectors/nvml.py" in listing
    assert "exporter/diagnose/cli.py" in listing
    lab = [path for path in listing if path.startswith("exporter/lab")]
    assert lab == []
    # ... nor anywhere else: modules whose names only the lab uses (loadgen, demo, worker, ...)
    lab_dir = ROOT / "exporter" / "lab"
    sidecar_names = {p.stem for p in (ROOT / "exporter").rglob("*.py") if lab_dir not in p.parents}
    lab_only = {p.stem for p in lab_dir.rglob("*.py")} - sidecar_names
    assert {"loadgen", "demo", "worker", "gputrace"} <= lab_only
    strays = [path for path in listing if Path(path).stem in lab_only]
    assert strays == []
    for command in ("demo", "load"):
        result = subprocess.run(
            [*PODMAN, "run", "--rm", *RESTRICTED, IMAGE, command],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == (
            f"inference-bottleneck-exporter: error: {command} needs the lab (exporter.lab), "
            "which this installation leaves out: run it from a source checkout (make demo)"
        )


def test_version_through_the_entrypoint(image: dict[str, Any]) -> None:
    out = podman("run", "--rm", *RESTRICTED, IMAGE, "--version")
    assert out.startswith(f"inference-bottleneck-exporter, version {exporter.__version__} ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:  # loopback only
        return response.status, response.read().decode()


@pytest.fixture
def serving(image: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """The image serving /metrics on loopback from its bundled trace: (base URL, container)."""
    trace = run_python(
        "import importlib.resources as r; "
        "print(r.files('exporter') / 'data' / 'replay-2gpu-synthetic.jsonl')"
    )
    port = free_port()
    container = podman(
        "run", "--detach", *RESTRICTED, IMAGE,
        f"--web.listen-address=127.0.0.1:{port}",
        f"--gpu.replay-file={trace}",
        "--engine.url=http://127.0.0.1:1/metrics",
    ).strip()  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if get(f"{base}/-/ready")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, podman("logs", container, check=False)
            time.sleep(0.2)
        yield base, container
    finally:
        podman("rm", "--force", container, check=False)


def test_serves_metrics_read_only_as_nobody(serving: tuple[str, str]) -> None:
    base, container = serving
    assert get(f"{base}/-/healthy")[0] == 200
    status, text = get(f"{base}/metrics")
    assert status == 200
    samples = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    for collector in ("nvml", "cpu", "process"):
        assert samples[f'inference_scrape_collector_success{{collector="{collector}"}}'] == "1.0"
    assert sum(k.startswith("inference_gpu_up{") and v == "1.0" for k, v in samples.items()) == 2
    # The exporter runs as the image's user, not root.
    pid = podman("inspect", "--format", "{{.State.Pid}}", container).strip()
    status_lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    uids = next(line for line in status_lines if line.startswith("Uid:")).split()[1:]
    assert set(uids) == {"65534"}


def test_stops_cleanly_on_sigterm(serving: tuple[str, str]) -> None:
    _, container = serving
    start = time.monotonic()
    podman("stop", "--time", "10", container)
    assert time.monotonic() - start < 6
    state = json.loads(podman("inspect", container))[0]["State"]
    assert state["ExitCode"] == 0
    logs = podman("logs", container)
    assert "Traceback" not in logs and "Read-only file system" not in logs, logs
