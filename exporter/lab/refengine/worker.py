"""The model worker process: request queue, continuous batching, KV cache, forward passes.

It runs in its own process (started with ``spawn``), like vLLM's EngineCore, so the model's
compute never competes with the front-end for the GIL. torch is imported only inside
:func:`main`; importing this module costs nothing.

Every step the scheduler

1. admits waiting requests in arrival order while fewer than ``max_num_seqs`` run, the
   prompt's KV blocks are free and the step's prefill budget (``max_num_batched_tokens``)
   lasts - requests join the running batch at any step;
2. makes room for every running sequence's next position, preempting the most recently
   admitted sequence when the KV block pool is exhausted (it is requeued at the front and
   recomputed later, vLLM's recompute preemption);
3. runs the prefill of the newly admitted requests (their first token) and one batched decode
   step for the others (one token each);
4. sends the new tokens, finished requests, the scheduler's state and the step's work (FLOPs,
   bytes read and written, :class:`Work`) to the front-end.

The KV cache is accounted in blocks of ``block_size`` tokens, as vLLM's ``kv_cache_usage_perc``
is; the physical cache is one slot per running sequence (:mod:`exporter.lab.refengine.torch_model`).

With ``slowdown`` above 1 (``--worker-slowdown``) every forward pass takes that many times as
long: after each prefill and each batched decode pass (with its sampling) the worker waits
``slowdown - 1`` times the work the pass did (on a CPU its CPU time per torch thread, on a GPU
its time). It stands in for a slower accelerator, whose kernels take longer without taking
more of the host's CPU; the decode-overhead's host work is not slowed, nor are the moments a
busy host's neighbours hold the worker's core.

Messages (tuples over a :func:`multiprocessing.Pipe`)::

    front-end -> worker  ("add", Request) | ("abort", request_id) | ("stop",)
                         | ("tune", {"decode_overhead_ms": float})
    worker -> front-end  ("ready", info) | ("step", StepOutput) | ("fatal", message)
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.lab.refengine.inject import hold_gil

log = logging.getLogger("exporter.lab.refengine.worker")

IDLE_WAIT_S = 0.5
# On a CPU the worker's compute stands in for the GPU, which on a real server takes no CPU
# from the host side: the worker runs at this nice value behind the front-end and the rest.
CPU_NICE = 5

# Model sizes: layers, width, heads. Random weights, so any shape is a valid model.
SIZES: dict[str, dict[str, int]] = {
    # A 2-core CPU streams this one at hundreds of tokens per second.
    "tiny": {"layers": 4, "d_model": 256, "heads": 4},
    "small": {"layers": 8, "d_model": 512, "heads": 8},
    # For a GPU: about 0.3 B parameters.
    "medium": {"layers": 24, "d_model": 1024, "heads": 16},
    "large": {"layers": 32, "d_model": 2048, "heads": 16},
}


@dataclass(frozen=True)
class WorkerConfig:
    vocab_size: int
    eos_id: int
    size: str = "auto"  # auto: tiny on CPU, medium on CUDA
    layers: int = 0  # 0: from size
    d_model: int = 0
    heads: int = 0
    max_model_len: int = 1024
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_blocks: int = 0  # 0: as many as the physical cache holds
    device: str = "auto"
    threads: int = 1
    seed: int = 0
    h2d_stall_mib: int = 0  # >0: a synchronous pageable host-to-device copy of this size...
    h2d_stall_every: int = 1  # ...every this many steps
    memory_fill_ratio: float = 0.0  # >0 (CUDA): the KV cache takes device memory up to this
    memory_pressure: bool = False  # the KV pool holds only memory_pressure_blocks blocks
    memory_pressure_blocks: int = 40
    hbm_saturation_mib: int = 0  # >0 (CUDA): a neighbour copying this much device memory...
    hbm_saturation_after_s: float = 0.0  # ...back to back, from this long after start-up
    require_cuda: str = ""  # the injections that only mean something on a GPU
    nice: int = -1  # CPU priority of the worker; -1: 5 on CPU, unchanged on CUDA
    model_name: str = "reference-tiny"
    decode_overhead_ms: float = 0.0  # >0: CPU work on the step path before every decode step
    model_dir: str = ""  # write config.json and the safetensors index here at start-up
    slowdown: float = 1.0  # >1: every forward pass takes this many times as long (a wait)


@dataclass(frozen=True)
class Request:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float
    seed: int
    # Disaggregated serving: a prefill server exports the prompt's KV cache when the request
    # finishes (StepOutput.exported); a decode server starts from a cache read from the prefill
    # server (``kv``, laid out as Model.export_kv gives it) instead of running the prompt.
    export_kv: bool = False
    kv: bytes | None = None


@dataclass(frozen=True)
class Finished:
    """Worker-side timestamps (``time.monotonic()``, shared by the processes of a host)."""

    reason: str  # "length", "abort", "error: ..."
    queued: float
    scheduled: float
    first_token: float
    last_token: float
    prompt_tokens: int
    generated: int


@dataclass
class StepOutput:
    at: float
    tokens: list[tuple[str, int]]  # (request id, new token) in generation order
    first: dict[str, tuple[float, float]]  # request id -> (queued, scheduled) at its 1st token
    finished: dict[str, Finished]
    waiting: int
    running: int
    kv_usage: float
    preemptions: int
    step_seconds: float
    h2d: tuple[tuple[tuple[float, float], ...], float] | None = None  # (buckets, sum)
    work: Work | None = None
    exported: dict[str, bytes] = field(default_factory=dict)  # request id -> its prompt's KV


@dataclass
class Work:
    """What a step's forward passes did, as vLLM's MFU counters estimate it (per GPU).

    Each forward pass streams the weights it multiplies with once (``streamed_parameters``:
    the blocks, the final norm and the tied LM head) and gathers one embedding and position row
    per token. Decode reads every sequence's cached keys and values up to the longest sequence
    in the batch (the masked positions too: the kernel reads them) and writes one position per
    sequence; prefill writes the prompt's positions and reads them back once. FLOPs are
    ``2 x matmul parameters`` per token, the LM head for the tokens sampled, and attention:
    ``4 x layers x width`` per (query, key) pair - all keys up to the longest for decode, the
    causal half for prefill. Activations' traffic is left out (a few KiB per token)."""

    flops: float = 0.0
    read_bytes: float = 0.0
    write_bytes: float = 0.0

    def add(self, other: Work) -> None:
        self.flops += other.flops
        self.read_bytes += other.read_bytes
        self.write_bytes += other.write_bytes


