"""``python -m exporter.cli`` with each thread's name given to the kernel, for CPU attribution.

CPython 3.11 does not name OS threads, so ``/proc/<pid>/task/<tid>/comm`` would say
``python`` for all of them. This starts the exporter's own ``main()`` unchanged, after wrapping
``threading.Thread`` so that each thread calls ``prctl(PR_SET_NAME, <its Python name>)`` as it
starts (one system call per thread start). The benchmark then reads each thread's CPU time
from ``/proc`` and groups it by name (``nvml-gpu3``, ``engine-poller``, ``scrape_0``, ...).

    python bench/run_exporter.py [exporter arguments]
"""

from __future__ import annotations

import ctypes
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PR_SET_NAME = 15
_LIBC = ctypes.CDLL(None, use_errno=True)
_PREFIXES = {"ThreadPoolExecutor-": "pool-"}


def kernel_name(name: str) -> bytes:
    """The 15 bytes the kernel keeps: long prefixes shortened so the distinctive part fits."""
    for long, short in _PREFIXES.items():
        if name.startswith(long):
            name = short + name[len(long) :]
    return name.encode("ascii", "replace")[:15]


_bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _named_bootstrap(self: threading.Thread) -> None:
    _LIBC.prctl(PR_SET_NAME, ctypes.c_char_p(kernel_name(self.name)), 0, 0, 0)
    _bootstrap(self)


threading.Thread._bootstrap_inner = _named_bootstrap  # type: ignore[attr-defined]

import exporter  # noqa: E402
from exporter.cli import main  # noqa: E402

if __name__ == "__main__":
    # The benchmark checks this line to know which copy of the package it measures.
    print(f"run_exporter: package {Path(exporter.__file__).parent}", file=sys.stderr, flush=True)
    raise SystemExit(main(sys.argv[1:]))
