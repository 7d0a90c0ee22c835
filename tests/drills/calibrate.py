"""Calibration: what the engine serves on this machine, measured before a drill injects.

A drill's stack starts with its injection present but unsized (size zero, or an admission cap
that is the injection itself); then, before the load, this module measures the engine with the
load generator's closed loop (``load --concurrency``), as a client would see it:

- one sequence at a time (the drill's prompt, at least :data:`ONE_REQUESTS` requests and
  :data:`MEASURE_S` seconds): the time to first token (prefill and first token) and the time
  per output token after it (the decode step of one sequence);
- where the drill needs it, the engine's full batch at once (a request per slot, each replaced
  as it finishes, the drill's prompt, as long as the one-at-a-time measurement): the decode
  step of a full batch, the prefills of its newcomers included;
- on the reference engine, the sidecar's tokenizer probe (its ~512-token prompt and a 1-token
  one, :data:`PROBES` times each): how long tokenizing the probe takes, and its tokens;
- on a disaggregated pair, the KV cache one request moves (the decode engine's NIXL byte
  counter over the one-at-a-time requests);
- and, for the report, what the node was doing meanwhile: its share of CPU time in softirq
  (the calibration's own loopback requests make a little, a shared node's neighbours may
  make more), its load average, and the share of a core one busy thread gets.

:mod:`drills.sizing` turns these into the drill's load and injection sizes. The measurement
takes about six seconds at the engine's own speed (up to half a minute with its model worker
8x slower on a busy 2-core machine, whose full batch's prefills alone take that long).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from exporter.collectors.tokenizer import default_prompt, request_body
from exporter.lab import loadgen
from exporter.lab.processes import http_get

ONE_REQUESTS = 3  # one at a time: the median of three at least
MEASURE_S = 3.0  # each measurement lasts this long at least (medians over a few seconds)
CAL_OUTPUT_TOKENS = 16  # tokens per calibration request: 15 decode steps each
PROBES = 5
THREAD_PROBE_S = 0.5  # the busy loop that measures the share of a core one thread gets
TIMEOUT_S = 120.0


class CalibrationError(RuntimeError):
    """The engine did not serve the calibration's requests: the message says what failed."""


@dataclass(frozen=True)
class Measured:
    """One closed-loop measurement: ``concurrency`` requests open at a time."""

    concurrency: int
    completed: int
    prompt_tokens: int
    output_tokens: int
    ttft_s: float  # median time to first token
    tpot_s: float | None  # median time per output token after the first (None: no stream)
    e2e_s: float  # median end-to-end latency
    took_s: float

    @property
    def step_s(self) -> float:
        """The decode step a request saw (timed whole: its time per token but the first)."""
        if self.tpot_s is not None:
            return self.tpot_s
        return self.e2e_s / max(1, self.output_tokens - 1)


@dataclass
class Calibration:
    """What one drill measured before it sized its load and injection."""

    one: Measured  # one sequence at a time, the drill's prompt
    full: Measured | None = None  # the engine's full batch at once (short prompts)
    tokenizer_s: float | None = None  # the sidecar's probe: long minus short round trip
    probe_tokens: int | None = None
    kv_bytes: float | None = None  # disaggregated: KV cache bytes one request moves
    took_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def measure(
    url: str,
    *,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int = CAL_OUTPUT_TOKENS,
    requests: int | None = None,
    api: str = "openai",
    served_model: str = "",
    per_token: bool = True,
) -> Measured:
    """At least ``requests`` (default: one per slot) and :data:`MEASURE_S` seconds of a
    closed loop of ``concurrency``; the medians of every request that completed.
    ``served_model``: the model to ask for (default: the server's first); ``per_token``:
    whether the stream times each token (else only whole requests count)."""
    needed = requests or concurrency
    base = loadgen.LoadConfig(
        url=loadgen.completions_url(url) if api == "openai" else url,
        rate=1.0,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        duration=TIMEOUT_S,
        timeout=TIMEOUT_S,
        drain=0.0,
        api=api,
        concurrency=concurrency,
        requests=needed,
        seed=7,
        model=served_model,
    )
    began = time.monotonic()
    done: list[loadgen.RequestResult] = []
    errors: list[str] = []
    rounds = [base]
    while rounds:
        cfg = rounds.pop()
        state = loadgen.LiveState()
        try:
            asyncio.run(loadgen.run(cfg, state=state))
        except ValueError as err:
            raise CalibrationError(f"at {concurrency} at a time: {err}") from None
        done += [r for r in state.results if r.ok]
        errors += [r.error for r in state.results if not r.ok]
        left = MEASURE_S - (time.monotonic() - began)
        if cfg is base and left > 0.5:  # then until MEASURE_S (the requests open are dropped)
            rounds.append(replace(base, requests=0, duration=left, seed=8))
    took = time.monotonic() - began
    # A request the engine dropped (a busy llama-server closes a connection now and then)
    # leaves the others to measure it; none at all is a failure.
    if not done or len(done) < needed - len(errors):
        raise CalibrationError(
            f"at {concurrency} at a time: {len(done)} of {needed} requests completed in "
            f"{took:.0f} s (errors: {', '.join(sorted(set(errors))) or 'none'})"
        )
    steps = [t for r in done if (t := loadgen.tpot(r)) is not None]
    return Measured(
        concurrency=concurrency,
        completed=len(done),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        ttft_s=statistics.median(r.ttft for r in done if r.ttft is not None),
        tpot_s=statistics.median(steps) if steps and per_token else None,
        e2e_s=statistics.median(r.e2e for r in done if r.e2e is not None),
        took_s=round(took, 2),
    )


