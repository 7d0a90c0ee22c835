"""A small text-generation model served by Triton Inference Server through PyTriton.

Run by the PyTriton virtualenv's Python (:func:`exporter.lab.thirdparty.install_pytriton`),
never by the sidecar: it imports only NumPy and PyTriton. Model ``tiny`` takes
``text_input`` (bytes) and ``max_tokens`` (int32) and answers ``text_output`` once the whole
generation is done, through Triton's HTTP ``/v2/models/tiny/generate`` (the load generator's
``--api triton``); Triton's own ``nv_inference_*`` metrics are on ``--metrics-port``.

Each generated token is one decode step: a few matrix-vector products of random float32
weights on the host (``--layers`` of ``--width``; NumPy on one thread), then a wait of
``--device-ms`` that stands in for the device's kernels, during which the host thread sleeps
as a CUDA host thread does in a synchronising call. ``--instances`` model instances run side
by side (Triton admits one request per instance; the rest wait in Triton's queue, which is
what ``nv_inference_queue_duration_us`` and ``nv_inference_pending_request_count`` measure).
The model is not batched: one request is one execution.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

MODEL = "tiny"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m exporter.lab.tritonmodel")
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--instances", type=int, default=4, help="model instances (4)")
    p.add_argument("--width", type=int, default=256, help="hidden width (256)")
    p.add_argument("--layers", type=int, default=4, help="matrix-vector products a step (4)")
    p.add_argument("--device-ms", type=float, default=3.0, help="device wait a step (3.0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-model", action="store_true", help="serve no model (what an unloaded one leaves)"
    )
    return p


def make_infer(args: argparse.Namespace) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    import numpy as np  # noqa: PLC0415 - only in the PyTriton virtualenv

    rng = np.random.default_rng(args.seed)
    weights = [
        (rng.standard_normal((args.width, args.width)) / np.sqrt(args.width)).astype(np.float32)
        for _ in range(args.layers)
    ]
    device_s = args.device_ms / 1000.0

    def infer(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answers = []
        for request in requests:
            steps = max(1, min(int(request["max_tokens"].reshape(-1)[0]), 4096))
            x = np.ones(args.width, np.float32)
            words = []
            for _ in range(steps):
                for w in weights:
                    x = np.tanh(w @ x)
                time.sleep(device_s)
                words.append(f"t{int(abs(x[0]) * 1000) % 97}")
            text = " ".join(words).encode()
            answers.append({"text_output": np.array([text], dtype=object)})
        return answers

    return infer


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy as np  # noqa: PLC0415
    from pytriton.model_config import ModelConfig, Tensor  # noqa: PLC0415
    from pytriton.triton import Triton, TritonConfig  # noqa: PLC0415

    logging.basicConfig(level=logging.INFO)
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        log_verbose=0,
    )
    with Triton(config=config) as triton:
        if args.no_model:
            print("serving no model", flush=True)
            triton.serve()
            return 0
        triton.bind(
            model_name=MODEL,
            infer_func=[make_infer(args) for _ in range(max(1, args.instances))],
            inputs=[
                Tensor(name="text_input", dtype=bytes, shape=(1,)),
                Tensor(name="max_tokens", dtype=np.int32, shape=(1,)),
            ],
            outputs=[Tensor(name="text_output", dtype=bytes, shape=(1,))],
            config=ModelConfig(batching=False),
        )
        print(f"serving {MODEL} on 127.0.0.1:{args.http_port}", flush=True)
        triton.serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
