"""The reference engine disaggregated: a prefill and a decode process handing the KV cache over.

Three engines on loopback: a prefill server (a short KV lease, so an unread cache expires within
the test), a decode server in front of it, and a second decode server whose link is throttled
(``kv-transfer-slow``). The bytes, the transfer histograms and the failure counters are read
from the engines' own ``/metrics`` under vLLM's NIXL names.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.refengine import Engine

from exporter.lab.processes import child_pythonpath
from exporter.lab.refengine import kv_transfer
from exporter.lab.refengine.torch_model import ModelConfig

SLOW_MIB_S = 8.0
LEASE_S = 2.0
# The tiny model on a CPU (float32): 4 layers, 4 heads of 64.
LAYERS, HEADS, HEAD_DIM, ELEMENT = 4, 4, 64, 4
BLOCK = 16


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Engine]]:
    workdir = tmp_path_factory.mktemp("disagg")
    prefill = Engine(workdir / "prefill.log", "--role", "prefill", "--kv-lease", f"{LEASE_S:g}s")
    engines = {"prefill": prefill}
    try:
        engines["decode"] = Engine(
            workdir / "decode.log", "--role", "decode", "--prefill-url", prefill.url
        )
        engines["slow"] = Engine(
            workdir / "slow.log",
            "--role",
            "decode",
            "--prefill-url",
            prefill.url,
            "--inject",
            "kv-transfer-slow",
            "--kv-link-mib-s",
            f"{SLOW_MIB_S:g}",
        )
        yield engines
    finally:
        for engine in engines.values():
            engine.stop()


def metrics(engine: Engine) -> dict[str, float]:
    status, body = engine.request("GET", "/metrics")
    assert status == 200
    return {
        s.name: s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if "le" not in s.labels
    }


def kv_bytes(tokens: int) -> int:
    """layers x 2 x kv heads x head_dim x tokens x element size."""
    return LAYERS * 2 * HEADS * HEAD_DIM * tokens * ELEMENT


def complete(engine: Engine, prompt: list[int], **extra: object) -> dict[str, object]:
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, **extra}
    status, raw = engine.request("POST", "/v1/completions", body, timeout=60)
    assert status == 200, raw
    answer: dict[str, object] = json.loads(raw)
    return answer


def prompt(n: int, start: int = 7) -> list[int]:
    return [start + (i * 13) % 900 for i in range(n)]


def test_the_kv_size_is_the_models() -> None:
    cfg = ModelConfig(vocab_size=2048, layers=LAYERS, d_model=HEADS * HEAD_DIM, heads=HEADS)
    assert kv_bytes(1) == cfg.kv_bytes_per_token(ELEMENT)
    meta = kv_transfer.KVMeta(100, LAYERS, HEADS, HEAD_DIM, ELEMENT)
    assert meta.nbytes == kv_bytes(100)
    assert meta.descriptors(BLOCK) == LAYERS * 2 * 7


def test_bytes_transferred_are_the_prompts_kv_cache(pair: dict[str, Engine]) -> None:
    decode = pair["decode"]
    before = metrics(decode)
    for n in (100, 37):
        complete(decode, prompt(n))
    after = metrics(decode)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert delta["vllm:nixl_bytes_transferred_sum"] == kv_bytes(100) + kv_bytes(37)
    assert delta["vllm:nixl_bytes_transferred_count"] == 2
    expected_descriptors = LAYERS * 2 * (math.ceil(100 / BLOCK) + math.ceil(37 / BLOCK))
    assert delta["vllm:nixl_num_descriptors_sum"] == expected_descriptors
    assert delta["vllm:nixl_xfer_time_seconds_count"] == 2
    assert delta["vllm:nixl_xfer_time_seconds_sum"] > 0
    assert delta["vllm:nixl_post_time_seconds_count"] == 2
    assert delta["vllm:time_to_first_token_seconds_count"] == 2
    assert delta["vllm:nixl_num_failed_transfers_total"] == 0
    # The prefill server ran the prompts (one token each) and held nothing back.
    prefill = metrics(pair["prefill"])
    assert prefill["vllm:nixl_bytes_transferred_count"] == 0
    assert prefill["vllm:prompt_tokens_total"] >= 137


def test_decoding_from_the_transferred_cache_matches_colocated(pair: dict[str, Engine]) -> None:
    """Greedy output from the read cache equals the prefill server's own (same weights): the
    bytes are the real keys and values, not a stand-in of the right size."""
    ids = prompt(60, start=11)
    remote = complete(pair["decode"], ids, max_tokens=6)
    local = complete(pair["prefill"], ids, max_tokens=6)
    assert remote["choices"][0]["text"] == local["choices"][0]["text"]  # type: ignore[index]


def test_the_transfer_histogram_grows(pair: dict[str, Engine]) -> None:
    decode = pair["decode"]
    counts = []
    for _ in range(3):
        complete(decode, prompt(48))
        m = metrics(decode)
        counts.append(
            (m["vllm:nixl_xfer_time_seconds_count"], m["vllm:nixl_xfer_time_seconds_sum"])
        )
    assert counts[0][0] < counts[1][0] < counts[2][0]
    assert counts[0][1] < counts[1][1] < counts[2][1]


def test_a_throttled_link_takes_the_links_time(pair: dict[str, Engine]) -> None:
    n = 256
    fast, slow = pair["decode"], pair["slow"]
    means, queued = {}, {}
    for name, engine in (("fast", fast), ("slow", slow)):
        before = metrics(engine)
        for _ in range(2):
            complete(engine, prompt(n))
        after = metrics(engine)
        count = (
            after["vllm:nixl_xfer_time_seconds_count"] - before["vllm:nixl_xfer_time_seconds_count"]
        )
        total = after["vllm:nixl_xfer_time_seconds_sum"] - before["vllm:nixl_xfer_time_seconds_sum"]
        assert count == 2
        means[name] = total / count
        waited = (
            after["vllm:request_queue_time_seconds_sum"]
            - before["vllm:request_queue_time_seconds_sum"]
        )
        queued[name] = waited / count
    expected = kv_bytes(n) / (SLOW_MIB_S * 2**20)  # 2 MiB at 8 MiB/s: 0.25 s
    assert expected * 0.95 <= means["slow"] <= expected * 1.6 + 0.1, means
    assert means["slow"] >= 10 * means["fast"], means
    # As vLLM's decode engine, the request waits in the queue while its cache is read: the
    # queue time holds the transfer (the latency budget takes it out again).
    assert queued["slow"] >= means["slow"], (queued, means)


def test_a_reader_that_drops_the_connection_leaves_the_cache_to_expire(
    pair: dict[str, Engine],
) -> None:
    prefill = pair["prefill"]
    before = metrics(prefill)["vllm:nixl_num_kv_expired_reqs_total"]
    answer = complete(
        prefill, prompt(200), max_tokens=1, kv_transfer_params={"do_remote_decode": True}
    )
    params = answer["kv_transfer_params"]
    assert isinstance(params, dict)
    with socket.create_connection((params["remote_host"], params["remote_port"]), timeout=10) as s:
        s.sendall(f"PULL {params['remote_request_id']}\n".encode())
        assert s.recv(1) == b"K"
        s.recv(4096)  # part of the cache, then the decode side goes away without a notice
    deadline = time.monotonic() + LEASE_S + 10
    while time.monotonic() < deadline:
        if metrics(prefill)["vllm:nixl_num_kv_expired_reqs_total"] == before + 1:
            break
        time.sleep(0.25)
    assert metrics(prefill)["vllm:nixl_num_kv_expired_reqs_total"] == before + 1
    # Expired: a late read finds nothing.
    with pytest.raises(kv_transfer.TransferError, match="does not hold"):
        kv_transfer.pull(params["remote_host"], params["remote_port"], params["remote_request_id"])


def _half_server() -> tuple[socket.socket, threading.Thread]:
    """A KV link that announces a cache and closes half-way through it."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    meta = kv_transfer.KVMeta(10, LAYERS, HEADS, HEAD_DIM, ELEMENT)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(256)
            head = meta.to_json()
            conn.sendall(
                b"K"
                + kv_transfer.HEADER.pack(len(head))
                + head
                + kv_transfer.LENGTH.pack(meta.nbytes)
            )
            conn.sendall(b"\0" * (meta.nbytes // 2))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return srv, thread


def test_a_broken_transfer_is_counted_and_the_prompt_recomputed(pair: dict[str, Engine]) -> None:
    decode = pair["decode"]
    before = metrics(decode)
    srv, thread = _half_server()
    with srv:
        host, port = srv.getsockname()
        params = {
            "do_remote_prefill": True,
            "remote_host": host,
            "remote_port": port,
            "remote_request_id": "gone",
        }
        answer = complete(decode, prompt(10), kv_transfer_params=params)
        thread.join(10)
    assert answer["usage"]["completion_tokens"] == 4  # type: ignore[index]
    after = metrics(decode)
    assert (
        after["vllm:nixl_num_failed_transfers_total"]
        == before["vllm:nixl_num_failed_transfers_total"] + 1
    )
    assert after["vllm:nixl_bytes_transferred_count"] == before["vllm:nixl_bytes_transferred_count"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prefill-url", "http://127.0.0.1:1"], "--prefill-url: only a decode server"),
        (["--inject", "kv-transfer-slow"], "kv-transfer-slow: needs a KV link"),
        (["--role", "prefill", "--inject", "decode-pool-short"], "needs a decode server"),
        (["--role", "decode", "--prefill-url", "localhost:1"], "not an http(s) URL"),
        (["--role", "middle"], "invalid choice"),
        (["--role", "prefill", "--kv-lease", "soon"], "soon"),
    ],
)
def test_bad_disaggregation_flags_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.lab.refengine", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert message in lines[-1] and "Traceback" not in proc.stderr, proc.stderr


def test_the_lease_expires_unread_caches_in_the_store() -> None:
    expired: list[int] = []
    store = kv_transfer.KVStore(1.0, expired.append)
    meta = kv_transfer.KVMeta(2, 1, 1, 2, 4)
    store.put("a", meta, b"\0" * meta.nbytes)
    with pytest.raises(ValueError, match="shape says"):
        store.put("b", meta, b"\0")
    assert store.sweep(time.monotonic()) == 0
    assert store.sweep(time.monotonic() + 1.5) == 1
    assert expired == [1] and len(store) == 0


def test_the_throttle_holds_the_rate() -> None:
    throttle = kv_transfer.Throttle(1_000_000)
    began = time.monotonic()
    for _ in range(4):
        throttle.account(50_000)
    assert time.monotonic() - began >= 0.19