def decode_work(mcfg: Any, batch: int, span: int, element_size: int) -> Work:
    """One batched decode pass over ``batch`` sequences whose longest holds ``span`` keys."""
    d, e = mcfg.d_model, element_size
    kv = mcfg.kv_bytes_per_token(e)
    return Work(
        flops=2.0 * batch * (mcfg.matmul_parameters() + mcfg.vocab_size * d)
        + 4.0 * mcfg.layers * d * span * batch,
        read_bytes=float(mcfg.streamed_parameters() * e + batch * span * kv + batch * 2 * d * e),
        write_bytes=float(batch * kv),
    )


def prefill_work(mcfg: Any, tokens: int, element_size: int) -> Work:
    """The prefill of one ``tokens``-long prompt (logits of its last token only)."""
    d, e, n = mcfg.d_model, element_size, tokens
    kv = mcfg.kv_bytes_per_token(e)
    return Work(
        flops=2.0 * n * mcfg.matmul_parameters()
        + 2.0 * mcfg.vocab_size * d
        + 2.0 * mcfg.layers * d * n * (n + 1),
        read_bytes=float(mcfg.streamed_parameters() * e + n * kv + n * 2 * d * e),
        write_bytes=float(n * kv),
    )


@dataclass
class _Seq:
    req: Request
    queued: float
    tokens: list[int]  # prompt, then generated tokens (also the recompute input)
    generated: int = 0
    slot: int = -1
    blocks: int = 0
    cached: int = 0  # positions in the KV cache
    scheduled: float = 0.0
    first_token: float = 0.0
    admitted_at: int = 0  # step number, for preemption order
    sampler: Any = None
    kv: bytes | None = None  # a transferred prompt cache, until it is loaded


@dataclass
class _State:
    waiting: deque[_Seq] = field(default_factory=deque)
    # Running sequences in slot order: running[i] owns KV slot i, so a decode step reads the
    # first len(running) slots as one view instead of gathering scattered ones.
    running: list[_Seq] = field(default_factory=list)
    slots: int = 0
    free_blocks: int = 0
    total_blocks: int = 0
    preemptions: int = 0
    step: int = 0


