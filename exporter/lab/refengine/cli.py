"""``python -m exporter.lab.refengine``: run the reference engine.

Prints ``listening on http://HOST:PORT`` on stderr once the model is ready (``--port 0``
picks a free port); SIGTERM or SIGINT stops the server, the model worker and any injection
helpers within a few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from exporter.config import ArgumentParser, parse_duration, usage_error
from exporter.lab.refengine import DEFAULT_MODEL_NAME, inject

PROG = "python -m exporter.lab.refengine"
log = logging.getLogger("exporter.lab.refengine")


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog=PROG,
        description=(
            "A small real LLM server (random-weight transformer, BPE tokenizer, continuous "
            "batching) with vLLM's API and metrics, and injectable bottlenecks."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    p.add_argument("--served-model-name", default=DEFAULT_MODEL_NAME, help="model name")
    p.add_argument("--device", default="auto", help="auto (CUDA if torch sees a GPU), cpu, cuda")
    p.add_argument(
        "--size",
        default="",
        help="tiny, small, medium, large (default: tiny on CPU, medium on GPU)",
    )
    p.add_argument("--layers", type=int, default=0, help="override the size's layers")
    p.add_argument("--d-model", type=int, default=0, help="override the size's width")
    p.add_argument("--heads", type=int, default=0, help="override the size's attention heads")
    p.add_argument("--max-model-len", type=int, default=1024, help="longest sequence")
    p.add_argument("--max-num-seqs", type=int, default=16, help="most sequences in a batch")
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=2048, help="prefill tokens per step"
    )
    p.add_argument("--block-size", type=int, default=16, help="KV cache block size (tokens)")
    p.add_argument("--kv-blocks", type=int, default=0, help="KV blocks (0: the physical cache)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: auto)")
    p.add_argument("--vocab-size", type=int, default=2048, help="BPE vocabulary to train")
    p.add_argument("--seed", type=int, default=0, help="weights seed")
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="NAME[,NAME]",
        help="bottlenecks to inject: " + ", ".join(inject.INJECTIONS),
    )
    p.add_argument("--inject-duration", default="10m", help="helper processes stop after this")
    for name, size in inject.INJECTION_SIZES.items():
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=float,
            default=size.default,
            help=size.help + " (also POST /lab/injection while it runs)",
        )
    p.add_argument(
        "--flood-max-num-seqs", type=int, default=1, help="queue-flood: admission capacity"
    )
    p.add_argument(
        "--contention-procs",
        type=int,
        default=0,
        help="cpu-contention: busy processes (0: 4 per usable CPU, at most 128)",
    )
    p.add_argument(
        "--softirq-max-rate", type=float, default=100000.0, help="softirq: most sends per second"
    )
    p.add_argument("--h2d-stall-mib", type=int, default=4096, help="h2d-stall: MiB per copy")
    p.add_argument(
        "--h2d-stall-every", type=int, default=24, help="h2d-stall: steps between copies"
    )
    p.add_argument(
        "--memory-fill", type=float, default=0.96, help="memory-pressure: device memory share"
    )
    p.add_argument(
        "--hbm-saturation-mib", type=int, default=4096, help="hbm-saturation: MiB per copy"
    )
    p.add_argument(
        "--hbm-saturation-after",
        type=float,
        default=120.0,
        help="hbm-saturation: seconds of normal running before the neighbour starts",
    )
    p.add_argument(
        "--memory-pressure-blocks",
        type=int,
        default=40,
        help="memory-pressure: KV blocks of the pool (640 tokens at block size 16)",
    )
    p.add_argument(
        "--model-dir",
        default="",
        metavar="DIR",
        help="write the model's Hugging Face description here at start-up (config.json, "
        "model.safetensors.index.json; not the weights), for the sidecar's --model.path",
    )
    p.add_argument(
        "--worker-slowdown",
        type=float,
        default=1.0,
        help="every forward pass of the model worker takes this many times as long (the rest "
        "a wait, as a slower accelerator's kernels: no more host CPU); 1: its own speed",
    )
    p.add_argument(
        "--worker-nice",
        type=int,
        default=-1,
        help="nice value of the model worker (-1: 5 on CPU, where its compute stands in for "
        "the GPU, 0 on CUDA)",
    )
    p.add_argument(
        "--role",
        default="both",
        choices=ROLES,
        help="part in disaggregated serving: prefill (runs prompts, serves their KV cache), "
        "decode (reads the cache, generates), both (colocated)",
    )
    p.add_argument(
        "--prefill-url",
        default="",
        metavar="URL",
        help="decode: send plain requests to this prefill server first (the pair's front)",
    )
    p.add_argument(
        "--kv-port", type=int, default=0, help="prefill: port of the KV link (0: a free one)"
    )
    p.add_argument(
        "--kv-lease",
        default="30s",
        help="prefill: a held KV cache not read within this expires (vLLM's kv_lease_duration)",
    )
    p.add_argument(
        "--decode-pool-slots",
        type=int,
        default=2,
        help="decode-pool-short: running sequences the decode server admits",
    )
    p.add_argument("--log.level", dest="log_level", default="info", help="debug, info, warning")
    return p


ROLES = ("both", "prefill", "decode")
MAX_SLOWDOWN = 100.0


def injection_sizes(args: argparse.Namespace) -> dict[str, float]:
    """The injections' sizes given on the command line (``inject.INJECTION_SIZES``' keys)."""
    return {name: float(getattr(args, name)) for name in inject.INJECTION_SIZES}


def _check_role(args: argparse.Namespace, injections: frozenset[str]) -> None:
    """Disaggregation flags that mean nothing for the role given are refused."""
    if args.prefill_url and args.role != "decode":
        _fail("--prefill-url: only a decode server (--role decode) sends to a prefill server")
    if args.prefill_url and not args.prefill_url.startswith(("http://", "https://")):
        _fail(f"--prefill-url: not an http(s) URL: {args.prefill_url!r}")
    if "kv-transfer-slow" in injections and args.role == "both":
        _fail("--inject kv-transfer-slow: needs a KV link (--role prefill or decode)")
    if "decode-pool-short" in injections and args.role != "decode":
        _fail("--inject decode-pool-short: needs a decode server (--role decode)")
    if args.decode_pool_slots < 1:
        _fail(f"--decode-pool-slots: must be at least 1, got {args.decode_pool_slots}")
    if not 0 <= args.kv_port <= 65535:
        _fail(f"--kv-port: {args.kv_port} is not a port")


def _fail(message: str) -> NoReturn:
    usage_error(PROG, message)


def auto_threads() -> int:
    cpus = len(os.sched_getaffinity(0))
    # Leave the front-end, the sidecar and the load generator a core on small machines.
    return 1 if cpus <= 4 else min(8, cpus // 2)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        injections = inject.parse(args.inject)
        inject_duration = parse_duration(args.inject_duration)
        args.kv_lease_s = parse_duration(args.kv_lease)
    except ValueError as err:
        _fail(str(err))
    _check_role(args, injections)
    from exporter.lab.refengine.worker import SIZES  # noqa: PLC0415

    if args.size and args.size not in SIZES:
        _fail(f"--size: unknown size {args.size!r} (known: {', '.join(SIZES)})")
    for name, value, low in (
        ("--max-model-len", args.max_model_len, 32),
        ("--max-num-seqs", args.max_num_seqs, 1),
        ("--block-size", args.block_size, 1),
        ("--vocab-size", args.vocab_size, 300),
        ("--flood-max-num-seqs", args.flood_max_num_seqs, 1),
    ):
        if value < low:
            _fail(f"{name}: must be at least {low}, got {value}")
    for name, value in injection_sizes(args).items():
        problem = inject.INJECTION_SIZES[name].problem(value)
        if problem:
            _fail(f"--{name.replace('_', '-')}: {problem}")
    if not 1.0 <= args.worker_slowdown <= MAX_SLOWDOWN:
        _fail(
            f"--worker-slowdown: must be from 1 to {MAX_SLOWDOWN:g}, got {args.worker_slowdown:g}"
        )
    if not 0 <= args.port <= 65535:
        _fail(f"--port: {args.port} is not a port")
    try:
        return asyncio.run(_run(args, injections, inject_duration))
    except StartupError as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        return 1


class StartupError(RuntimeError):
    pass


def _max_num_seqs(args: argparse.Namespace, injections: frozenset[str]) -> int:
    slots = int(args.max_num_seqs)
    if "queue-flood" in injections:
        slots = min(slots, args.flood_max_num_seqs)
    if "decode-pool-short" in injections:
        slots = min(slots, args.decode_pool_slots)
    return slots


async def _run(args: argparse.Namespace, injections: frozenset[str], duration: float) -> int:
    from aiohttp import web  # noqa: PLC0415

    from exporter.lab.refengine import bpe  # noqa: PLC0415
    from exporter.lab.refengine.server import Frontend, FrontendConfig, WorkerGoneError  # noqa: PLC0415
    from exporter.lab.refengine.worker import WorkerConfig  # noqa: PLC0415

    started = time.monotonic()
    tok = bpe.train(args.vocab_size)
    device = args.device
    gpu_only = sorted(injections & inject.CUDA_ONLY)
    worker_cfg = WorkerConfig(
        vocab_size=tok.vocab_size,
        eos_id=tok.eos_id,
        size=args.size or "auto",
        layers=args.layers,
        d_model=args.d_model,
        heads=args.heads,
        max_model_len=args.max_model_len,
        max_num_seqs=_max_num_seqs(args, injections),
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        kv_blocks=args.kv_blocks,
        device=device,
        threads=args.threads or auto_threads(),
        seed=args.seed,
        h2d_stall_mib=args.h2d_stall_mib if "h2d-stall" in injections else 0,
        h2d_stall_every=max(1, args.h2d_stall_every),
        memory_fill_ratio=args.memory_fill if "memory-pressure" in injections else 0.0,
        memory_pressure="memory-pressure" in injections,
        memory_pressure_blocks=args.memory_pressure_blocks,
        hbm_saturation_mib=args.hbm_saturation_mib if "hbm-saturation" in injections else 0,
        hbm_saturation_after_s=max(0.0, args.hbm_saturation_after),
        model_name=args.served_model_name,
        require_cuda=", ".join(gpu_only),
        nice=args.worker_nice,
        decode_overhead_ms=args.decode_overhead_ms if "decode-overhead" in injections else 0.0,
        model_dir=str(Path(args.model_dir).resolve()) if args.model_dir else "",
        slowdown=args.worker_slowdown,
    )
    frontend = Frontend(
        FrontendConfig(
            model_name=args.served_model_name,
            max_model_len=args.max_model_len,
            injections=injections,
            sizes=injection_sizes(args),
            role=args.role,
            prefill_url=args.prefill_url,
            kv_host=args.host,
            kv_port=args.kv_port,
            kv_lease_s=args.kv_lease_s,
        ),
        tok,
        worker_cfg,
    )
    node_cpus = inject.pin_engine(injections)  # before the worker is spawned: it inherits it
    if node_cpus:
        log.info("softirq: the engine runs on CPU %d, the flood's core", node_cpus[-1])
    try:
        await frontend.start()
    except WorkerGoneError as err:
        await frontend.stop()
        raise StartupError(str(err)) from None
    info = frontend.info
    log.info(
        "model %s ready on %s: %d layers, width %d, %d heads, %.1fM parameters (%s, %.1f MB), "
        "vocabulary %d, KV cache %.0f MiB in %d blocks, %d torch threads, %.1fs to start",
        info["size"],
        info["device"],
        info["layers"],
        info["d_model"],
        info["heads"],
        info["parameters"] / 1e6,
        info["dtype"],
        info["weight_bytes"] / 1e6,
        tok.vocab_size,
        info["kv_cache_bytes"] / 2**20,
        info["kv_blocks"],
        info["threads"],
        time.monotonic() - started,
    )
    helpers = inject.Helpers.start(
        injections,
        duration=duration,
        contention_procs=args.contention_procs,
        softirq_target=args.softirq_target,
        softirq_max_rate=args.softirq_max_rate,
        cpus=node_cpus,
    )
    frontend.on_resize = lambda sizes: (
        helpers.retarget(sizes["softirq_target"]) if "softirq_target" in sizes else None
    )
    if injections:
        log.info("injected: %s", ", ".join(sorted(injections)))
    runner = web.AppRunner(frontend.app(), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, shutdown_timeout=1.0)
    try:
        await site.start()
    except OSError as err:
        helpers.stop()
        await runner.cleanup()
        await frontend.stop()
        raise StartupError(f"cannot listen on {args.host}:{args.port}: {err.strerror}") from None
    for address in runner.addresses:
        host, port = address[0], address[1]
        shown = f"[{host}]" if ":" in str(host) else host
        log.info("listening on http://%s:%s", shown, port)
    if frontend.kv_server is not None:
        log.info("KV link on %s:%d (role prefill)", *frontend.kv_server.address)
    elif args.role == "decode":
        log.info(
            "role decode%s", f", prefill server {args.prefill_url}" if args.prefill_url else ""
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(_watch(frontend, stop))
    await stop.wait()
    watcher.cancel()
    worker_ok = frontend.worker_ok
    log.info("shutting down")
    helpers.stop()
    with_timeout = asyncio.wait_for(runner.cleanup(), timeout=3.0)
    try:
        await with_timeout
    except TimeoutError:
        log.warning("HTTP server did not close in time")
    await frontend.stop()
    log.info("stopped")
    return 0 if worker_ok else 1


async def _watch(frontend: object, stop: asyncio.Event) -> None:
    """Stop the server when the model worker dies."""
    from exporter.lab.refengine.server import Frontend  # noqa: PLC0415

    assert isinstance(frontend, Frontend)
    while not stop.is_set():
        await asyncio.sleep(1.0)
        if not frontend.worker_ok:
            log.error("the model worker is gone; stopping")
            stop.set()
