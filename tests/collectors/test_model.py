"""The model collector: facts of a model directory under the engine's labels; a broken directory
is one warning and no model series, never a broken exporter."""

from __future__ import annotations

import functools
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.metrics import registry_of
from support.paths import FIXTURES, TRACE
from support.process import ExporterProcess

from exporter.backends.hfmodel import ModelFacts, load_model
from exporter.collectors import build_shared, default_settings
from exporter.collectors.model_facts import ModelCollector, build
from exporter.collectors.shared_state import EngineHub
from exporter.engines.snapshot import EngineSnapshot, Series

LLAMA = FIXTURES / "models" / "meta-llama__Llama-3.1-8B"
NAMES = (
    "inference_model_weight_bytes",
    "inference_model_kv_cache_bytes_per_token",
    "inference_model_flops_per_token",
)


def hub_serving(*models: str) -> EngineHub:
    hub = EngineHub(configured="vllm")
    hub.snapshot = EngineSnapshot(
        engine="vllm", series=[Series("inference_queue_depth", m, "gauge") for m in models]
    )
    hub.snapshot_at = time.monotonic()
    return hub


def started(collector: ModelCollector) -> ModelCollector:
    collector.start()
    assert collector.wait_ready(5)
    return collector


def test_facts_under_the_served_model_name() -> None:
    collector = started(
        ModelCollector(hub_serving("llama-8b"), functools.partial(load_model, LLAMA))
    )
    try:
        collection = collector.collect()
        assert collection.success
        reg = registry_of(collection)
        labels = {"engine": "vllm", "model": "llama-8b"}
        assert reg.get_sample_value("inference_model_weight_bytes", labels) == 15_009_849_344
        assert reg.get_sample_value("inference_model_kv_cache_bytes_per_token", labels) == 131_072
        assert reg.get_sample_value("inference_model_flops_per_token", labels) == 13_959_176_192
    finally:
        collector.stop(2)


def test_model_label_choice() -> None:
    load = functools.partial(load_model, LLAMA)
    name = "meta-llama__Llama-3.1-8B"
    # no engine snapshot yet: the directory's name
    assert ModelCollector(EngineHub(configured="auto"), load).model_label(name) == name
    # several models served, none of them this directory: still the directory's name
    assert ModelCollector(hub_serving("a", "b"), load).model_label(name) == name
    # the directory's name among them
    assert ModelCollector(hub_serving("a", name), load).model_label(name) == name
    assert ModelCollector(hub_serving("only"), load).model_label(name) == "only"


def test_nothing_configured_reports_nothing() -> None:
    settings = default_settings()
    collector = started(build(settings, build_shared(settings)))
    collection = collector.collect()
    assert collection.success and collection.metrics == []


def test_settings_reach_the_reader(tmp_path: Path) -> None:
    model = tmp_path / "llama"
    shutil.copytree(LLAMA, model)
    settings = default_settings(
        model_path=model, model_kv_cache_dtype="fp8", model_tensor_parallel=2
    )
    collector = started(build(settings, build_shared(settings)))
    try:
        reg = registry_of(collector.collect())
        labels = {"engine": "unknown", "model": "llama"}
        assert reg.get_sample_value("inference_model_kv_cache_bytes_per_token", labels) == 32_768
        assert reg.get_sample_value("inference_model_weight_bytes", labels) == 15_009_849_344 / 2
    finally:
        collector.stop(2)


def test_broken_directory_warns_once_and_recovers_when_mounted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "late"
    attempts: list[float] = []

    def load() -> ModelFacts:
        attempts.append(time.monotonic())
        return load_model(directory)

    collector = ModelCollector(hub_serving("m"), load, retry_interval=0.02)
    with caplog.at_level(logging.DEBUG, logger="exporter.collectors.model_facts"):
        started(collector)
        try:
            deadline = time.monotonic() + 5
            while len(attempts) < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(attempts) >= 4
            collection = collector.collect()
            assert not collection.success and "not a directory" in collection.error
            assert "model metrics absent" in collection.error
            assert collection.metrics == []
            # one line at info about the retries; the repeats only at debug
            infos = [r for r in caplog.records if r.levelno >= logging.INFO]
            assert len(infos) == 1 and "retrying every 0s" in infos[0].getMessage()
            shutil.copytree(LLAMA, directory)  # the volume arrives
            while not collector.collect().metrics and time.monotonic() < deadline:
                time.sleep(0.01)
            collection = collector.collect()
            assert collection.success
            assert sorted(f.name for f in collection.metrics) == sorted(NAMES)
        finally:
            collector.stop(2)


def test_an_unexpected_reader_failure_costs_this_collector_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def load() -> ModelFacts:
        raise RuntimeError("bug")

    with caplog.at_level(logging.ERROR, logger="exporter.collectors.model_facts"):
        collector = started(ModelCollector(hub_serving("m"), load, retry_interval=60))
    try:
        collection = collector.collect()
        assert not collection.success
        assert collection.error == "reading the model directory failed: RuntimeError('bug')"
        assert [r.getMessage() for r in caplog.records] == ["reading the model directory failed"]
    finally:
        collector.stop(2)


def test_exporter_with_a_missing_model_directory_still_serves(
    exporter_process: Callable[..., ExporterProcess], tmp_path: Path
) -> None:
    proc = exporter_process(
        "--gpu.replay-file",
        str(TRACE),
        "--no-collector.engine",
        "--no-collector.tokenizer",
        "--no-collector.process",
        "--model.path",
        str(tmp_path / "not-mounted"),
    )
    proc.wait_ready()
    status, _, body = proc.get("/metrics")
    text = body.decode()
    assert status == 200
    assert 'inference_scrape_collector_success{collector="model"} 0.0' in text
    assert 'inference_scrape_collector_success{collector="nvml"} 1.0' in text
    assert "inference_gpu_peak_flops{" in text
    assert "inference_model_" not in text
    warnings = [e for e in proc.logs if e.get("level") in {"warn", "error"}]
    assert len(warnings) == 1, warnings
    assert warnings[0]["msg"].startswith("collector model failed: model directory unreadable")


def test_exporter_with_a_model_directory(
    exporter_process: Callable[..., ExporterProcess],
) -> None:
    proc = exporter_process(
        "--gpu.replay-file",
        str(TRACE),
        "--no-collector.engine",
        "--no-collector.tokenizer",
        "--no-collector.process",
        "--model.path",
        str(LLAMA),
    )
    proc.wait_ready()
    text = proc.get("/metrics")[2].decode()
    labels = '{engine="unknown",model="meta-llama__Llama-3.1-8B"}'
    assert f"inference_model_kv_cache_bytes_per_token{labels} 131072.0" in text
    assert f"inference_model_weight_bytes{labels} 1.5009849344e+10" in text
