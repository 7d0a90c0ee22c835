"""What a drill notes of Prometheus's alerts, without a stack: made-up /api/v1/alerts answers in.

What is checked: an alert's first pending and firing moments, and each time a pending alert's
`for` began again (a new activeAt), whether or not a poll caught it missing in between; a
restart after it fired is not one (it resolved and came back); the failing drill's message
tells the restarts. The first look at the pack waits for Prometheus's first scrape of every
target and an evaluation of every group after it, read a moment back.
"""

from __future__ import annotations

from typing import Any

from drills.harness import LOOK_BACK_S, AlertSeen, FirstLook, see_alerts

DECODE = "InferenceDecodeOverheadBound"


def _alert(state: str, active_at: str, pod: str = "vllm-0") -> dict[str, Any]:
    return {
        "labels": {"alertname": DECODE, "pod": pod, "severity": "warning"},
        "state": state,
        "activeAt": active_at,
        "annotations": {"summary": "s", "description": "d"},
    }


def test_a_pending_alert_whose_for_began_again_is_noted_when_it_did() -> None:
    seen: dict[str, AlertSeen] = {}
    active: dict[str, str] = {}
    polls = [
        (31.2, [_alert("pending", "2026-12-07T14:43:26Z")]),
        (33.2, [_alert("pending", "2026-12-07T14:43:26Z")]),
        # a lapse no poll saw: the next poll finds a later activeAt
        (61.0, [_alert("pending", "2026-12-07T14:43:56Z")]),
        (63.0, []),  # a lapse a poll saw
        (65.0, [_alert("pending", "2026-12-07T14:44:00Z")]),
        (157.0, [_alert("firing", "2026-12-07T14:44:00Z")]),
        (159.0, []),
        (161.0, [_alert("pending", "2026-12-07T14:45:36Z")]),  # after firing: not a restart
    ]
    for now, alerts in polls:
        see_alerts(seen, alerts, now, active)
    got = seen[DECODE]
    assert (got.pending_at, got.firing_at, got.restarted_at) == (31.2, 157.0, [61.0, 65.0])
    assert got.severity == "warning" and got.description == "d"
    assert got.told() == "pending 31.2s, firing 157.0s, its `for` began again at 61, 65 s"


def test_each_pod_keeps_its_own_for() -> None:
    seen: dict[str, AlertSeen] = {}
    active: dict[str, str] = {}
    see_alerts(seen, [_alert("pending", "t1", "a")], 10.0, active)
    see_alerts(seen, [_alert("pending", "t1", "a"), _alert("pending", "t2", "b")], 12.0, active)
    assert seen[DECODE].restarted_at == []
    assert AlertSeen(pending_at=3.0).told() == "pending 3.0s, firing never"


class _Prometheus:
    """What FirstLook asks of the stack, scripted: when every target was first scraped and
    when every rule group was last evaluated (Unix times; None: not yet)."""

    def __init__(self) -> None:
        self.scraped: float | None = None
        self.evaluated: float | None = None
        self.down = False  # the API does not answer

    def scraped_every_target(self) -> bool:
        if self.down:
            raise OSError("connection refused")
        return self.scraped is not None

    def evaluated_since(self, when: float) -> bool:
        if self.down:
            raise OSError("connection refused")
        return self.evaluated is not None and self.evaluated > when


def test_the_first_look_waits_for_a_scrape_of_every_target_then_an_evaluation() -> None:
    prom, now = _Prometheus(), [100.0]
    first = FirstLook(prom, clock=lambda: now[0])
    prom.down = True
    assert not first.ready()  # Prometheus not answering yet
    prom.down = False
    prom.evaluated = 100.5  # groups evaluated before any scrape: absent(up) holds there
    now[0] = 101.0
    assert not first.ready()
    prom.scraped = 101.0
    now[0] = 101.2
    assert not first.ready()  # scraped, seen at 101.2; no evaluation since
    now[0] = 102.0
    assert not first.ready()
    prom.evaluated = 102.5
    now[0] = 102.6
    assert not first.ready()  # evaluated since, seen at 102.6: a look now reads 1 s back
    now[0] = 102.6 + LOOK_BACK_S
    assert first.ready()
    prom.down = True  # once ready, it stays so without asking again
    now[0] = 200.0
    assert first.ready()
