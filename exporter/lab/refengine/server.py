"""The reference engine's front-end process: HTTP API, tokenizer, detokenizer, metrics.

Endpoints (vLLM's OpenAI-compatible server's shapes):

``POST /v1/completions``
    ``{"model", "prompt": str | [token ids], "max_tokens": 16, "temperature": 1.0, "seed",
    "stream": false, "stream_options": {"include_usage": bool}}``. Generation stops at
    ``max_tokens`` (the end-of-text token is never sampled, vLLM's ``ignore_eos``). With
    ``stream`` the answer is server-sent events, one ``data: {chunk}`` per delivery and
    ``data: [DONE]`` at the end.
``POST /tokenize``
    ``{"prompt", "model"?}`` -> ``{"count", "max_model_len", "tokens", "token_strs": null}``
``POST /detokenize``
    ``{"tokens": [...]}`` -> ``{"prompt": text}``
``GET /health``
    200 while the model worker runs, else 503. ``GET /v1/models`` lists the model.
``GET /metrics``
    vLLM's metric names (:mod:`exporter.lab.refengine.vllm_metrics`).

Disaggregated serving (``--role prefill|decode``; ``both``, the default, is colocated), with
vLLM's P/D request protocol (``kv_transfer_params``, as its NixlConnector proxies send it):

- a prefill server given ``"kv_transfer_params": {"do_remote_decode": true}`` runs the prompt,
  keeps the request's KV cache and answers with ``kv_transfer_params`` naming where to read it
  (``remote_host``, ``remote_port``, ``remote_request_id``; :mod:`.kv_transfer`);
- a decode server given ``"kv_transfer_params": {"do_remote_prefill": true, ...}`` reads that
  cache over the loopback link and continues the request from it. With ``--prefill-url`` it is
  also the pair's front: a plain request is first sent to the prefill server, as llm-d's
  routing sidecar in the decode pod does. A transfer that fails is counted and the prompt is
  recomputed here (vLLM's recompute policy for failed KV loads).

The front's time to first token is the client's: from the request's arrival, through the
prefill server's answer and the transfer, to the first token decoded here. While its cache is
being read a request counts as waiting, and its queue time holds the read (vLLM keeps a request
waiting for remote KV in its waiting queue and records it scheduled once the cache is in).

Tokenization runs in the event loop (the fast tokenizer takes about a millisecond for 512
tokens), as in vLLM's API server; ``tokenizer-slow`` moves it to the pure-Python path on one
dedicated thread. New tokens from the worker are delivered per request: each request's
handler takes every token that arrived since its last delivery, detokenizes and writes them
as one chunk, so a slow client or a busy loop coarsens the stream instead of queueing
without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import multiprocessing
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from exporter.lab.refengine import inject, kv_transfer
from exporter.lab.refengine.bpe import BpeTokenizer
from exporter.lab.refengine.vllm_metrics import EngineMetrics
from exporter.lab.refengine.worker import Finished, Request, StepOutput, WorkerConfig
from exporter.lab.refengine.worker import main as worker_main

log = logging.getLogger("exporter.lab.refengine")

MAX_BODY = 4 * 1024 * 1024
GIL_SLICE_MS = 5.0
# frontend-gil: requests pre-processed at once; the others wait (without CPU) for a turn.
GIL_REQUESTS_AT_ONCE = 2


@dataclass(frozen=True)
class FrontendConfig:
    model_name: str
    max_model_len: int
    injections: frozenset[str] = frozenset()
    # The injections' sizes at start-up (inject.INJECTION_SIZES' names; a missing one: its
    # default); POST /lab/injection changes them while the engine runs.
    sizes: Mapping[str, float] = field(default_factory=dict)
    default_max_tokens: int = 16
    start_timeout: float = 300.0
    role: str = "both"  # prefill, decode, both (colocated)
    prefill_url: str = ""  # decode: send plain requests to this prefill server first
    kv_host: str = "127.0.0.1"  # prefill: the KV link's address...
    kv_port: int = 0  # ...and port (0: a free one)
    kv_lease_s: float = 30.0  # prefill: a cache not read within this expires


@dataclass
class _Stream:
    rid: str
    arrival: float
    prompt_tokens: int
    event: asyncio.Event = field(default_factory=asyncio.Event)
    pending: list[int] = field(default_factory=list)
    generated: int = 0
    last_token_at: float = 0.0  # worker clock
    finished: Finished | None = None
    kv: bytes | None = None  # prefill role: the prompt's exported KV cache
    kv_wait: float = 0.0  # decode role: seconds spent reading the KV cache before admission


class WorkerGoneError(RuntimeError):
    pass


class Frontend:
    """Owns the model worker process and serves the API."""

    def __init__(self, cfg: FrontendConfig, tokenizer: BpeTokenizer, worker: WorkerConfig) -> None:
        self.cfg = cfg
        self.tok = tokenizer
        self.worker_cfg = worker
        self.info: dict[str, Any] = {}
        self.metrics: EngineMetrics | None = None
        self._streams: dict[str, _Stream] = {}
        self._proc: Any = None
        self._conn: Any = None
        self._reader: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._alive = False
        self._send_lock = threading.Lock()
        self._gil_gate = asyncio.Semaphore(GIL_REQUESTS_AT_ONCE)
        self.sizes = {
            name: float(cfg.sizes.get(name, size.default))
            for name, size in inject.INJECTION_SIZES.items()
        }
        slow = "tokenizer-slow" in cfg.injections
        self._tok_pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer") if slow else None
        )
        # Called with the sizes a POST /lab/injection changed (the helper processes' owner:
        # a new softirq_target restarts the flood).
        self.on_resize: Callable[[Mapping[str, float]], None] | None = None
        self.kv_server: kv_transfer.KVServer | None = None
        self._kv_pool: ThreadPoolExecutor | None = None
        self._http: Any = None
        self._pulling = 0  # decode: requests waiting for their KV cache (vLLM counts them waiting)

    @property
    def worker_ok(self) -> bool:
        return self._alive

    # --- worker lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Start the model worker and wait until its model is built and warmed up."""
        self._loop = asyncio.get_running_loop()
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(
            target=worker_main, args=(child, self.worker_cfg), name="model-worker", daemon=True
        )
        self._proc.start()
        child.close()
        self._conn = parent
        msg = await self._loop.run_in_executor(None, self._first_message)
        if msg[0] != "ready":
            raise WorkerGoneError(str(msg[1]))
        self.info = dict(msg[1])
        self.metrics = EngineMetrics(
            self.cfg.model_name,
            block_size=self.worker_cfg.block_size,
            kv_blocks=int(self.info["kv_blocks"]),
            kv_connector=self.cfg.role != "both",
        )
        self._start_kv_link()
        self._alive = True
        self._reader = threading.Thread(target=self._read, name="worker-reader", daemon=True)
        self._reader.start()

    def _start_kv_link(self) -> None:
        """prefill: serve held caches; decode: threads that read them (and a client for the
        prefill server when this one is the pair's front)."""
        nixl = self.metrics.nixl if self.metrics is not None else None
        if self.cfg.role == "prefill" and nixl is not None:
            store = kv_transfer.KVStore(self.cfg.kv_lease_s, on_expired=nixl.expired.inc)
            self.kv_server = kv_transfer.KVServer(
                store, self.cfg.kv_host, self.cfg.kv_port, self.kv_rate
            )
            self.kv_server.start()
        elif self.cfg.role == "decode":
            self._kv_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="kv-pull")
            if self.cfg.prefill_url:
                from aiohttp import ClientSession, ClientTimeout  # noqa: PLC0415

                self._http = ClientSession(timeout=ClientTimeout(total=300))

    def _first_message(self) -> tuple[str, Any]:
        deadline = time.monotonic() + self.cfg.start_timeout
        while time.monotonic() < deadline:
            if self._conn.poll(0.2):
                try:
                    msg: tuple[str, Any] = self._conn.recv()
                except EOFError:
                    break
                return msg
            if not self._proc.is_alive():
                break
        return ("fatal", f"model worker exited (code {self._proc.exitcode}) before it was ready")

    def _read(self) -> None:
        loop = self._loop
        assert loop is not None
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                loop.call_soon_threadsafe(self._worker_gone)
                return
            loop.call_soon_threadsafe(self._on_message, msg)

    def _worker_gone(self) -> None:
        if self._alive:
            log.error("model worker exited")
        self._alive = False
        for stream in self._streams.values():
            stream.event.set()

    def _send(self, msg: tuple[Any, ...]) -> None:
        if not self._alive:
            raise WorkerGoneError("model worker is not running")
        with self._send_lock:
            self._conn.send(msg)

    async def stop(self, timeout: float = 5.0) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(Exception):
            self._send(("stop",))
        self._alive = False
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._proc.join, timeout)
        if self._proc.is_alive():
            self._proc.kill()
            await loop.run_in_executor(None, self._proc.join, 5.0)
        with contextlib.suppress(OSError):
            self._conn.close()
        if self._tok_pool is not None:
            self._tok_pool.shutdown(wait=False, cancel_futures=True)
        if self.kv_server is not None:
            self.kv_server.stop()
        if self._kv_pool is not None:
            self._kv_pool.shutdown(wait=False, cancel_futures=True)
        if self._http is not None:
            await self._http.close()

    # --- outputs -------------------------------------------------------------------------------
    def _on_message(self, msg: tuple[str, Any]) -> None:
        if msg[0] == "fatal":
            log.error("%s", msg[1])
            self._worker_gone()
            return
        if msg[0] != "step":
            return
        out: StepOutput = msg[1]
        metrics = self.metrics
        assert metrics is not None
        now = time.monotonic()
        for rid, blob in out.exported.items():
            stream = self._streams.get(rid)
            if stream is not None:
                stream.kv = blob
        for rid, token in out.tokens:
            stream = self._streams.get(rid)
            if stream is None:
                continue
            stream.pending.append(token)
            stream.generated += 1
            metrics.generation_tokens.inc()
            if stream.generated == 1:
                metrics.ttft.observe(now - stream.arrival)
                metrics.prompt_tokens.inc(stream.prompt_tokens)
            else:
                metrics.itl.observe(max(0.0, out.at - stream.last_token_at))
            stream.last_token_at = out.at
            stream.event.set()
        for rid, fin in out.finished.items():
            stream = self._streams.get(rid)
            if stream is None:
                continue
            stream.finished = fin
            stream.event.set()
            if fin.reason.startswith("error"):
                continue
            metrics.e2e.observe(now - stream.arrival)
            # As vLLM's: a decode request waits in the queue while its cache is read
            # (WAITING_FOR_REMOTE_KVS), so its queue time holds the transfer.
            metrics.queue_time.observe(max(0.0, fin.scheduled - fin.queued) + stream.kv_wait)
            metrics.prefill_time.observe(max(0.0, fin.first_token - fin.scheduled))
            metrics.decode_time.observe(max(0.0, fin.last_token - fin.first_token))
            metrics.success(fin.reason)
        metrics.scheduler_state(
            running=out.running,
            waiting=out.waiting + self._pulling,
            kv_usage=out.kv_usage,
            preemptions=out.preemptions,
        )
        if out.h2d is not None:
            metrics.h2d.snapshot = out.h2d
        if out.work is not None:
            metrics.work(out.work.flops, out.work.read_bytes, out.work.write_bytes)

    # --- injection sizes -----------------------------------------------------------------------
    @property
    def kv_rate(self) -> float:
        """kv-transfer-slow: the link's bytes per second (0: unthrottled)."""
        if "kv-transfer-slow" not in self.cfg.injections:
            return 0.0
        return self.sizes["kv_link_mib_s"] * 2**20

    def injection(self) -> dict[str, Any]:
        """What ``GET /lab/injection`` answers: the injections, the sizes of theirs, and the
        model worker's slowdown."""
        return {
            "injections": sorted(self.cfg.injections),
            "sizes": {
                name: self.sizes[name]
                for name, size in inject.INJECTION_SIZES.items()
                if size.injection in self.cfg.injections
            },
            "worker_slowdown": float(self.worker_cfg.slowdown),
        }

    def resize(self, changes: Mapping[str, object]) -> None:
        """New sizes of running injections (ValueError, and nothing changed, when one is bad)."""
        checked = inject.check_sizes(changes, self.cfg.injections)
        if "decode_overhead_ms" in checked:
            self._send(("tune", {"decode_overhead_ms": checked["decode_overhead_ms"]}))
        self.sizes.update(checked)
        if self.kv_server is not None:
            self.kv_server.rate = self.kv_rate
        if checked and self.on_resize is not None:
            self.on_resize(checked)
        if checked:
            log.info(
                "injection sizes: %s", ", ".join(f"{k} {v:g}" for k, v in sorted(checked.items()))
            )

    # --- request path --------------------------------------------------------------------------
    async def encode(self, text: str) -> list[int]:
        if self._tok_pool is None:
            return self.tok.encode(text)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tok_pool, self._encode_slow, text)

    def _encode_slow(self, text: str) -> list[int]:
        """tokenizer-slow, on its thread: the pure-Python path, then - when that took less
        CPU time than ``tokenizer_slow_us_per_token`` per token - more pure-Python work of
        this thread until it has (a slower tokenizer: a larger merge table, a slower core)."""
        began = time.thread_time()
        ids = self.tok.encode_slow(text)
        wanted = len(ids) * self.sizes["tokenizer_slow_us_per_token"] / 1e6
        left = wanted - (time.thread_time() - began)
        if left > 0:
            inject.hold_gil(text, left)
        return ids

    async def _gil(self, text: str, ms: float) -> None:
        """frontend-gil: ``ms`` of pure-Python CPU in this (the event-loop) thread, in slices
        of at most :data:`GIL_SLICE_MS` with a yield between them, as a coroutine that does
        real work between its awaits would run."""
        if "frontend-gil" not in self.cfg.injections or ms <= 0:
            return
        left = ms
        while left > 0:
            piece = min(left, GIL_SLICE_MS)
            inject.hold_gil(text, piece / 1000.0)
            left -= piece
            if left > 0:
                await asyncio.sleep(0)

    async def _preprocess(self, text: str) -> None:
        """frontend-gil's per-request pre-processing, at most :data:`GIL_REQUESTS_AT_ONCE`
        requests at a time, as a front end with a bounded pre-processing stage runs it.

        Offered more than the thread can do, the backlog waits at the gate and the thread
        stays saturated; without the gate every waiting request would take its slice in each
        turn of the event loop, and with a few dozen of them one turn takes longer than a
        scrape's timeout: the engine's own ``/metrics`` would stop answering."""
        if "frontend-gil" not in self.cfg.injections or self.sizes["gil_request_ms"] <= 0:
            return
        async with self._gil_gate:
            await self._gil(text, self.sizes["gil_request_ms"])

    async def submit(
        self,
        prompt: list[int],
        max_tokens: int,
        temperature: float,
        seed: int,
        arrival: float,
        *,
        export_kv: bool = False,
        kv: bytes | None = None,
        kv_wait: float = 0.0,
    ) -> _Stream:
        rid = uuid.uuid4().hex
        stream = _Stream(rid=rid, arrival=arrival, prompt_tokens=len(prompt), kv_wait=kv_wait)
        self._streams[rid] = stream
        req = Request(rid, tuple(prompt), max_tokens, temperature, seed, export_kv, kv)
        try:
            self._send(("add", req))
        except WorkerGoneError:
            self._streams.pop(rid, None)
            raise
        return stream

    async def deliveries(self, stream: _Stream) -> AsyncGenerator[list[int]]:
        """Yield lists of new token ids until the request finishes (then the finish)."""
        try:
            while True:
                await stream.event.wait()
                stream.event.clear()
                batch, stream.pending = stream.pending, []
                if batch:
                    yield batch
                if stream.finished is not None:
                    return
                if not self._alive:
                    raise WorkerGoneError("model worker exited")
        finally:
            self._streams.pop(stream.rid, None)
            if stream.finished is None and self._alive:
                with contextlib.suppress(WorkerGoneError, OSError):
                    self._send(("abort", stream.rid))

    # --- HTTP ----------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/version", self.version)
        app.router.add_get("/lab/injection", self.injection_page)
        app.router.add_post("/lab/injection", self.injection_page)
        return app

    async def injection_page(self, request: web.Request) -> web.Response:
        """``GET``: the injections and their sizes; ``POST {"<size>": number, ...}``: new sizes
        (400 with the reason, and nothing changed, when one is unknown, out of bounds or of an
        injection this engine does not run), then the same answer as ``GET``."""
        if request.method == "POST":
            body = await _json(request)
            try:
                self.resize(body)
            except ValueError as err:
                raise _error(400, str(err)) from None
            except WorkerGoneError as err:
                raise _error(503, str(err), "ServiceUnavailable") from None
        return web.json_response(self.injection())

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._alive else 503)

    async def version(self, request: web.Request) -> web.Response:
        from exporter import __version__  # noqa: PLC0415

        return web.json_response({"version": f"reference-{__version__}"})

    async def metrics_page(self, request: web.Request) -> web.Response:
        assert self.metrics is not None
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.cfg.model_name,
                        "object": "model",
                        "owned_by": "reference",
                        "max_model_len": self.cfg.max_model_len,
                    }
                ],
            }
        )

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await _json(request)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise _error(400, "'prompt' must be a string")
        self._check_model(body)
        ids = await self.encode(prompt)
        return web.json_response(
            {
                "count": len(ids),
                "max_model_len": self.cfg.max_model_len,
                "tokens": ids,
                "token_strs": None,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await _json(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise _error(400, "'tokens' must be a list of token ids")
        return web.json_response({"prompt": self.tok.decode(tokens)})

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.cfg.model_name:
            raise _error(404, f"The model `{model}` does not exist.", "NotFoundError")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        body = await _json(request)
        self._check_model(body)
        params = _completion_params(body, self.cfg.default_max_tokens)
        prompt_text, prompt_ids = params.prompt_text, params.prompt_ids
        await self._preprocess(prompt_text)
        if prompt_ids is None:
            prompt_ids = await self.encode(prompt_text)
        elif any(not 0 <= t < self.tok.vocab_size for t in prompt_ids):
            raise _error(400, f"token ids must be in [0, {self.tok.vocab_size})")
        if len(prompt_ids) + params.max_tokens > self.cfg.max_model_len:
            raise _error(
                400,
                f"This model's maximum context length is {self.cfg.max_model_len} tokens. "
                f"However, you requested {len(prompt_ids) + params.max_tokens} tokens "
                f"({len(prompt_ids)} in the messages, {params.max_tokens} in the completion).",
            )
        if not prompt_ids:
            raise _error(400, "the prompt is empty")
        transfer = body.get("kv_transfer_params")
        export = self.cfg.role == "prefill" and _flag(transfer, "do_remote_decode")
        if export and params.stream:
            raise _error(400, "a remote decode's prefill is answered whole, not streamed")
        kv, kv_wait = await self._remote_prefill(transfer, prompt_ids, params)
        try:
            stream = await self.submit(
                prompt_ids,
                params.max_tokens,
                params.temperature,
                params.seed,
                arrival,
                export_kv=export,
                kv=kv,
                kv_wait=kv_wait,
            )
        except WorkerGoneError as err:
            raise _error(503, str(err), "ServiceUnavailable") from None
        head = {
            "id": f"cmpl-{stream.rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.cfg.model_name,
        }
        if params.stream:
            return await self._stream(request, stream, head, params.include_usage)
        return await self._whole(stream, head, hold_kv=export)

    # --- disaggregated serving ---------------------------------------------------------------
    def _hold(self, stream: _Stream) -> dict[str, Any]:
        """prefill: keep the finished request's cache for the decode server to read; the
        ``kv_transfer_params`` that tell it where."""
        assert self.kv_server is not None
        if stream.kv is None:
            raise _error(500, "the model worker exported no KV cache", "InternalServerError")
        info = self.info
        meta = kv_transfer.KVMeta(
            tokens=stream.prompt_tokens,
            layers=int(info["layers"]),
            heads=int(info["heads"]),
            head_dim=int(info["head_dim"]),
            element_size=int(info["element_size"]),
        )
        self.kv_server.store.put(stream.rid, meta, stream.kv)
        stream.kv = None
        host, port = self.kv_server.address
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_request_id": stream.rid,
            "remote_host": host,
            "remote_port": port,
        }

    async def _remote_prefill(
        self, transfer: Any, prompt_ids: list[int], params: _Params
    ) -> tuple[bytes | None, float]:
        """decode: the prompt's KV cache from the prefill server (asked first when this server
        is the front), or None to run the prompt here; and the seconds spent reading it (the
        request's wait for its cache, which vLLM counts as queue time)."""
        if self.cfg.role != "decode":
            return None, 0.0
        if not _flag(transfer, "do_remote_prefill"):
            if not self.cfg.prefill_url:
                return None, 0.0
            transfer = await self._ask_prefill(prompt_ids, params)
        host, port, rid = (
            transfer.get(k) for k in ("remote_host", "remote_port", "remote_request_id")
        )
        if not (isinstance(host, str) and isinstance(port, int) and isinstance(rid, str)):
            raise _error(
                400, "kv_transfer_params needs remote_host, remote_port, remote_request_id"
            )
        assert self.metrics is not None and self.metrics.nixl is not None
        nixl = self.metrics.nixl
        pull = functools.partial(kv_transfer.pull, host, port, rid, rate=self.kv_rate)
        self._pulling += 1
        started = time.monotonic()
        try:
            pulled = await asyncio.get_running_loop().run_in_executor(self._kv_pool, pull)
            if pulled.meta.tokens != len(prompt_ids):
                raise kv_transfer.TransferError(
                    f"KV cache of {pulled.meta.tokens} positions for a {len(prompt_ids)}-token "
                    "prompt"
                )
        except kv_transfer.TransferError as err:
            nixl.failed_transfers.inc()
            log.warning("%s; recomputing the prompt", err)
            return None, time.monotonic() - started
        finally:
            self._pulling -= 1
        waited = time.monotonic() - started
        if not pulled.notified:
            nixl.failed_notifications.inc()
        nixl.transfer(
            post=pulled.post_seconds,
            xfer=pulled.xfer_seconds,
            nbytes=len(pulled.payload),
            descriptors=pulled.meta.descriptors(self.worker_cfg.block_size),
        )
        return pulled.payload, waited

    async def _ask_prefill(self, prompt_ids: list[int], params: _Params) -> dict[str, Any]:
        """The front's first hop: the prompt to the prefill server, its cache's address back."""
        from aiohttp import ClientError  # noqa: PLC0415

        body = {
            "model": self.cfg.model_name,
            "prompt": prompt_ids,
            "max_tokens": 1,
            "temperature": params.temperature,
            "seed": params.seed,
            "kv_transfer_params": {"do_remote_decode": True},
        }
        url = self.cfg.prefill_url.rstrip("/") + "/v1/completions"
        try:
            async with self._http.post(url, json=body) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:200]
                    raise _error(503, f"the prefill server answered {resp.status}: {text}")
                answer = await resp.json()
        except (ClientError, TimeoutError, json.JSONDecodeError) as err:
            raise _error(503, f"the prefill server failed: {err}", "ServiceUnavailable") from None
        transfer = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if not isinstance(transfer, dict):
            raise _error(503, "the prefill server sent no kv_transfer_params", "ServiceUnavailable")
        return transfer

    async def _whole(
        self, stream: _Stream, head: dict[str, Any], *, hold_kv: bool = False
    ) -> web.Response:
        detok = self.tok.detokenizer()
        parts: list[str] = []
        try:
            async with contextlib.aclosing(self.deliveries(stream)) as deliveries:
                async for batch in deliveries:
                    parts.append(detok.push(batch))
                    await self._gil("".join(parts), self.sizes["gil_chunk_ms"])
        except WorkerGoneError as err:
            raise _error(503, str(err), "ServiceUnavailable") from None
        parts.append(detok.flush())
        fin = stream.finished
        if fin is not None and fin.reason.startswith("error"):
            raise _error(400, fin.reason.removeprefix("error: "))
        choice = {
            "index": 0,
            "text": "".join(parts),
            "logprobs": None,
            "finish_reason": fin.reason if fin else None,
            "stop_reason": None,
        }
        answer = {**head, "choices": [choice], "usage": _usage(stream)}
        if hold_kv:
            answer["kv_transfer_params"] = self._hold(stream)
        return web.json_response(answer)

    async def _stream(
        self, request: web.Request, stream: _Stream, head: dict[str, Any], include_usage: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        detok = self.tok.detokenizer()
        text = ""
        try:
            await resp.prepare(request)
            async with contextlib.aclosing(self.deliveries(stream)) as deliveries:
                async for batch in deliveries:
                    piece = detok.push(batch)
                    text += piece
                    await self._gil(text, self.sizes["gil_chunk_ms"])
                    await resp.write(_sse({**head, "choices": [_choice(piece, None)]}))
            fin = stream.finished
            if fin is not None and fin.reason.startswith("error"):
                error = {"error": {"message": fin.reason.removeprefix("error: "), "code": 400}}
                await resp.write(_sse(error))
            else:
                final = detok.flush()
                reason = fin.reason if fin else None
                await resp.write(_sse({**head, "choices": [_choice(final, reason)]}))
                if include_usage:
                    await resp.write(_sse({**head, "choices": [], "usage": _usage(stream)}))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except WorkerGoneError as err:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await resp.write(_sse({"error": {"message": str(err), "code": 503}}))
        except ConnectionError:
            # The client went away; deliveries() has aborted the request in the worker.
            log.debug("client of %s went away", stream.rid)
        return resp


@dataclass(frozen=True)
class _Params:
    prompt_text: str
    prompt_ids: list[int] | None
    max_tokens: int
    temperature: float
    seed: int
    stream: bool
    include_usage: bool


def _completion_params(body: dict[str, Any], default_max_tokens: int) -> _Params:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    text = ""
    ids: list[int] | None = None
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        ids = [int(t) for t in prompt]
    else:
        raise _error(400, "'prompt' must be a string or a list of token ids")
    max_tokens = body.get("max_tokens", default_max_tokens)
    if max_tokens is None:
        max_tokens = default_max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise _error(400, "'max_tokens' must be a positive integer")
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if not isinstance(temperature, int | float) or not 0 <= temperature <= 10:
        raise _error(400, "'temperature' must be a number from 0 to 10")
    seed = body.get("seed")
    if seed is None:
        seed = uuid.uuid4().int & 0x7FFFFFFF
    if not isinstance(seed, int):
        raise _error(400, "'seed' must be an integer")
    options = body.get("stream_options") or {}
    return _Params(
        prompt_text=text,
        prompt_ids=ids,
        max_tokens=max_tokens,
        temperature=float(temperature),
        seed=seed,
        stream=bool(body.get("stream", False)),
        include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
    )


def _flag(transfer: Any, name: str) -> bool:
    return isinstance(transfer, dict) and transfer.get(name) is True


def _choice(text: str, reason: str | None) -> dict[str, Any]:
    return {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": reason,
        "stop_reason": None,
    }


def _usage(stream: _Stream) -> dict[str, int]:
    return {
        "prompt_tokens": stream.prompt_tokens,
        "completion_tokens": stream.generated,
        "total_tokens": stream.prompt_tokens + stream.generated,
    }


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.HTTPException:
    body = json.dumps(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    )
    cls: type[web.HTTPException] = {
        400: web.HTTPBadRequest,
        404: web.HTTPNotFound,
        500: web.HTTPInternalServerError,
        503: web.HTTPServiceUnavailable,
    }.get(status, web.HTTPBadRequest)
    return cls(text=body, content_type="application/json")


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        raise _error(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise _error(400, "the request body must be a JSON object")
    return body
