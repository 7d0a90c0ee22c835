"""inference-bottleneck-exporter: find what a GPU LLM inference server is waiting for."""

from __future__ import annotations

__version__ = "0.1.0"
