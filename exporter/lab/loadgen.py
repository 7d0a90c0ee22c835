"""``inference-bottleneck-exporter load``: open-loop load on an OpenAI-compatible server.

Requests arrive as a Poisson process at ``--rate`` per second for ``--duration`` whatever the
server does (open loop: a slow server gets a growing backlog, as in production, instead of a
politely waiting client). Each is a streamed ``POST /v1/completions`` of about
``--prompt-tokens`` prompt tokens (text of random corpus words, calibrated once through the
server's ``/tokenize`` when it has one) asking for exactly ``--output-tokens`` tokens
(``ignore_eos``). It measures what a client sees: time to first token (TTFT), the gaps
between streamed chunks (ITL) and end-to-end latency, and prints their percentiles.

With ``--concurrency N`` the load is a closed loop instead: N requests are open at all times
(a new one is sent as one finishes) until ``--requests`` have been sent or ``--duration``
has passed - what a server serves at a given concurrency, as the drills measure it before
they size their load (``tests/drills``). The summary then says the concurrency, and the
requests per second completed are the server's capacity there. TPOT, the time per output
token after the first (``(e2e - TTFT) / (tokens - 1)`` of each request), is the decode step a
request saw, whatever the server coalesces into one streamed chunk.

Every loop is bounded: arrivals stop at ``--duration``, at most ``--max-in-flight`` requests
are open (an arrival beyond that is counted as dropped), every request has ``--timeout``, and
requests still open ``--drain`` after the last arrival are cancelled and counted.

Needs only aiohttp (no torch); works against vLLM, SGLang's and TGI's OpenAI APIs and the
reference engine. Exit code 0, 1 when no request succeeded, 2 for usage or connection errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import NoReturn, TextIO
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from exporter.config import ArgumentParser, parse_duration, usage_error

PROG = "inference-bottleneck-exporter load"
DEFAULT_TOKENS_PER_WORD = 1.3
MAX_RATE = 10000.0

# Words for prompts (the reference engine's corpus vocabulary has them all as tokens).
WORDS = [
    "the",
    "river",
    "lighthouse",
    "keeper",
    "evening",
    "weather",
    "ledger",
    "village",
    "school",
    "winter",
    "bread",
    "flour",
    "water",
    "dough",
    "market",
    "apples",
    "pears",
    "cheese",
    "honey",
    "flowers",
    "mountain",
    "weather",
    "morning",
    "summit",
    "train",
    "station",
    "carriage",
    "fields",
    "conductor",
    "workshop",
    "hammer",
    "chisel",
    "bench",
    "numbers",
    "tokens",
    "request",
    "queue",
    "tokenizer",
    "prefill",
    "decode",
    "batch",
    "memory",
    "bandwidth",
    "scheduler",
    "garden",
    "window",
    "office",
    "lights",
    "questions",
    "answers",
    "logs",
    "metrics",
    "coast",
    "harbour",
    "boats",
    "driver",
    "passengers",
    "simple",
    "slow",
    "fast",
    "warm",
    "cold",
    "green",
    "grey",
    "gold",
    "bright",
    "quiet",
    "heavy",
    "small",
    "wide",
    "long",
    "short",
    "every",
    "hour",
    "minute",
    "second",
    "week",
    "month",
    "year",
    "day",
    "night",
    "light",
    "water",
    "stone",
    "road",
    "bridge",
]


def _fail(message: str) -> NoReturn:
    usage_error(PROG, message)


@dataclass(frozen=True)
class LoadConfig:
    url: str  # the completions endpoint
    rate: float
    prompt_tokens: int
    output_tokens: int
    duration: float
    model: str = ""
    seed: int = 0
    max_in_flight: int = 512
    timeout: float = 300.0
    drain: float = 30.0
    temperature: float = 1.0
    api: str = "openai"  # or "triton": KServe v2 generate, one JSON answer per request
    concurrency: int = 0  # >0: closed loop, this many requests open at all times (no rate)
    requests: int = 0  # closed loop: stop sending after this many (0: at the duration)


@dataclass
class RequestResult:
    sent_at: float
    ok: bool = False
    error: str = ""
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float | None = None
    output_tokens: int = 0


@dataclass
class Summary:
    duration_s: float
    offered_rate: float
    sent: int
    completed: int
    failed: int
    dropped: int
    cancelled: int
    achieved_rate: float
    output_tokens_per_s: float
    ttft_s: dict[str, float]
    itl_s: dict[str, float]
    e2e_s: dict[str, float]
    errors: dict[str, int]
    tpot_s: dict[str, float] = field(default_factory=dict)
    concurrency: int = 0  # closed loop: the requests kept open (0: open loop at the rate)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    """Linear-interpolated percentiles (``p50`` ...); empty when there are no values."""
    if not values:
        return {}
    ordered = sorted(values)
    out: dict[str, float] = {}
    for q in qs:
        pos = (len(ordered) - 1) * q / 100.0
        low = math.floor(pos)
        high = min(low + 1, len(ordered) - 1)
        out[f"p{q:g}"] = ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
    out["mean"] = sum(ordered) / len(ordered)
    return out


def completions_url(url: str) -> str:
    """``http://host:port`` (or ``.../v1``) -> ``.../v1/completions``; a full URL stays."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--url: {url!r} is not an http(s) URL")
    path = parts.path.rstrip("/")
    if not path.endswith("/completions"):
        path = (path if path.endswith("/v1") else path + "/v1") + "/completions"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _base_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--url: {url!r} is not an http(s) URL")
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def _sibling(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class PromptMaker:
    """Prompts of random words, sized by a tokens-per-word ratio measured once."""

    def __init__(self, rng: random.Random, tokens_per_word: float) -> None:
        self.rng = rng
        self.tokens_per_word = tokens_per_word

    def make(self, tokens: int, index: int) -> str:
        words = max(1, round(tokens / self.tokens_per_word))
        # A unique head keeps prefix caches from turning the load into cache hits.
        head = f"Request {index}:"
        return head + " " + " ".join(self.rng.choice(WORDS) for _ in range(words - 2))


async def calibrate(session: aiohttp.ClientSession, cfg: LoadConfig) -> tuple[str, float]:
    """The model name (from ``/v1/models`` unless given) and tokens per word (``/tokenize``);
    for Triton the first ready model of its repository index, one token per word."""
    model = cfg.model
    timeout = aiohttp.ClientTimeout(total=10)
    if cfg.api == "triton":
        return model or await _triton_model(session, cfg, timeout), 1.0
    if not model:
        async with session.get(_sibling(cfg.url, "/v1/models"), timeout=timeout) as resp:
            if resp.status != 200:
                raise ValueError(f"GET /v1/models answered {resp.status}; give --model")
            data = await resp.json(content_type=None)
            models = data.get("data") or []
            if not models:
                raise ValueError("the server lists no model; give --model")
            model = str(models[0]["id"])
    sample = " ".join(random.Random(cfg.seed + 1).choice(WORDS) for _ in range(200))
    ratio = DEFAULT_TOKENS_PER_WORD
    # vLLM's and SGLang's /tokenize take "prompt"; llama.cpp's takes "content" and answers
    # an empty token list to a body without it.
    for body in ({"prompt": sample, "model": model}, {"content": sample}):
        with contextlib.suppress(
            aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError
        ):
            async with session.post(
                _sibling(cfg.url, "/tokenize"), json=body, timeout=timeout
            ) as resp:
                if resp.status == 200:
                    data = await resp.json(content_type=None)
                    count = int(data.get("count") or len(data["tokens"]))
                    if count:
                        return model, max(0.2, count / 200)
    return model, ratio


async def _triton_model(
    session: aiohttp.ClientSession, cfg: LoadConfig, timeout: aiohttp.ClientTimeout
) -> str:
    async with session.post(
        _sibling(cfg.url, "/v2/repository/index"), json={"ready": True}, timeout=timeout
    ) as resp:
        if resp.status != 200:
            raise ValueError(f"POST /v2/repository/index answered {resp.status}; give --model")
        models = await resp.json(content_type=None)
    if not models:
        raise ValueError("the server lists no ready model; give --model")
    return str(models[0]["name"])


async def triton_request(
    session: aiohttp.ClientSession, cfg: LoadConfig, model: str, prompt: str
) -> RequestResult:
    """One request to Triton's generate endpoint (KServe v2 extension): the whole answer at
    once, so the time to first token is the end-to-end latency and there is no ITL."""
    result = RequestResult(sent_at=time.monotonic())
    url = _sibling(cfg.url, f"/v2/models/{model}/generate")
    body = {"text_input": prompt, "max_tokens": cfg.output_tokens}
    try:
        async with session.post(
            url, json=body, timeout=aiohttp.ClientTimeout(total=cfg.timeout)
        ) as resp:
            data = await resp.read()
            if resp.status != 200:
                result.error = f"HTTP {resp.status}"
                return result
            json.loads(data)["text_output"]
    except TimeoutError:
        result.error = "timeout"
        return result
    except aiohttp.ClientError as err:
        result.error = type(err).__name__
        return result
    except (json.JSONDecodeError, ValueError, KeyError, TypeError):
        result.error = "bad answer"
        return result
    result.ok = True
    result.e2e = result.ttft = time.monotonic() - result.sent_at
    result.output_tokens = cfg.output_tokens
    return result


async def one_request(
    session: aiohttp.ClientSession, cfg: LoadConfig, model: str, prompt: str, seed: int
) -> RequestResult:
    if cfg.api == "triton":
        return await triton_request(session, cfg, model, prompt)
    result = RequestResult(sent_at=time.monotonic())
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": cfg.output_tokens,
        "temperature": cfg.temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    last = result.sent_at
    chunks = 0
    try:
        async with session.post(
            cfg.url, json=body, timeout=aiohttp.ClientTimeout(total=cfg.timeout)
        ) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}"
                return result
            buffer = b""
            async for data in resp.content.iter_any():
                buffer += data
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    now = time.monotonic()
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            result.ok = not result.error
                            result.e2e = now - result.sent_at
                            continue
                        chunk = json.loads(payload)
                        if "error" in chunk:
                            result.error = "stream error"
                            continue
                        usage = chunk.get("usage")
                        if usage:
                            result.output_tokens = int(usage.get("completion_tokens", 0))
                        choices = chunk.get("choices") or []
                        if choices and (choices[0].get("text") or "") != "":
                            if chunks == 0:
                                result.ttft = now - result.sent_at
                            else:
                                result.itl.append(now - last)
                            last = now
                            chunks += 1
            if not result.ok and not result.error:
                result.error = "stream ended without [DONE]"
    except TimeoutError:
        result.error = "timeout"
    except aiohttp.ClientError as err:
        result.error = type(err).__name__
    except (json.JSONDecodeError, ValueError):
        result.error = "bad stream"
    if result.ok and result.output_tokens == 0:
        result.output_tokens = chunks
    return result