class Scheduler:
    """The engine loop without the transport: feed it requests, call :meth:`step`."""

    def __init__(self, cfg: WorkerConfig, model: Any, h2d: Any = None) -> None:
        self.cfg = cfg
        self.model = model
        self.h2d = h2d
        self._stall_src: Any = None
        slots = int(model.k_cache.shape[1])
        physical_blocks = slots * (cfg.max_model_len // cfg.block_size)
        blocks = cfg.kv_blocks or physical_blocks
        if cfg.memory_pressure:
            blocks = min(blocks, max(2, cfg.memory_pressure_blocks))
        self.state = _State(slots=slots, free_blocks=blocks, total_blocks=blocks)
        self.by_id: dict[str, _Seq] = {}
        # decode-overhead's size, which the front-end may change while the engine runs.
        self.decode_overhead_s = cfg.decode_overhead_ms / 1000.0

    # --- requests ------------------------------------------------------------------------------
    def add(self, req: Request, now: float) -> str | None:
        """Queue a request; returns an error message when it can never run."""
        need = self._blocks_for(len(req.prompt) + 1)
        if len(req.prompt) == 0:
            return "empty prompt"
        if len(req.prompt) >= self.cfg.max_model_len:
            return (
                f"prompt of {len(req.prompt)} tokens does not fit max_model_len "
                f"{self.cfg.max_model_len}"
            )
        if need > self.state.total_blocks:
            return f"prompt needs {need} KV blocks, the cache has {self.state.total_blocks}"
        from exporter.lab.refengine import torch_model as m  # noqa: PLC0415

        seq = _Seq(
            req=req, queued=now, tokens=list(req.prompt), sampler=m.generator(req.seed), kv=req.kv
        )
        self.by_id[req.request_id] = seq
        self.state.waiting.append(seq)
        return None

    def abort(self, request_id: str) -> None:
        seq = self.by_id.pop(request_id, None)
        if seq is None:
            return
        if seq in self.state.running:
            self._release(seq)
        elif seq in self.state.waiting:
            self.state.waiting.remove(seq)

    @property
    def busy(self) -> bool:
        return bool(self.state.waiting or self.state.running)

    # --- one step ------------------------------------------------------------------------------
    def step(self) -> StepOutput:
        from exporter.lab.refengine import torch_model as m  # noqa: PLC0415

        st = self.state
        st.step += 1
        started = time.monotonic()
        # Running sequences keep their place first; then new requests join the batch.
        self._make_room()
        decoding = list(st.running)
        admitted = self._admit()
        if self.h2d is not None and st.step % max(1, self.cfg.h2d_stall_every) == 0:
            self._stall()
        out = StepOutput(
            at=0.0, tokens=[], first={}, finished={}, waiting=0, running=0, kv_usage=0.0,
            preemptions=0, step_seconds=0.0, work=Work(),
        )  # fmt: skip
        assert out.work is not None
        mcfg, size = self.model.cfg, self.model.element_size
        for seq in admitted:
            if seq.kv is not None:
                self._load(seq, decoding)
                continue
            began = self._clock()
            logits = self.model.prefill(seq.tokens, seq.slot)
            out.work.add(prefill_work(mcfg, len(seq.tokens), size))
            seq.cached = len(seq.tokens)
            first = m.sample(logits[None, :], [seq.req.temperature], [seq.sampler], self.cfg.eos_id)
            self._slow_down(began)
            self._emit(seq, first[0], out)
        if decoding:
            if self.decode_overhead_s > 0:
                step_overhead(self.decode_overhead_s)
            began = self._clock()
            positions = [s.cached for s in decoding]
            logits = self.model.decode(
                [s.tokens[-1] for s in decoding],
                [s.slot for s in decoding],
                positions,
            )
            out.work.add(decode_work(mcfg, len(decoding), max(positions) + 1, size))
            for s in decoding:
                s.cached += 1
            temps = [s.req.temperature for s in decoding]
            tokens = m.sample(logits, temps, [s.sampler for s in decoding], self.cfg.eos_id)
            self._slow_down(began)
            for seq, token in zip(decoding, tokens, strict=True):
                self._emit(seq, token, out)
        now = time.monotonic()
        out.at = now
        for seq in [s for s in st.running if s.req.request_id in out.finished]:
            self._release(seq)
        out.waiting = len(st.waiting)
        out.running = len(st.running)
        out.kv_usage = 1.0 - st.free_blocks / st.total_blocks
        out.preemptions = st.preemptions
        out.step_seconds = now - started
        return out

    def _clock(self) -> float:
        """What a forward pass's work is measured by: on a CPU the worker's CPU time per
        torch thread (its compute, not the moments a busy host's neighbours hold the core),
        on a GPU the wall clock."""
        if str(self.model.device).startswith("cuda"):
            return time.monotonic()
        return time.process_time() / max(1, self.cfg.threads)

    def _slow_down(self, began: float) -> None:
        """``slowdown``: the pass whose work began at ``began`` (:meth:`_clock`; sampling read
        back, so its work is done) takes ``slowdown`` times as long; the rest is a wait, not
        CPU work. A slower accelerator's kernels take longer for the same work; a busy host
        does not make them longer still."""
        if self.cfg.slowdown > 1.0:
            time.sleep((self.cfg.slowdown - 1.0) * max(0.0, self._clock() - began))

    def _load(self, seq: _Seq, decoding: list[_Seq]) -> None:
        """A transferred prompt cache: every position but the last is loaded, and the last
        prompt token joins this step's decode batch, whose logits give the first token (as
        vLLM's decode server computes the one position the transfer leaves out)."""
        kv, seq.kv = seq.kv, None
        assert kv is not None
        n = len(seq.tokens)
        self.model.import_kv(seq.slot, n, kv)
        seq.cached = n - 1
        decoding.append(seq)

    def _emit(self, seq: _Seq, token: int, out: StepOutput) -> None:
        now = time.monotonic()
        seq.tokens.append(token)
        seq.generated += 1
        rid = seq.req.request_id
        out.tokens.append((rid, token))
        if seq.generated == 1 and seq.first_token == 0.0:
            seq.first_token = now
            out.first[rid] = (seq.queued, seq.scheduled)
        done = seq.generated >= seq.req.max_tokens or len(seq.tokens) >= self.cfg.max_model_len
        if done:
            if seq.req.export_kv:
                out.exported[rid] = self.model.export_kv(seq.slot, len(seq.req.prompt))
            out.finished[rid] = Finished(
                reason="length",
                queued=seq.queued,
                scheduled=seq.scheduled,
                first_token=seq.first_token,
                last_token=now,
                prompt_tokens=len(seq.req.prompt),
                generated=seq.generated,
            )
            self.by_id.pop(rid, None)

    def _admit(self) -> list[_Seq]:
        st, cfg = self.state, self.cfg
        admitted: list[_Seq] = []
        budget = cfg.max_num_batched_tokens
        while st.waiting and len(st.running) < min(cfg.max_num_seqs, st.slots):
            seq = st.waiting[0]
            need = self._blocks_for(len(seq.tokens) + 1)
            if need > st.free_blocks:
                break
            if len(seq.tokens) > budget and admitted:
                break
            st.waiting.popleft()
            budget -= len(seq.tokens)
            seq.slot = len(st.running)
            seq.blocks = need
            st.free_blocks -= need
            if seq.scheduled == 0.0:
                seq.scheduled = time.monotonic()
            seq.admitted_at = st.step
            st.running.append(seq)
            admitted.append(seq)
        return admitted

    def _make_room(self) -> None:
        """Give each running sequence the block its next position needs, oldest first,
        preempting the most recently admitted sequences while the pool is exhausted."""
        st = self.state
        for seq in sorted(st.running, key=lambda s: s.admitted_at):
            if seq not in st.running:
                continue
            need = self._blocks_for(seq.cached + 1) - seq.blocks
            while need > st.free_blocks and seq in st.running:
                self._preempt(max(st.running, key=lambda s: s.admitted_at))
            if seq in st.running and need > 0:
                st.free_blocks -= need
                seq.blocks += need

    def _preempt(self, seq: _Seq) -> None:
        st = self.state
        self._release(seq)
        seq.cached = 0
        st.waiting.appendleft(seq)
        st.preemptions += 1

    def _release(self, seq: _Seq) -> None:
        """Take ``seq`` out of the batch; the last running sequence moves into its slot."""
        st = self.state
        index = st.running.index(seq)
        last = st.running.pop()
        if last is not seq:
            self.model.move_slot(last.slot, index, last.cached)
            last.slot = index
            st.running[index] = last
        seq.slot = -1
        st.free_blocks += seq.blocks
        seq.blocks = 0

    def _blocks_for(self, positions: int) -> int:
        return math.ceil(positions / self.cfg.block_size)

    def _stall(self) -> None:
        """h2d-stall: a synchronous copy from pageable host memory before the step's kernels;
        the GPU runs no kernel until it completes. Large and periodic (by default 4 GiB every
        24 steps), so that NVML's utilisation samples (one per ~1/6 s) see the GPU alternate
        between saturated bursts of steps and idle copies."""
        import torch  # noqa: PLC0415

        if self._stall_src is None:
            n = self.cfg.h2d_stall_mib * 1024 * 1024 // 4
            self._stall_src = torch.empty(n, dtype=torch.float32).fill_(1.0)  # pageable
        self.h2d.copy(self._stall_src, self.model.device, non_blocking=False)
        self.h2d.flush()


def step_overhead(cpu_seconds: float) -> None:
    """decode-overhead: ``cpu_seconds`` of pure-Python work of this thread before a decode step,
    the shape of per-step host work an engine does between kernels (scheduling, building the
    batch's inputs, sampling parameters, detokenising) when it is not overlapped with the
    device. CPU time, not wall time: under contention it stretches as the step's compute does."""
    hold_gil("decode-overhead: the host prepares the next step", cpu_seconds)


def _h2d_snapshot(registry: Any) -> tuple[tuple[tuple[float, float], ...], float] | None:
    for family in registry.collect():
        buckets: list[tuple[float, float]] = []
        total = 0.0
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), float(sample.value)))
            elif sample.name.endswith("_sum"):
                total = float(sample.value)
        if buckets:
            return tuple(buckets), total
    return None


