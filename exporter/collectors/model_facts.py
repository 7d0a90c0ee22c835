"""Collector ``model``: the served model's roofline facts, from its Hugging Face directory.

Emits (``engine`` = the engine type, ``model`` = the served model name when the engine reports
exactly one or the directory's name is among them, else the directory's name)::

    inference_model_weight_bytes{engine,model}              weights one decode step reads, per GPU
    inference_model_kv_cache_bytes_per_token{engine,model}  KV cache of one token, per GPU
    inference_model_flops_per_token{engine,model}           forward FLOPs of one token, per GPU

Per GPU means per GPU of the engine: with ``--model.tensor-parallel N`` weights and FLOPs are
divided by N and the KV cache counts the KV heads one GPU holds, so each figure sets against
one GPU's peaks (``inference_gpu_peak_*``). The arithmetic is :mod:`exporter.hardware.model_shapes`;
the files are read by :mod:`exporter.backends.hfmodel` (config and safetensors headers only).

The directory is read once, in a background thread at start. A missing or unreadable one is
one warning (the scrape's report of this collector's failure), no model series and
``inference_scrape_collector_success{collector="model"} 0``; the read is retried every minute
(a volume mounted late), quietly. Nothing is read on the scrape path. Without ``--model.path``
only ``--model.weight-bytes`` can be reported.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exporter import metrics as m
from exporter.backends.hfmodel import ModelDirError, ModelFacts, load_model
from exporter.collectors.base import BackgroundThread, Collection, Collector
from exporter.collectors.shared_state import EngineHub, Shared
from exporter.config import Settings, flag, section
from exporter.hardware.model_shapes import KV_CACHE_DTYPES

log = logging.getLogger(__name__)

RETRY_INTERVAL = 60.0


class ModelCollector(Collector):
    """See the module docstring."""

    name = "model"
    blocking = False

    def __init__(
        self,
        hub: EngineHub,
        load: Callable[[], ModelFacts] | None,
        *,
        retry_interval: float = RETRY_INTERVAL,
    ) -> None:
        self.hub = hub
        # None: nothing configured, nothing to read or report.
        self._load = load
        self.retry_interval = retry_interval
        self._facts: ModelFacts | None = None
        self._error = ""
        self._attempted = threading.Event()
        self._background = BackgroundThread()

    def start(self) -> None:
        if self._load is None:
            self._attempted.set()
            return
        self._background.start_thread(self._run, "model-reader")

    def stop(self, timeout: float) -> None:
        self._background.stop_thread(timeout)

    def wait_ready(self, timeout: float) -> bool:
        return self._attempted.wait(timeout)

    def _run(self) -> None:
        assert self._load is not None
        while not self._background.stopping.is_set():
            try:
                facts = self._load()
            except ModelDirError as err:
                # The scrape reports the error as this collector's failure, with one warning
                # per distinct error (exporter.server.scrape); here only what it does next.
                error = f"model directory unreadable, model metrics absent: {err}"
                level = logging.INFO if error != self._error else logging.DEBUG
                log.log(level, "%s; retrying every %.0fs", error, self.retry_interval)
                self._error = error
            except Exception as err:  # a bug must cost this collector only, never the exporter
                error = f"reading the model directory failed: {err!r}"
                if error != self._error:
                    log.exception("reading the model directory failed")
                self._error = error
            else:
                self._facts, self._error = facts, ""
                log.info("model facts of %r: %s", facts.name, "; ".join(facts.notes) or "-")
                self._attempted.set()
                return
            self._attempted.set()
            self._background.stopping.wait(self.retry_interval)

    def model_label(self, directory_name: str) -> str:
        """The served model name where the engine says which, else the directory's name."""
        served = self.hub.models()
        if directory_name in served:
            return directory_name
        if len(served) == 1:
            return served[0]
        return directory_name

    def collect(self) -> Collection:
        facts, error = self._facts, self._error
        if facts is None:
            return Collection(success=not error, error=error)
        labels = [self.hub.engine, self.model_label(facts.name)]
        out = Collection()
        for name, value in (
            ("inference_model_weight_bytes", facts.weight_bytes),
            ("inference_model_kv_cache_bytes_per_token", facts.kv_cache_bytes_per_token),
            ("inference_model_flops_per_token", facts.flops_per_token),
        ):
            if value is not None:
                family = m.gauge(name)
                family.add_metric(labels, value)
                out.metrics.append(family)
        return out


# --- flags and construction -------------------------------------------------------------------


@dataclass(frozen=True)
class ModelOptions:
    """The flags of the ``model`` collector."""

    path: Path | None = flag(
        "model.path",
        None,
        "Hugging Face model directory of the served model, mounted into the sidecar (read: "
        "config.json and safetensors headers, never a tensor).",
        kind="path",
        metavar="DIR",
    )
    weight_bytes: int | None = flag(
        "model.weight-bytes",
        None,
        "Bytes of weights one decode step reads, whole model (default: from the safetensors "
        "files, less the input embedding).",
        kind="bytes",
        bounds=(1, None),
        metavar="SIZE",
    )
    kv_cache_dtype: str = flag(
        "model.kv-cache-dtype",
        "auto",
        "The engine's KV cache dtype (its --kv-cache-dtype); auto: the model's dtype.",
        kind="choice",
        choices=tuple(KV_CACHE_DTYPES),
    )
    tensor_parallel: int = flag(
        "model.tensor-parallel",
        1,
        "GPUs the engine shards the model over (its --tensor-parallel-size); the model metrics "
        "are per GPU.",
        kind="int",
        bounds=(1, 1024),
        metavar="N",
    )


def check(settings: Settings) -> None:
    """Nothing to check across fields: a missing directory is not a configuration error
    (it may be mounted later) but a warning at run time."""
    section(ModelOptions, settings)


def build(settings: Settings, shared: Shared) -> ModelCollector:
    opts = section(ModelOptions, settings)
    load: Callable[[], ModelFacts] | None = None
    if opts.path is not None or opts.weight_bytes is not None:
        load = functools.partial(
            load_model,
            opts.path,
            weight_bytes=opts.weight_bytes,
            kv_cache_dtype=opts.kv_cache_dtype,
            tensor_parallel=opts.tensor_parallel,
        )
    return ModelCollector(shared.engine_hub, load)
