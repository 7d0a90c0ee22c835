"""The load generator against the reference engine, and its command line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from support.refengine import Engine

from exporter.lab.loadgen import completions_url, percentiles
from exporter.lab.processes import child_pythonpath, wait_until


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    eng = Engine(tmp_path_factory.mktemp("engine") / "engine.log")
    yield eng
    eng.stop()


def load(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", "load", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin"},
    )


def test_completions_url() -> None:
    assert completions_url("http://h:8000") == "http://h:8000/v1/completions"
    assert completions_url("http://h:8000/v1/") == "http://h:8000/v1/completions"
    assert completions_url("http://h/x/v1/completions") == "http://h/x/v1/completions"
    with pytest.raises(ValueError, match="not an http"):
        completions_url("h:8000")


def test_percentiles() -> None:
    assert percentiles([]) == {}
    p = percentiles([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (p["p50"], p["mean"]) == (3.0, 3.0)
    assert p["p90"] == pytest.approx(4.6)


def test_open_loop_load_and_summary(engine: Engine) -> None:
    out = load(
        "--url", engine.url, "--rate", "8", "--prompt-tokens", "64", "--output-tokens", "8",
        "--duration", "3s", "--output", "json", "--progress", "off",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["completed"] >= 5
    assert summary["failed"] == 0
    assert summary["sent"] == summary["completed"] + summary["cancelled"]
    assert 0 < summary["ttft_s"]["p50"] < summary["e2e_s"]["p50"]
    assert summary["itl_s"]["p50"] > 0
    assert summary["output_tokens_per_s"] > 0


def test_closed_loop_keeps_its_concurrency_and_times_each_token(engine: Engine) -> None:
    """--concurrency: a closed loop of exactly --requests requests, and TPOT per request."""
    out = load(
        "--url", engine.url, "--concurrency", "2", "--requests", "6", "--prompt-tokens", "32",
        "--output-tokens", "12", "--output", "json", "--progress", "off",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert (summary["sent"], summary["completed"], summary["concurrency"]) == (6, 6, 2)
    assert summary["offered_rate"] == 1.0  # unused by a closed loop; the default
    tpot = summary["tpot_s"]["p50"]
    assert tpot > 0 and 10 * tpot < summary["e2e_s"]["p50"]
    assert "1 open at a time" in load(
        "--url", engine.url, "--concurrency", "1", "--requests", "1", "--output-tokens", "2",
        "--progress", "off",
    ).stdout  # fmt: skip


def _completed(engine: Engine) -> float:
    """Requests the engine finished so far (every finish reason)."""
    status, body = engine.request("GET", "/metrics", timeout=5)
    assert status == 200
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith("vllm:request_success_total{")
    )


def test_sigterm_prints_the_summary_so_far(engine: Engine) -> None:
    before = _completed(engine)
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "exporter.cli", "load", "--url", engine.url, "--rate", "4",
            "--prompt-tokens", "32", "--output-tokens", "4", "--duration", "10m",
            "--output", "json", "--progress", "off",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip

    # the load generator is running (its handler installed) once one of its requests finished
    wait_until(lambda: _completed(engine) > before, 60, "a request of the load generator")
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert json.loads(stdout)["completed"] >= 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "0"], "--rate"),
        (["--rate", "2", "--concurrency", "2"], "not both"),
        (["--requests", "3"], "--requests: "),
        (["--concurrency", "9", "--max-in-flight", "4"], "--concurrency: "),
        (["--duration", "soon"], "--duration: "),
        (["--url", "ftp://x"], "not an http"),
        (["--url", "http://127.0.0.1:9", "--duration", "1s"], "cannot reach"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], message: str) -> None:
    out = load(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