class HbmNeighbour(threading.Thread):
    """hbm-saturation: a noisy neighbour on the engine's GPU. After ``after_s`` seconds it
    copies ``mib`` MiB from one device buffer to another, back to back, on its own CUDA stream:
    every copy reads and writes device memory at the rate HBM allows, so the engine's decode
    steps (which read the weights and the KV cache) get a share of the bandwidth only. The
    thread waits on the stream between batches of copies, releasing the GIL."""

    def __init__(self, device: str, mib: int, after_s: float) -> None:
        super().__init__(name="hbm-neighbour", daemon=True)
        self.device, self.mib, self.after_s = device, mib, after_s

    def run(self) -> None:
        import torch  # noqa: PLC0415

        time.sleep(self.after_s)
        elements = self.mib * 1024 * 1024 // 2
        src = torch.ones(elements, dtype=torch.float16, device=self.device)
        dst = torch.empty_like(src)
        stream = torch.cuda.Stream(device=self.device)
        with torch.cuda.stream(stream):
            while True:
                for _ in range(4):
                    dst.copy_(src)
                stream.synchronize()


def build(cfg: WorkerConfig) -> tuple[Scheduler, dict[str, Any], Any]:
    """Model, cache and scheduler for ``cfg``; returns (scheduler, info, h2d registry)."""
    import torch  # noqa: PLC0415

    from exporter.lab.refengine import torch_model as m  # noqa: PLC0415

    device = m.pick_device(cfg.device)
    nice = cfg.nice if cfg.nice >= 0 else (0 if device.startswith("cuda") else CPU_NICE)
    if nice:
        os.nice(nice)
    if cfg.require_cuda and not device.startswith("cuda"):
        raise RuntimeError(
            f"{cfg.require_cuda} needs a CUDA device (torch sees none, or --device cpu)"
        )
    m.set_threads(cfg.threads)
    name = cfg.size if cfg.size in SIZES else ("medium" if device.startswith("cuda") else "tiny")
    size = SIZES[name]
    mcfg = m.ModelConfig(
        vocab_size=cfg.vocab_size,
        layers=cfg.layers or size["layers"],
        d_model=cfg.d_model or size["d_model"],
        heads=cfg.heads or size["heads"],
        max_len=cfg.max_model_len,
        seed=cfg.seed,
    )
    dtype = m.default_dtype(device)
    slots = cfg.max_num_seqs
    reserve: Any = None
    if cfg.memory_fill_ratio > 0 and device.startswith("cuda"):
        # vLLM's gpu_memory_utilization: the KV pool takes the device memory up to the ratio.
        free, total = torch.cuda.mem_get_info()
        target = int(total * cfg.memory_fill_ratio) - (total - free)
        if target > 0:
            reserve = torch.empty(target, dtype=torch.uint8, device=device)
    with torch.inference_mode():
        model = m.Model(mcfg, slots=slots, device=device, dtype=dtype)
    model.reserve = reserve
    h2d: Any = None
    registry: Any = None
    if cfg.h2d_stall_mib > 0:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415

        from exporter.instrument.torch_h2d import H2DTimer  # noqa: PLC0415

        registry = CollectorRegistry(auto_describe=False)
        h2d = H2DTimer(cfg.model_name, registry=registry)
    scheduler = Scheduler(cfg, model, h2d)
    if cfg.hbm_saturation_mib > 0 and device.startswith("cuda"):
        HbmNeighbour(device, cfg.hbm_saturation_mib, cfg.hbm_saturation_after_s).start()
    if cfg.model_dir:
        write_model_dir(model, Path(cfg.model_dir), eos_id=cfg.eos_id)
    info = {
        "size": name,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "weight_bytes": model.weight_bytes(),
        "kv_bytes_per_token": mcfg.kv_bytes_per_token(model.element_size),
        "parameters": mcfg.parameters(),
        "layers": mcfg.layers,
        "d_model": mcfg.d_model,
        "heads": mcfg.heads,
        "head_dim": mcfg.head_dim,
        "element_size": model.element_size,
        "kv_cache_bytes": model.cache_bytes() + (reserve.numel() if reserve is not None else 0),
        "kv_blocks": scheduler.state.total_blocks,
        "threads": torch.get_num_threads(),
        "nice": nice,
        "slowdown": cfg.slowdown,
    }
    return scheduler, info, registry


