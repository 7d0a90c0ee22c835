"""The model worker: KV cache, continuous batching, preemption (torch, in process)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch  # the reference extra (make install-dev): fails, never skips, without it

from exporter.backends.hfmodel import load_model
from exporter.lab.refengine import worker
from exporter.lab.refengine.torch_model import Model, ModelConfig, hf_tensors
from exporter.lab.refengine.worker import (
    Request,
    Scheduler,
    Work,
    WorkerConfig,
    decode_work,
    prefill_work,
    write_model_dir,
)

VOCAB = 300


def small(slots: int = 4, max_len: int = 64) -> Model:
    cfg = ModelConfig(vocab_size=VOCAB, layers=2, d_model=32, heads=4, max_len=max_len, seed=3)
    return Model(cfg, slots=slots, device="cpu", dtype=torch.float32)


def scheduler(**kw: int) -> Scheduler:
    slots = kw.pop("slots", 4)
    cfg = WorkerConfig(
        vocab_size=VOCAB, eos_id=0, max_model_len=64, max_num_seqs=slots, block_size=4, **kw
    )
    return Scheduler(cfg, small(slots=slots))


def test_decode_with_the_cache_matches_a_full_forward_pass() -> None:
    model = small()
    tokens = [5, 17, 42, 7, 99, 3]
    with torch.inference_mode():
        full = model.prefill(tokens, slot=2)
        model.prefill(tokens[:4], slot=1)
        model.decode([tokens[4]], [1], [4])
        step = model.decode([tokens[5]], [1], [5])[0]
    assert torch.allclose(full, step, atol=1e-4)


def test_batched_decode_over_scattered_slots_matches_one_by_one() -> None:
    model = small()
    prompts = {0: [1, 2, 3], 3: [9, 8, 7, 6, 5]}
    with torch.inference_mode():
        for slot, p in prompts.items():
            model.prefill(p, slot)
        alone = [model.decode([11], [s], [len(p)])[0].clone() for s, p in prompts.items()]
        for slot, p in prompts.items():
            model.prefill(p, slot)
        both = model.decode([11, 11], list(prompts), [len(p) for p in prompts.values()])
    for i in range(2):
        assert torch.allclose(alone[i], both[i], atol=1e-4)


def test_move_slot_keeps_the_sequence() -> None:
    model = small()
    with torch.inference_mode():
        model.prefill([4, 5, 6], slot=3)
        expected = model.decode([7], [3], [3])[0].clone()
        model.prefill([4, 5, 6], slot=3)
        model.move_slot(3, 0, 3)
        moved = model.decode([7], [0], [3])[0]
    assert torch.allclose(expected, moved, atol=1e-5)


def run(s: Scheduler, steps: int = 200) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    with torch.inference_mode():
        for _ in range(steps):
            if not s.busy:
                break
            step = s.step()
            for rid, token in step.tokens:
                out.setdefault(rid, []).append(token)
    return out


def test_requests_join_and_leave_the_batch_per_step() -> None:
    s = scheduler()
    now = time.monotonic()
    with torch.inference_mode():
        s.add(Request("a", (1, 2, 3), 5, 0.0, 1), now)
        first = s.step()
        assert first.running == 1
        s.add(Request("b", (4, 5), 3, 1.0, 2), now)
        second = s.step()
        assert sorted(r for r, _ in second.tokens) == ["a", "b"]  # b joined a running batch
        assert second.running == 2
    out = run(s)
    assert len(out["a"]) == 3 and len(out["b"]) == 2  # the rest of 5 and 3 tokens
    assert s.state.running == [] and s.state.free_blocks == s.state.total_blocks


def test_admission_cap_queues_the_rest() -> None:
    s = scheduler(slots=4)
    s.cfg = WorkerConfig(**{**s.cfg.__dict__, "max_num_seqs": 1})
    now = time.monotonic()
    for i in range(3):
        s.add(Request(f"r{i}", (1, 2, 3), 2, 0.0, i), now)
    with torch.inference_mode():
        step = s.step()
    assert (step.running, step.waiting) == (1, 2)
    out = run(s)
    assert sorted(out) == ["r0", "r1", "r2"]


def test_exhausted_kv_pool_preempts_and_recomputes() -> None:
    # 6 blocks of 4 positions: two sequences growing to 16 positions cannot both fit.
    s = scheduler(kv_blocks=6)
    now = time.monotonic()
    s.add(Request("a", (1, 2, 3, 4), 12, 1.0, 1), now)
    s.add(Request("b", (5, 6, 7, 8), 12, 1.0, 2), now)
    out = run(s)
    assert s.state.preemptions >= 1
    assert len(out["a"]) == 12 and len(out["b"]) == 12
    assert s.state.free_blocks == 6


def test_prompts_that_cannot_fit_are_refused() -> None:
    s = scheduler(kv_blocks=2)
    assert s.add(Request("x", tuple(range(1, 70)), 1, 1.0, 0), 0.0) is not None
    assert s.add(Request("y", tuple(range(1, 20)), 1, 1.0, 0), 0.0) is not None
    assert s.add(Request("z", (), 1, 1.0, 0), 0.0) == "empty prompt"


def test_abort_frees_the_slot() -> None:
    s = scheduler()
    s.add(Request("a", (1, 2, 3), 50, 1.0, 1), 0.0)
    s.add(Request("b", (1, 2, 3), 50, 1.0, 1), 0.0)
    with torch.inference_mode():
        s.step()
        s.abort("a")
        step = s.step()
    assert step.running == 1 and [r for r, _ in step.tokens] == ["b"]
    assert s.state.running[0].slot == 0


def test_each_step_reports_the_work_its_passes_did() -> None:
    s = scheduler()
    mcfg = s.model.cfg  # 2 layers, width 32, vocabulary 300, float32
    with torch.inference_mode():
        s.add(Request("a", (1, 2, 3), 4, 0.0, 1), 0.0)
        prefill = s.step()
        decode = s.step()  # one sequence at position 3: keys 0..3
        s.add(Request("b", (4, 5), 4, 0.0, 2), 0.0)
        both = s.step()  # b's prefill, then a at position 4 (keys 0..4)
    assert prefill.work == prefill_work(mcfg, 3, 4)
    # By hand from the shapes: 2 x (2 x 12 x 32^2 + 300 x 32) FLOPs through the weights, 4 x 2
    # x 32 per key attended; the blocks, final norm and tied LM head read whole (35,072
    # parameters), 4 keys and values of 2 x 2 x 32 floats, one embedding and position row.
    assert decode.work == Work(
        flops=2 * (2 * 12 * 32 * 32 + 300 * 32) + 4 * 2 * 32 * 4,
        read_bytes=35_072 * 4 + 4 * 512 + 2 * 32 * 4,
        write_bytes=512,
    )
    assert mcfg.streamed_parameters() == 35_072 and mcfg.kv_bytes_per_token(4) == 512
    expected = prefill_work(mcfg, 2, 4)
    expected.add(decode_work(mcfg, 1, 5, 4))
    assert both.work == expected


def test_decode_overhead_adds_host_cpu_to_every_decode_step_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every decode step pays the overhead once, in CPU time of the step's own thread, and a
    step without decoding (the prefill) pays nothing. Each payment is timed by itself: the
    torch part of a step varies with what else runs on the machine, the payment does not."""
    paid: list[tuple[int, float, float]] = []  # (step, asked, this thread's CPU spent)
    step_no = [0]  # the step the scheduler is in
    real = worker.step_overhead

    def timed(cpu_seconds: float) -> None:
        began = time.thread_time()
        real(cpu_seconds)
        paid.append((step_no[0], cpu_seconds, time.thread_time() - began))

    monkeypatch.setattr(worker, "step_overhead", timed)

    def run(overhead_ms: float) -> list[float]:
        cfg = WorkerConfig(
            vocab_size=VOCAB, eos_id=0, max_model_len=64, max_num_seqs=4, block_size=4,
            decode_overhead_ms=overhead_ms,
        )  # fmt: skip
        s = Scheduler(cfg, small())
        s.add(Request("a", (1, 2, 3), 9, 0.0, 1), 0.0)
        steps = []
        with torch.inference_mode():
            for step in range(9):  # the prefill, then eight decode steps
                step_no[0] = step
                start = time.thread_time()
                s.step()
                steps.append(time.thread_time() - start)
        return steps

    run(0.0)
    assert paid == []  # no overhead asked, none paid
    burdened = run(40.0)
    assert [step for step, _, _ in paid] == list(range(1, 9))  # each decode step, not the prefill
    assert all(asked == pytest.approx(0.040) for _, asked, _ in paid)
    for _, _, spent in paid:
        assert 0.040 <= spent < 0.050  # CPU time of this thread, spent in full, not much over
    assert min(burdened[1:]) >= 0.040  # and it is part of the step's own time