class Progress:
    """One status line, rewritten in place on a terminal, or a line every 10 s otherwise."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self.tty = stream.isatty()
        self._last_line = 0.0

    def show(
        self, elapsed: float, total: float, *, sent: int, done: int, failed: int, open_: int
    ) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not self.tty and now - self._last_line < 10:
            return
        self._last_line = now
        width = 24
        filled = min(width, int(width * elapsed / total)) if total > 0 else width
        bar = "#" * filled + "." * (width - filled)
        line = (
            f"[{bar}] {elapsed:5.0f}/{total:.0f}s  sent {sent}  done {done}  "
            f"failed {failed}  in flight {open_}"
        )
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def end(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


@dataclass
class LiveState:
    """What a running load has done so far (read by ``demo``'s live view)."""

    sent: int = 0
    dropped: int = 0
    results: list[RequestResult] = field(default_factory=list)


async def run(
    cfg: LoadConfig,
    progress: Progress | None = None,
    *,
    stop: asyncio.Event | None = None,
    state: LiveState | None = None,
) -> Summary:
    """Run the load; raises ValueError (one line) when the server cannot be used.

    Setting ``stop`` ends the arrivals early and cancels the open requests (their results are
    not counted); the summary covers what finished."""
    stop = stop or asyncio.Event()
    live = state or LiveState()
    rng = random.Random(cfg.seed)
    connector = aiohttp.TCPConnector(limit=cfg.max_in_flight + 8)
    async with aiohttp.ClientSession(connector=connector) as session:
        try:
            model, ratio = await calibrate(session, cfg)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise ValueError(f"cannot reach {cfg.url}: {err or type(err).__name__}") from None
        prompts = PromptMaker(random.Random(cfg.seed + 2), ratio)
        results = live.results
        tasks: set[asyncio.Task[RequestResult]] = set()
        start = time.monotonic()
        next_at = start + (rng.expovariate(cfg.rate) if cfg.concurrency <= 0 else 0.0)
        end = start + cfg.duration

        def collect(task: asyncio.Task[RequestResult]) -> None:
            tasks.discard(task)
            if not task.cancelled():
                results.append(task.result())

        def report() -> None:
            if progress is not None:
                done = sum(1 for r in results if r.ok)
                progress.show(
                    min(cfg.duration, time.monotonic() - start),
                    cfg.duration,
                    sent=live.sent,
                    done=done,
                    failed=len(results) - done,
                    open_=len(tasks),
                )

        def send() -> None:
            prompt = prompts.make(cfg.prompt_tokens, live.sent)
            task = asyncio.create_task(
                one_request(session, cfg, model, prompt, rng.randrange(2**31))
            )
            task.add_done_callback(collect)
            tasks.add(task)
            live.sent += 1

        if cfg.concurrency > 0:
            await _closed_loop(
                cfg, tasks=tasks, live=live, send=send, report=report, stop=stop, end=end
            )
        while cfg.concurrency <= 0 and next_at < end and not stop.is_set():
            while not stop.is_set():
                wait = next_at - time.monotonic()
                if wait <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=min(wait, 0.5))
                report()
            if stop.is_set():
                break
            if len(tasks) >= cfg.max_in_flight:
                live.dropped += 1
            else:
                send()
            next_at += rng.expovariate(cfg.rate)
        drain_end = time.monotonic() + (0.0 if stop.is_set() else cfg.drain)
        while tasks and time.monotonic() < drain_end and not stop.is_set():
            await asyncio.wait(set(tasks), timeout=min(0.5, drain_end - time.monotonic()))
            report()
        cancelled = len(tasks)
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.wait(set(tasks), timeout=5)
        report()
        if progress is not None:
            progress.end()
        elapsed = time.monotonic() - start
    return summarise(
        cfg, results, sent=live.sent, dropped=live.dropped, cancelled=cancelled, elapsed=elapsed
    )