def write_model_dir(model: Any, directory: Path, *, eos_id: int) -> None:
    """The model as a Hugging Face directory: ``config.json`` and
    ``model.safetensors.index.json`` (every tensor's name and ``metadata.total_size``). The
    weights themselves are not written: they are random, regenerated from the seed. Each file
    is written whole and then renamed, so a reader never sees half of one."""
    from exporter.lab.refengine import torch_model as m  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": m.hf_config(model, eos_id=eos_id),
        "model.safetensors.index.json": m.hf_index(model),
    }
    for name, content in files.items():
        tmp = directory / f".{name}.tmp"
        tmp.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, directory / name)


def warm_up(scheduler: Scheduler) -> None:
    """One short request end to end, so the first real one does not pay for lazy init."""
    req = Request("warm-up", tuple(range(1, 9)), 2, 1.0, 0)
    scheduler.add(req, time.monotonic())
    for _ in range(4):
        if not scheduler.busy:
            break
        scheduler.step()


def main(conn: Any, cfg: WorkerConfig) -> None:
    """Entry point of the worker process."""
    try:
        import torch  # noqa: PLC0415

        scheduler, info, registry = build(cfg)
        with torch.inference_mode():
            warm_up(scheduler)
    except Exception as err:
        conn.send(("fatal", f"model worker failed to start: {err}"))
        return
    conn.send(("ready", info))
    try:
        with torch.inference_mode():
            _loop(conn, scheduler, registry)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return