def test_tune_resizes_the_decode_overhead_of_a_running_worker() -> None:
    s = scheduler()
    assert s.decode_overhead_s == 0.0
    assert worker._handle(None, s, ("tune", {"decode_overhead_ms": 25.0}))
    assert s.decode_overhead_s == pytest.approx(0.025)
    assert worker._handle(None, s, ("tune", {"decode_overhead_ms": 0.0}))
    assert s.decode_overhead_s == 0.0


def test_slowdown_waits_its_factor_of_every_forward_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slowed worker waits (slowdown - 1) x the work of each pass after it, without spending
    CPU: the waits are recorded here instead of slept, and compared with the worker's own clock
    around the pass, which must hold the model's forward call and sampling, and not the decode
    overhead's host work before it. (Compared with the whole step's process CPU instead, the
    check flaked: another thread of the test process, or the step's bookkeeping, can take
    most of a 3 ms step's CPU.)"""
    waits: list[float] = []
    monkeypatch.setattr(worker.time, "sleep", waits.append)
    cfg = WorkerConfig(
        vocab_size=VOCAB, eos_id=0, max_model_len=64, max_num_seqs=4, block_size=4, slowdown=5.0,
        decode_overhead_ms=30.0,
    )  # fmt: skip
    s = Scheduler(cfg, small())
    clock = s._clock
    reads: list[float] = []  # the worker's clock as it reads it: each pass's start, then end
    calls: dict[str, tuple[float, float]] = {}  # the model's calls, by the same clock
    overhead: list[float] = []  # when the decode overhead's host work ended

    def read() -> float:
        reads.append(clock())
        return reads[-1]

    def timed(name: str, call: Any) -> Any:
        def run(*args: Any) -> Any:
            began = clock()
            out = call(*args)
            calls[name] = (began, clock())
            return out

        return run

    pay = worker.step_overhead

    def overhead_then_mark(seconds: float) -> None:
        pay(seconds)
        overhead.append(clock())

    monkeypatch.setattr(s, "_clock", read)
    monkeypatch.setattr(s.model, "prefill", timed("prefill", s.model.prefill))
    monkeypatch.setattr(s.model, "decode", timed("decode", s.model.decode))
    monkeypatch.setattr(worker, "step_overhead", overhead_then_mark)
    s.add(Request("a", (1, 2, 3), 4, 0.0, 1), 0.0)
    with torch.inference_mode():
        for passes in (1, 2):
            s.step()
            assert len(waits) == passes  # the prefill pass, then one batched decode pass
    assert len(reads) == 4
    passes = list(zip(reads[::2], reads[1::2], strict=True))  # each pass's (start, end)
    for (began, ended), wait, name in zip(passes, waits, ("prefill", "decode"), strict=True):
        # Each wait is 4x the pass's work by the worker's clock ...
        assert wait == pytest.approx(4 * (ended - began))
        # ... and that work holds the model's forward call.
        assert began <= calls[name][0] <= calls[name][1] <= ended
    # The decode overhead's 30 ms of host work come before the pass and are not slowed.
    assert len(overhead) == 1 and overhead[0] <= reads[2]
    assert waits[1] < 4 * 0.030