async def _closed_loop(
    cfg: LoadConfig,
    *,
    tasks: set[asyncio.Task[RequestResult]],
    live: LiveState,
    send: Callable[[], None],
    report: Callable[[], None],
    stop: asyncio.Event,
    end: float,
) -> None:
    """Keep ``cfg.concurrency`` requests open until ``cfg.requests`` are sent (or ``end``)."""
    while not stop.is_set() and time.monotonic() < end:
        while len(tasks) < cfg.concurrency and (cfg.requests <= 0 or live.sent < cfg.requests):
            send()
        if not tasks:
            return
        left = end - time.monotonic()
        if left <= 0:
            return
        await asyncio.wait(set(tasks), timeout=min(0.5, left), return_when=asyncio.FIRST_COMPLETED)
        report()


def tpot(result: RequestResult) -> float | None:
    """Time per output token after the first: the decode step this request saw."""
    if result.ttft is None or result.e2e is None or result.output_tokens < 2:
        return None
    if result.e2e <= result.ttft:  # one answer for the whole request (Triton)
        return None
    return (result.e2e - result.ttft) / (result.output_tokens - 1)


def summarise(
    cfg: LoadConfig,
    results: Sequence[RequestResult],
    *,
    sent: int,
    dropped: int,
    cancelled: int,
    elapsed: float,
) -> Summary:
    good = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    itl = [gap for r in good for gap in r.itl]
    return Summary(
        duration_s=round(elapsed, 3),
        offered_rate=cfg.rate,
        sent=sent,
        completed=len(good),
        failed=len(results) - len(good),
        dropped=dropped,
        cancelled=cancelled,
        achieved_rate=round(len(good) / elapsed, 3) if elapsed > 0 else 0.0,
        output_tokens_per_s=round(sum(r.output_tokens for r in good) / elapsed, 1)
        if elapsed > 0
        else 0.0,
        ttft_s=percentiles([r.ttft for r in good if r.ttft is not None]),
        itl_s=percentiles(itl),
        e2e_s=percentiles([r.e2e for r in good if r.e2e is not None]),
        errors=errors,
        tpot_s=percentiles([t for r in good if (t := tpot(r)) is not None]),
        concurrency=cfg.concurrency,
    )