def _post(url: str, body: dict[str, Any], timeout: float = 10.0) -> tuple[float, bytes]:
    import urllib.request  # noqa: PLC0415

    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    began = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data = resp.read()
    return time.perf_counter() - began, data


def tokenizer_probe(url: str, model: str) -> tuple[float, int]:
    """The sidecar's tokenizer probe by hand: the bundled ~512-token prompt's round trip minus a
    1-token one's (medians of :data:`PROBES`), and the prompt's token count."""

    text = default_prompt()
    longs, shorts = [], []
    tokens = 0
    for _ in range(PROBES):
        took, body = _post(url + "/tokenize", request_body("vllm", text, model))
        longs.append(took)
        tokens = int(json.loads(body)["count"])
        shorts.append(_post(url + "/tokenize", request_body("vllm", "Hi", model))[0])
    return max(0.0, statistics.median(longs) - statistics.median(shorts)), tokens


def counter(url: str, name: str) -> float:
    """The sum of one series of an engine's /metrics (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    status, body = http_get(url + "/metrics", 10)
    if status != 200:
        raise CalibrationError(f"{url}/metrics answered {status}")
    return sum(
        float(s.value)
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == name
    )


def calibrate(
    url: str,
    *,
    prompt_tokens: int,
    full: int | None,
    api: str = "openai",
    output_tokens: int = CAL_OUTPUT_TOKENS,
    model: str | None = None,
    disaggregated: bool = False,
    served_model: str = "",
    per_token: bool = True,
) -> Calibration:
    """One sequence at a time with the drill's prompt, then (``full``) that many at once; the
    tokenizer probe where ``model`` (a vLLM-like /tokenize) is given; the KV bytes per request
    on a disaggregated pair. ``served_model``: the model to load (default: the server's
    first); ``per_token``: the engine's stream times each token (the reference engine's
    does; llama-server holds back the text of a token that ends inside a character, and
    Triton answers whole requests: both are timed by whole requests)."""
    began = time.monotonic()
    node_before = node_ticks()
    kv_before = (
        (counter(url, XFER_BYTES), counter(url, XFER_COUNT)) if disaggregated else (0.0, 0.0)
    )
    one = measure(
        url,
        concurrency=1,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        requests=ONE_REQUESTS,
        api=api,
        served_model=served_model,
        per_token=per_token,
    )
    cal = Calibration(one=one)
    if disaggregated:
        moved = counter(url, XFER_BYTES) - kv_before[0]
        count = counter(url, XFER_COUNT) - kv_before[1]
        if count <= 0:
            raise CalibrationError("no KV transfer in the calibration's requests")
        cal.kv_bytes = moved / count
    if full is not None and full > 1:
        cal.full = measure(
            url,
            concurrency=full,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            api=api,
            served_model=served_model,
            per_token=per_token,
        )
    if model is not None:
        cal.tokenizer_s, cal.probe_tokens = tokenizer_probe(url, model)
    cal.took_s = round(time.monotonic() - began, 1)
    cal.extra["node_softirq"] = round(softirq_share(node_before, node_ticks()), 4)
    cal.extra["load_average"] = float(Path("/proc/loadavg").read_text().split()[0])
    cal.extra["thread_share"] = round(thread_share(), 3)
    return cal


def thread_share(seconds: float = THREAD_PROBE_S) -> float:
    """The share of one core a thread that never waits gets now: a busy loop's CPU time over
    its wall time. Near 1 on a machine with a core to spare; less where the node's other
    runnable threads (its neighbours', the drill's own) outnumber its cores."""
    began, cpu = time.monotonic(), time.thread_time()
    while time.monotonic() - began < seconds:
        pass
    return (time.thread_time() - cpu) / (time.monotonic() - began)


def node_ticks() -> tuple[float, float]:
    """(softirq, all) CPU ticks of the whole node so far, from ``/proc/stat``."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu "):
            values = [float(v) for v in line.split()[1:8]]
            return values[6], sum(values)
    return 0.0, 0.0


def softirq_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The node's share of CPU time in softirq between two :func:`node_ticks`."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


XFER_BYTES = "vllm:nixl_bytes_transferred_sum"
XFER_COUNT = "vllm:nixl_xfer_time_seconds_count"
