"""The sidecar never imports torch; nor do the load generator, demo and stack."""

from __future__ import annotations

import subprocess
import sys

from exporter.lab.processes import child_pythonpath

MODULES = (
    "exporter.cli",
    "exporter.server.app",
    "exporter.collectors",
    "exporter.collectors.engine",
    "exporter.collectors.tokenizer",
    "exporter.collectors.nvml",
    "exporter.diagnose",
    "exporter.instrument",
    "exporter.instrument.torch_h2d",
    "exporter.lab.loadgen",
    "exporter.lab.refengine",
    "exporter.lab.demo",
    "exporter.lab.stack",
    "exporter.lab.refengine.server",
    "exporter.lab.refengine.worker",
    "exporter.lab.refengine.inject",
    "exporter.lab.refengine.gputrace",
)


def test_no_torch_outside_the_model_worker() -> None:
    code = (
        "import importlib, sys\n"
        f"for m in {MODULES!r}: importlib.import_module(m)\n"
        "from exporter.collectors import COLLECTORS\n"
        "from exporter.cli import load_settings\n"
        "load_settings(['--web.listen-address', '127.0.0.1:0'], {})\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not bad, bad\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