def format_summary(s: Summary) -> str:
    def row(name: str, values: dict[str, float]) -> str:
        if not values:
            return f"  {name:<5} -"
        cells = "  ".join(f"{k} {1000 * values[k]:9.1f} ms" for k in ("p50", "p90", "p99"))
        return f"  {name:<5} {cells}"

    offered = (
        f"{s.concurrency} open at a time" if s.concurrency > 0 else f"{s.offered_rate:g}/s offered"
    )
    lines = [
        f"requests: {s.sent} sent, {s.completed} completed, {s.failed} failed, "
        f"{s.dropped} dropped (over --max-in-flight), {s.cancelled} cancelled at the end",
        f"rate: {offered}, {s.achieved_rate:g}/s completed; "
        f"{s.output_tokens_per_s:g} output tokens/s over {s.duration_s:.1f}s",
        row("TTFT", s.ttft_s),
        row("TPOT", s.tpot_s),
        row("ITL", s.itl_s),
        row("e2e", s.e2e_s),
    ]
    if s.errors:
        lines.append("errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(s.errors.items())))
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog=PROG,
        description="Open-loop (Poisson) load on an OpenAI-compatible completions endpoint.",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server or completions URL")
    p.add_argument(
        "--rate", type=float, default=None, help="requests per second, open loop (default 1)"
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="closed loop instead of --rate: keep this many requests open at all times",
    )
    p.add_argument(
        "--requests",
        type=int,
        default=0,
        help="closed loop: send this many requests, then drain (default: until --duration)",
    )
    p.add_argument("--prompt-tokens", type=int, default=512, help="prompt size (default 512)")
    p.add_argument("--output-tokens", type=int, default=256, help="tokens to generate (256)")
    p.add_argument("--duration", default="60s", help="how long requests arrive (default 60s)")
    p.add_argument("--model", default="", help="model name (default: the server's first)")
    p.add_argument("--seed", type=int, default=0, help="arrivals and prompts seed")
    p.add_argument("--max-in-flight", type=int, default=512, help="open requests at most")
    p.add_argument("--timeout", default="5m", help="per-request timeout (default 5m)")
    p.add_argument("--drain", default="30s", help="wait for open requests after (default 30s)")
    p.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="progress line on stderr (auto: on a terminal)",
    )
    p.add_argument("--output", choices=("text", "json"), default="text", help="summary format")
    p.add_argument(
        "--api",
        choices=("openai", "triton"),
        default="openai",
        help="openai: streamed /v1/completions; triton: /v2/models/MODEL/generate",
    )
    return p