def _loop(conn: Any, scheduler: Scheduler, registry: Any) -> None:
    while True:
        # Block while idle; never wait while there is work.
        if conn.poll(0 if scheduler.busy else IDLE_WAIT_S):
            while conn.poll(0):
                if not _handle(conn, scheduler, conn.recv()):
                    return
        if not scheduler.busy:
            continue
        out = scheduler.step()
        if registry is not None:
            out.h2d = _h2d_snapshot(registry)
        conn.send(("step", out))


def _state(scheduler: Scheduler, finished: dict[str, Finished] | None = None) -> StepOutput:
    """The scheduler's state as a step's report, with no step run (``finished``: requests it
    refused): the front-end's gauges follow these reports."""
    now = time.monotonic()
    st = scheduler.state
    return StepOutput(
        at=now,
        tokens=[],
        first={},
        finished=finished or {},
        waiting=len(st.waiting),
        running=len(st.running),
        kv_usage=1.0 - st.free_blocks / st.total_blocks,
        preemptions=st.preemptions,
        step_seconds=0.0,
    )


def _handle(conn: Any, scheduler: Scheduler, msg: tuple[Any, ...]) -> bool:
    """Apply one message from the front-end; False on ``stop``."""
    if msg[0] == "stop":
        return False
    if msg[0] == "abort":
        scheduler.abort(msg[1])
        # An abort that leaves nothing to run leaves no step to report it: say so now, or the
        # engine's running and KV-cache gauges keep the last step's values while it idles
        # (the clients of a closed loop that stops drop their open requests).
        if not scheduler.busy:
            conn.send(("step", _state(scheduler)))
    elif msg[0] == "tune":
        scheduler.decode_overhead_s = max(0.0, float(msg[1]["decode_overhead_ms"])) / 1000.0
    elif msg[0] == "add":
        req: Request = msg[1]
        error = scheduler.add(req, time.monotonic())
        if error is not None:
            now = time.monotonic()
            refused = Finished(f"error: {error}", now, now, now, now, len(req.prompt), 0)
            conn.send(("step", _state(scheduler, {req.request_id: refused})))
    return True