def test_no_slowdown_never_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr(worker.time, "sleep", waits.append)
    s = scheduler()
    s.add(Request("a", (1, 2, 3), 4, 0.0, 1), 0.0)
    with torch.inference_mode():
        for _ in range(4):
            s.step()
    assert waits == []


def test_model_directory_reads_back_as_the_real_model(tmp_path: Path) -> None:
    model = small()
    write_model_dir(model, tmp_path / "model", eos_id=0)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert (config["model_type"], config["n_layer"], config["n_embd"]) == ("gpt2", 2, 32)
    index = json.loads((tmp_path / "model" / "model.safetensors.index.json").read_text())
    tensors = hf_tensors(model)
    assert set(index["weight_map"]) == set(tensors)
    assert tuple(tensors["transformer.h.0.attn.c_attn.weight"].shape) == (32, 96)  # Conv1D
    assert index["metadata"]["total_size"] == model.cfg.parameters() * 4
    assert sum(t.numel() for t in tensors.values()) == model.cfg.parameters()
    facts = load_model(tmp_path / "model")  # what the sidecar's model collector reads
    # Streamed per step: everything but the 64-row position table (the LM head is tied).
    assert facts.weight_bytes == model.cfg.streamed_parameters() * 4
    assert facts.weight_bytes == (model.cfg.parameters() - 64 * 32) * 4
    assert facts.kv_cache_bytes_per_token == model.cfg.kv_bytes_per_token(4) == 2 * 2 * 32 * 4
    assert facts.flops_per_token == 2 * (2 * model.cfg.layer_parameters() + 2 * 32)