def _duration(flag: str, text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as err:
        _fail(f"{flag}: {err}")


def config_from(args: argparse.Namespace) -> LoadConfig:
    try:
        url = completions_url(args.url) if args.api == "openai" else _base_url(args.url)
    except ValueError as err:
        _fail(str(err))
    duration = _duration("--duration", args.duration)
    timeout = _duration("--timeout", args.timeout)
    drain = _duration("--drain", args.drain)
    if args.concurrency and args.rate is not None:
        _fail("--rate and --concurrency: an open loop or a closed one, not both")
    rate = 1.0 if args.rate is None else args.rate
    if not 0 < rate <= MAX_RATE:
        _fail(f"--rate: must be more than 0 and at most {MAX_RATE:g}")
    if not 0 <= args.concurrency <= args.max_in_flight:
        _fail(f"--concurrency: must be from 0 to --max-in-flight ({args.max_in_flight})")
    if args.requests < 0 or (args.requests and not args.concurrency):
        _fail("--requests: a count of at least 0, for a closed loop (--concurrency)")
    if not 0 < duration <= 86400:
        _fail("--duration: must be more than 0 and at most 24h")
    if args.prompt_tokens < 1 or args.output_tokens < 1:
        _fail("--prompt-tokens and --output-tokens must be at least 1")
    if not 1 <= args.max_in_flight <= 100000:
        _fail("--max-in-flight: must be from 1 to 100000")
    if timeout <= 0:
        _fail("--timeout: must be more than 0")
    return LoadConfig(
        url=url,
        rate=rate,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        duration=duration,
        model=args.model,
        seed=args.seed,
        max_in_flight=args.max_in_flight,
        timeout=timeout,
        drain=drain,
        api=args.api,
        concurrency=args.concurrency,
        requests=args.requests,
    )


async def _main(cfg: LoadConfig, progress: Progress) -> Summary:
    """Ctrl-C or SIGTERM end the arrivals and print the summary of what finished."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return await run(cfg, progress, stop=stop)


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    cfg = config_from(args)
    show = args.progress == "on" or (args.progress == "auto" and sys.stderr.isatty())
    progress = Progress(sys.stderr, show)
    try:
        summary = asyncio.run(_main(cfg, progress))
    except ValueError as err:
        _fail(str(err))
    if args.output == "json":
        print(summary.to_json())
    else:
        print(format_summary(summary))
    return 0 if summary.completed else 1
