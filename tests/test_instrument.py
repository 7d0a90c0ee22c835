"""exporter.instrument: catalogue names in the caller's registry, timers, the torch H2D timer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.clock import FakeClock

from exporter.instrument import InferenceMetrics, torch_h2d
from exporter.instrument.torch_h2d import H2DTimer
from exporter.metrics import BY_NAME

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = "inference_tokenizer_latency_seconds"
ENGINE_SOURCE = {"source": "engine"}


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter from the repository root."""
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def value(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float | None:
    return registry.get_sample_value(name, labels)


# --- InferenceMetrics ----------------------------------------------------------------------


def test_metrics_use_catalogue_names_types_and_model_label() -> None:
    registry = CollectorRegistry()
    metrics = InferenceMetrics("llama", registry=registry)
    metrics.queue_depth.set(7)
    metrics.requests_running.set(3)
    metrics.kv_cache_usage.set(0.5)
    metrics.prompt_tokens.inc(512)
    metrics.generation_tokens.inc(64)
    metrics.observe_ttft(0.2)
    metrics.observe_itl(0.02)
    metrics.e2e.observe(3.0)
    metrics.queue_time.observe(0.1)
    metrics.prefill_time.observe(0.15)
    metrics.decode_time.observe(2.75)

    model = {"model": "llama"}
    assert value(registry, "inference_queue_depth", model) == 7.0
    assert value(registry, "inference_requests_running", model) == 3.0
    assert value(registry, "inference_kv_cache_usage_ratio", model) == 0.5
    assert value(registry, "inference_prompt_tokens_total", model) == 512.0
    assert value(registry, "inference_generation_tokens_total", model) == 64.0
    observed = {
        "inference_time_to_first_token_seconds": 0.2,
        "inference_inter_token_latency_seconds": 0.02,
        "inference_e2e_request_latency_seconds": 3.0,
        "inference_queue_time_seconds": 0.1,
        "inference_prefill_time_seconds": 0.15,
        "inference_decode_time_seconds": 2.75,
    }
    for name, seconds in observed.items():
        assert value(registry, f"{name}_count", model) == 1.0, name
        assert value(registry, f"{name}_sum", model) == seconds, name
        assert value(registry, f"{name}_bucket", {**model, "le": "+Inf"}) == 1.0, name
    assert value(registry, f"{TOKENIZER}_count", ENGINE_SOURCE) == 0.0

    # Every family is a catalogue entry of the same type, labelled as the catalogue says
    # less the engine and role labels, which the sidecar's engine collector adds.
    families = {family.name: family for family in registry.collect()}
    assert len(families) == 12
    for family in families.values():
        spec = next(s for s in BY_NAME.values() if s.family_name == family.name)
        assert family.type == spec.type, family.name
        assert family.documentation == spec.help
        expected = set(spec.labels) - {"engine", "role"}
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            assert set(sample.labels) - {"le"} == expected, sample


def test_models_share_a_registry() -> None:
    registry = CollectorRegistry()
    first = InferenceMetrics("a", registry=registry)
    second = InferenceMetrics("b", registry=registry)
    first.queue_depth.set(1)
    second.queue_depth.set(2)
    first.tokenizer_latency.observe(0.001)
    second.tokenizer_latency.observe(0.002)
    assert value(registry, "inference_queue_depth", {"model": "a"}) == 1.0
    assert value(registry, "inference_queue_depth", {"model": "b"}) == 2.0
    assert value(registry, f"{TOKENIZER}_count", ENGINE_SOURCE) == 2.0


def test_default_registry_is_prometheus_default() -> None:
    # In a child process: the global registry of this one must stay as the other tests expect.
    code = (
        "from prometheus_client import REGISTRY\n"
        "from exporter.instrument import InferenceMetrics\n"
        "InferenceMetrics('m').generation_tokens.inc(2)\n"
        "InferenceMetrics('n').generation_tokens.inc(3)\n"
        "print(REGISTRY.get_sample_value('inference_generation_tokens_total', {'model': 'm'}))\n"
    )
    result = run_python(code)
    assert (result.returncode, result.stdout.strip()) == (0, "2.0"), result.stderr


def test_tokenizer_timer_as_context_manager() -> None:
    registry = CollectorRegistry()
    metrics = InferenceMetrics("m", registry=registry, clock=FakeClock(0.0, step=0.25))
    with metrics.tokenizer_timer():
        pass
    assert value(registry, f"{TOKENIZER}_count", ENGINE_SOURCE) == 1.0
    assert value(registry, f"{TOKENIZER}_sum", ENGINE_SOURCE) == 0.25
    assert value(registry, f"{TOKENIZER}_bucket", {**ENGINE_SOURCE, "le": "0.25"}) == 1.0
    assert value(registry, f"{TOKENIZER}_bucket", {**ENGINE_SOURCE, "le": "0.1"}) == 0.0


def test_tokenizer_timer_as_sync_decorator() -> None:
    registry = CollectorRegistry()
    metrics = InferenceMetrics("m", registry=registry, clock=FakeClock(0.0, step=0.5))

    @metrics.tokenizer_timer()
    def tokenize(text: str) -> list[int]:
        """Split on spaces."""
        return [len(word) for word in text.split()]

    assert tokenize("a bb ccc") == [1, 2, 3]
    assert tokenize.__name__ == "tokenize"
    assert tokenize.__doc__ == "Split on spaces."
    assert value(registry, f"{TOKENIZER}_count", ENGINE_SOURCE) == 1.0
    assert value(registry, f"{TOKENIZER}_sum", ENGINE_SOURCE) == 0.5


async def test_tokenizer_timer_as_async_decorator() -> None:
    registry = CollectorRegistry()
    metrics = InferenceMetrics("m", registry=registry, clock=FakeClock(0.0, step=0.5))

    @metrics.tokenizer_timer()
    async def tokenize(text: str) -> list[int]:
        return [len(text)]

    assert await tokenize("abcd") == [4]
    assert value(registry, f"{TOKENIZER}_count", ENGINE_SOURCE) == 1.0
    assert value(registry, f"{TOKENIZER}_sum", ENGINE_SOURCE) == 0.5


async def test_tokenizer_timer_async_with_and_failures() -> None:
    registry = CollectorRegistry()
    metrics = InferenceMetrics("m", registry=registry, clock=FakeClock(0.0, step=0.25))
    async with metrics.tokenizer_timer():
        pass

    @metrics.tokenizer_timer()
    def broken() -> None:
        raise RuntimeError("tokenizer failed")

    with pytest.raises(RuntimeError):
        broken()
    assert value(registry, f"{TOKENIZER}_count", ENGINE_SOURCE) == 2.0
    assert value(registry, f"{TOKENIZER}_sum", ENGINE_SOURCE) == 0.5


def test_one_timer_nests() -> None:
    registry = CollectorRegistry()
    metrics = InferenceMetrics("m", registry=registry, clock=FakeClock(0.0, step=1.0))
    timer = metrics.tokenizer_timer()
    with timer, timer:  # starts 1, 2; ends 3 (observes 1), 4 (observes 3)
        pass
    assert value(registry, f"{TOKENIZER}_count", ENGINE_SOURCE) == 2.0
    assert value(registry, f"{TOKENIZER}_sum", ENGINE_SOURCE) == 4.0


# --- H2D timer with a fake torch -----------------------------------------------------------


class FakeGpu:
    """A GPU whose copies take ``copy_ms`` and whose events complete when told to."""

    def __init__(self, available: bool = True, copy_ms: float = 2.5) -> None:
        self.available = available
        self.copy_ms = copy_ms
        self.now_ms = 0.0
        self.events: list[FakeEvent] = []


class FakeEvent:
    gpu: FakeGpu

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at: float | None = None
        self.done = False
        self.gpu.events.append(self)

    def record(self) -> None:
        self.at = self.gpu.now_ms

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None
        assert end.at is not None
        return end.at - self.at


class FakeTensor:
    def __init__(self, gpu: FakeGpu, device: str = "cpu") -> None:
        self.gpu = gpu
        self.device = device
        self.calls: list[tuple[str, bool]] = []

    def to(self, device: str, non_blocking: bool = False) -> FakeTensor:
        self.calls.append((device, non_blocking))
        self.gpu.now_ms += self.gpu.copy_ms
        return FakeTensor(self.gpu, device)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    fake_gpu = FakeGpu()
    event = type("Event", (FakeEvent,), {"gpu": fake_gpu})
    torch = ModuleType("torch")
    torch.cuda = SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: fake_gpu.available, Event=event
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    return fake_gpu


def h2d(registry: CollectorRegistry, suffix: str, labels: dict[str, str] | None = None) -> Any:
    return registry.get_sample_value(
        f"inference_h2d_copy_seconds_{suffix}", {"model": "m", **(labels or {})}
    )


def test_h2d_copy_observed_once_the_copy_completes(gpu: FakeGpu) -> None:
    registry = CollectorRegistry()
    timer = H2DTimer("m", registry=registry)
    tensor = FakeTensor(gpu)

    moved = timer.copy(tensor, "cuda:0", non_blocking=True)
    assert moved.device == "cuda:0"
    assert tensor.calls == [("cuda:0", True)]
    assert timer.pending == 1
    assert h2d(registry, "count") == 0.0  # the end event has not completed

    for event in gpu.events:
        event.done = True
    assert timer.flush() == 1
    assert timer.pending == 0
    assert h2d(registry, "count") == 1.0
    assert h2d(registry, "sum") == 0.0025
    assert h2d(registry, "bucket", {"le": "0.0025"}) == 1.0
    assert h2d(registry, "bucket", {"le": "0.001"}) == 0.0


def test_h2d_measure_and_flush_wait(gpu: FakeGpu) -> None:
    registry = CollectorRegistry()
    timer = H2DTimer("m", registry=registry)
    with timer.measure():
        FakeTensor(gpu).to("cuda")
        FakeTensor(gpu).to("cuda")
    timer.copy(FakeTensor(gpu))
    assert timer.pending == 2
    assert timer.flush(wait=True) == 2
    assert h2d(registry, "count") == 2.0
    assert h2d(registry, "sum") == pytest.approx(0.0075)


def test_h2d_pending_is_bounded(gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_h2d, "MAX_PENDING", 2)
    registry = CollectorRegistry()
    timer = H2DTimer("m", registry=registry)
    for _ in range(3):
        timer.copy(FakeTensor(gpu))
    assert timer.pending == 2
    assert h2d(registry, "count") == 1.0


def test_h2d_without_cuda_times_on_the_host(gpu: FakeGpu) -> None:
    gpu.available = False
    registry = CollectorRegistry()
    timer = H2DTimer("m", registry=registry, clock=FakeClock(0.0, step=0.125))
    moved = timer.copy(FakeTensor(gpu), "cpu")
    assert moved.device == "cpu"
    assert gpu.events == []
    assert timer.pending == 0
    assert h2d(registry, "count") == 1.0
    assert h2d(registry, "sum") == 0.125


def test_h2d_timers_of_several_models_share_a_registry(gpu: FakeGpu) -> None:
    gpu.available = False
    registry = CollectorRegistry()
    H2DTimer("a", registry=registry).copy(FakeTensor(gpu))
    H2DTimer("b", registry=registry).copy(FakeTensor(gpu))
    for model in ("a", "b"):
        count = registry.get_sample_value("inference_h2d_copy_seconds_count", {"model": model})
        assert count == 1.0


# --- torch stays out of the sidecar --------------------------------------------------------


def test_importing_instrument_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import exporter.instrument, exporter.instrument.torch_h2d\n"
        "from exporter.instrument.torch_h2d import H2DTimer\n"
        "from prometheus_client import CollectorRegistry\n"
        "H2DTimer('m', registry=CollectorRegistry())\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr


def _module_level_imports(tree: ast.AST) -> list[str]:
    """Modules imported outside any function body."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_no_module_level_torch_import_under_exporter() -> None:
    # exporter/lab is the optional `reference` extra (the torch engine); the sidecar never
    # imports it, which test_sidecar_never_imports_the_reference_engine checks.
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "exporter").rglob("*.py"))
        if "lab" not in path.relative_to(ROOT / "exporter").parts
        and any(
            name == "torch" or name.startswith("torch.")
            for name in _module_level_imports(ast.parse(path.read_text("utf-8")))
        )
    ]
    assert offenders == []


def test_sidecar_never_imports_the_reference_engine() -> None:
    code = (
        "import sys, exporter.cli, exporter.server.app, exporter.collectors, exporter.diagnose;"
        "from exporter.collectors import build_collectors;"
        "from exporter.collectors import default_settings;"
        "build_collectors(default_settings());"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('exporter.lab.refengine')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
