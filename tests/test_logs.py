"""The limiting log handler: a repeating line once, then a count per interval; a hard bound on
lines per interval whatever is logged."""

from __future__ import annotations

import io
import json
import logging
import random

import pytest

from exporter import logs


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def handler_for(clock: Clock, **limits: int) -> tuple[logs.LimitingHandler, io.StringIO]:
    out = io.StringIO()
    handler = logs.LimitingHandler(out, clock=clock, **limits)  # type: ignore[arg-type]
    handler.setFormatter(logs.JsonFormatter())
    return handler, out


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def record(
    msg: str, *args: object, level: int = logging.WARNING, name: str = "exporter.test"
) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_a_repeating_line_is_written_once_then_counted_per_interval(clock: Clock) -> None:
    handler, out = handler_for(clock)
    for _ in range(500):
        handler.handle(record("engine metrics at %s: connect refused", "http://e:8000"))
        clock.now += 0.1  # 50 s of a fault
    assert [line["msg"] for line in lines(out)] == [
        "engine metrics at http://e:8000: connect refused"
    ]
    clock.now += 10.1  # the interval ends
    handler.tick()
    written = lines(out)
    assert len(written) == 2
    assert written[1]["repeated"] == 499 and written[1]["interval"] == "1m"
    assert written[1]["msg"] == written[0]["msg"] and written[1]["level"] == "warn"
    # still going: one summary per interval, never the line itself
    for _ in range(600):
        handler.handle(record("engine metrics at %s: connect refused", "http://e:8000"))
        clock.now += 0.1
    clock.now += 0.5
    handler.tick()
    assert [line.get("repeated") for line in lines(out)] == [None, 499, 600]
    # the fault stops: the next interval holds nothing back, and the line is forgotten
    clock.now += 61
    handler.tick()
    clock.now += 61
    handler.tick()
    handler.handle(record("engine metrics at %s: connect refused", "http://e:8000"))
    assert [line.get("repeated") for line in lines(out)] == [None, 499, 600, None]


def test_the_error_is_part_of_the_line(clock: Clock) -> None:
    handler, out = handler_for(clock)
    for error in (ConnectionRefusedError("refused"), TimeoutError("slow"), TimeoutError("slow")):
        entry = record("poll failed")
        entry.exc_info = (type(error), error, None)
        handler.handle(entry)
    assert [line["err"] for line in lines(out)] == [
        "ConnectionRefusedError: refused",
        "TimeoutError: slow",
    ]


def test_lines_of_one_kind_are_capped_and_summarised(clock: Clock) -> None:
    handler, out = handler_for(clock)
    for uid in range(1000):  # a review per pod, each line different
        handler.handle(record("review %s: injected", f"uid-{uid}", level=logging.INFO))
    written = lines(out)
    assert len(written) == logs.SIMILAR_PER_INTERVAL
    clock.now += logs.INTERVAL_S
    handler.tick()
    summary = lines(out)[-1]
    assert summary["similar"] == 1000 - logs.SIMILAR_PER_INTERVAL
    assert summary["msg"] == "review uid-999: injected"
    # other kinds of line are not held back by it
    handler.handle(record("collector %s failed", "nvml"))
    handler.handle(record("collector %s failed", "engine"))
    assert [line["msg"] for line in lines(out)[-2:]] == [
        "collector nvml failed",
        "collector engine failed",
    ]


def test_any_flood_is_bounded_per_interval(clock: Clock) -> None:
    """Random lines of many kinds, levels and loggers for ten minutes, 50 a second: at most
    LINES_PER_INTERVAL + 1 lines in any interval, and every line held back is accounted for."""
    handler, out = handler_for(clock)
    rng = random.Random(37)
    start = clock.now
    sent = 0
    stamps: list[float] = []
    for _ in range(600 * 5):
        for _ in range(10):
            kind = rng.randrange(400)
            handler.handle(
                record(
                    f"fault {kind}: %s",
                    rng.choice(["a", "b", "c", rng.random()]),
                    level=rng.choice([logging.DEBUG, logging.INFO, logging.WARNING]),
                    name=f"exporter.x{kind % 7}",
                )
            )
            sent += 1
        before = len(out.getvalue().splitlines())
        clock.now += 0.2
        handler.tick()
        after = len(out.getvalue().splitlines())
        stamps += [clock.now] * (after - before)
    handler.close()
    written = lines(out)
    assert sent == 30_000
    # every line, written or held back, is counted once
    held = sum(
        int(line.get(key, 0)) for line in written for key in ("repeated", "similar", "dropped")
    )  # type: ignore[call-overload]
    originals = sum(
        1 for line in written if not any(k in line for k in ("repeated", "similar", "dropped"))
    )
    assert originals + held == sent
    # no window of one interval holds more than the budget plus the dropped line
    ordered = sorted(stamps)
    worst = max(
        sum(1 for t in ordered if s <= t < s + logs.INTERVAL_S)
        for s in ordered[:: len(ordered) // 50 + 1]
    )
    assert worst <= logs.LINES_PER_INTERVAL + 1, worst
    assert len(written) <= (600 / logs.INTERVAL_S + 2) * (logs.LINES_PER_INTERVAL + 1)
    assert clock.now - start == pytest.approx(600, abs=1)


def test_setup_routes_every_logger_through_the_limit() -> None:
    logger = logging.getLogger("exporter.test_logs")
    out = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.setup("info", "logfmt", stream=out)
        for _ in range(1000):
            logging.getLogger("asyncio").error("socket.accept() out of system resource")
            logger.warning("collector %s failed", "engine")
        assert out.getvalue().count("\n") == 2
        assert 'msg="socket.accept() out of system resource"' in out.getvalue()
        logs.setup("info", "logfmt", stream=io.StringIO())  # the old handler writes its counts
        tail = out.getvalue().splitlines()[-2:]
        assert sorted(line.split("repeated=")[1].split()[0] for line in tail) == ["999", "999"]
    finally:
        for handler in root.handlers[:]:
            handler.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