def _run(sched: Scheduler) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    exported: dict[str, bytes] = {}
    with torch.inference_mode():
        while sched.busy:
            out = sched.step()
            for rid, token in out.tokens:
                tokens.setdefault(rid, []).append(token)
            exported.update(out.exported)
    tokens.update({f"kv:{rid}": list(blob) for rid, blob in exported.items()})
    return tokens


def test_a_transferred_cache_continues_as_the_colocated_request() -> None:
    """Prefill on one scheduler (exporting the prompt's cache), decode on another from that
    cache: the same greedy tokens as one scheduler doing both; the cache is the model's size."""
    prompt = (4, 8, 15, 16, 23, 42, 7)
    colocated = _run_one(scheduler(), Request("r", prompt, 6, 0.0, 1))
    prefill = scheduler()
    prefill.add(Request("p", prompt, 1, 0.0, 1, export_kv=True), time.monotonic())
    out = _run(prefill)
    cache = bytes(out["kv:p"])
    cfg = prefill.model.cfg
    assert len(cache) == cfg.layers * 2 * cfg.heads * cfg.head_dim * len(prompt) * 4
    decoded = _run_one(scheduler(), Request("d", prompt, 6, 0.0, 1, kv=cache))
    assert decoded == colocated


def _run_one(sched: Scheduler, req: Request) -> list[int]:
    sched.add(req, time.monotonic())
    return _run(sched)[req.request_id]


def test_a_cache_of_the_wrong_size_is_refused() -> None:
    model = small()
    try:
        model.import_kv(0, 3, b"\0" * 10)
    except ValueError as err:
        assert "needs" in str(err)
    else:
        raise AssertionError("import_kv accepted 10 bytes for 3 positions")


class _Sent:
    """The front-end's end of the pipe: what the worker sends."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, worker.StepOutput]] = []

    def send(self, message: tuple[str, worker.StepOutput]) -> None:
        self.messages.append(message)


def test_an_abort_that_empties_the_batch_reports_the_idle_state() -> None:
    """The engine's running and KV-cache gauges follow the worker's step reports; a client that
    drops its last open requests leaves no step to report them gone, so the abort does (the
    gateway drill's engine read 16 running and its KV cache 17 % used for its whole run after
    the calibration's closed loop dropped its open requests)."""
    s = scheduler()
    conn = _Sent()
    s.add(Request("a", (1, 2, 3), 50, 1.0, 1), 0.0)
    s.add(Request("b", (1, 2, 3), 50, 1.0, 1), 0.0)
    with torch.inference_mode():
        step = s.step()
    assert step.running == 2 and step.kv_usage > 0
    assert worker._handle(conn, s, ("abort", "a"))
    assert conn.messages == []  # "b" still runs: its next step reports
    assert worker._handle(conn, s, ("abort", "b"))
    ((kind, state),) = conn.messages
    assert kind == "step" and not state.tokens and not state.finished
    assert (state.running, state.waiting, state.kv_usage) == (0, 0, 0.0)
