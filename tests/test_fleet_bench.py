"""The fleet benchmark's fleets and expositions (``bench/fleet.py``): what it simulates must be
the layout it claims to measure. Its numbers are not tested; its Prometheus runs take minutes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from support.paths import bench_script

from exporter.signatures.signals.signal_groups import RECORD_GROUPS
from exporter.signatures.slo.slo_signals import BUDGET_GROUP as BUDGET

fleet = bench_script("fleet", "fleet_bench")

# Hand-written: a node agent's exposition cut to what the tests read (the GPUs' busy seconds
# filed under their holders, the attribution the podresources collector writes for a node of
# 1-GPU pods, one node series).
AGENT = "\n".join(
    [
        "# TYPE inference_gpu_busy_seconds_total counter",
        *(
            f'inference_gpu_busy_seconds_total{{container="vllm",gpu="{k}",namespace="serving",'
            f'pod="vllm-{k}",uuid="GPU-0000000{k}-aaaa"}} {10.0 * k}'
            for k in range(8)
        ),
        "# TYPE inference_gpu_pod_info gauge",
        *(
            f'inference_gpu_pod_info{{container="vllm",gpu="{k}",namespace="serving",'
            f'pod="vllm-{k}",uuid="GPU-0000000{k}-aaaa"}} 1.0'
            for k in range(8)
        ),
        "# TYPE inference_gpu_pods gauge",
        *(f'inference_gpu_pods{{gpu="{k}",uuid="GPU-0000000{k}-aaaa"}} 1.0' for k in range(8)),
        "# TYPE inference_podresources_devices gauge",
        'inference_podresources_devices{state="attributed"} 8.0',
        "",
    ]
)
_LABELS = re.compile(r'(\w+)="([^"]*)"')


def _samples(body: bytes, name: str) -> list[dict[str, str]]:
    return [
        dict(_LABELS.findall(line))
        for line in body.decode().splitlines()
        if line.startswith(name + "{")
    ]


@pytest.mark.parametrize("mix", ["1", "1+2", "default"])
def test_pods_fill_eight_gpu_nodes_without_sharing_a_gpu(mix: str) -> None:
    pods = fleet.fleet(800, mix)
    assert sum(p.gpus for p in pods) == 800
    agents = fleet.nodes(pods)
    assert len(agents) == 100
    for node in agents:
        held = Counter(g for p in node.pods for g in range(p.first_gpu, p.first_gpu + p.gpus))
        assert sorted(held) == list(range(8)), (mix, node.index)
        assert set(held.values()) == {1}


def test_mixes_hold_the_gpus_they_say() -> None:
    assert {p.gpus for p in fleet.fleet(800, "1")} == {1}
    sizes = Counter(p.gpus for p in fleet.fleet(800, "1+2"))
    assert sizes == {1: 400, 2: 200}  # half the GPUs in 2-GPU pods
    # The default mix is the one the earlier runs measured: 24 pods per 80 GPUs.
    assert len(fleet.fleet(80)) == 24


def test_agent_names_the_pod_holding_each_gpu_and_only_its_node() -> None:
    template = fleet.Template.parse(AGENT, 10.0)
    pods = fleet.fleet(16, "1+2")
    agents = fleet.nodes(pods)
    seen_uuids: set[str] = set()
    for node in agents:
        body = fleet.node_body(template, node).render(30.0)
        info = _samples(body, "inference_gpu_pod_info")
        assert len(info) == 8
        for sample in info:
            holder = node.holder(int(sample["gpu"]))
            assert holder is not None
            assert (sample["namespace"], sample["pod"]) == (holder.namespace, holder.pod)
        # A 2-GPU pod is named on both its GPUs, a 1-GPU pod on one.
        named = Counter(s["pod"] for s in info)
        assert named == {p.pod: p.gpus for p in node.pods}
        busy = _samples(body, "inference_gpu_busy_seconds_total")
        uuids = {s["uuid"] for s in busy}
        assert len(uuids) == 8 and not uuids & seen_uuids  # every node its own GPUs
        # every GPU's series filed under its holder, as pod_info names it
        filed = {(s["uuid"], s["namespace"], s["pod"], s["container"]) for s in busy}
        assert filed == {(s["uuid"], s["namespace"], s["pod"], "engine") for s in info}
        assert {s["uuid"] for s in info} == uuids
        seen_uuids |= uuids


def test_gpu_no_pod_holds_is_attributed_to_no_one() -> None:
    template = fleet.Template.parse(AGENT, 10.0)
    (node,) = fleet.nodes(fleet.fleet(5, "1"))  # five pods on an eight-GPU node
    body = fleet.node_body(template, node).render(0.0)
    assert sorted(int(s["gpu"]) for s in _samples(body, "inference_gpu_pod_info")) == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert len(_samples(body, "inference_gpu_pods")) == 5
    busy = _samples(body, "inference_gpu_busy_seconds_total")
    assert len(busy) == 8  # the node still has 8, the three unheld filed under no pod
    unheld = [s for s in busy if int(s["gpu"]) >= 5]
    assert {(s["namespace"], s["pod"], s["container"]) for s in unheld} == {("", "", "")}


def test_disaggregated_fleet_has_both_roles_per_model() -> None:
    pods = fleet.pool_fleet(3, 4)
    assert len(pods) == 12
    for m in range(3):
        mine = [p for p in pods if p.model == f"org/model-{m:02d}"]
        assert Counter(p.template for p in mine) == {"prefill": 2, "decode": 2}
        assert {p.namespace for p in mine} == {f"llm-{m:02d}"}
    template = fleet.Template.parse(
        '# TYPE inference_queue_depth gauge\ninference_queue_depth{model="x",role="decode"} 3\n',
        10.0,
    )
    body = fleet.pod_body(template, pods[1]).render(0.0).decode()
    assert 'model="org/model-00"' in body and 'model="x"' not in body


def test_a_healthy_fleet_has_no_waiting_requests_and_a_starved_one_the_captured_ones() -> None:
    """The captured fixture's 7 waiting requests beside GPUs under 60 % made every pod starved
    with a queue (the starved-queue signature pending on half a 10,000-GPU fleet, its
    annotations' queries run for each pod): a healthy fleet, the default, has none waiting."""
    template = fleet.Template.parse(
        "# TYPE inference_queue_depth gauge\n"
        'inference_queue_depth{engine="vllm",model="x"} 7\n'
        "# TYPE inference_requests_running gauge\n"
        'inference_requests_running{engine="vllm",model="x"} 12\n',
        10.0,
    )
    (pod,) = fleet.fleet(1, "1")

    def values(state: str, t: float) -> dict[str, float]:
        body = fleet.pod_body(fleet.in_state(template, state), pod).render(t).decode()
        return {line.split("{")[0]: float(line.split()[-1]) for line in body.splitlines()
                if line and not line.startswith("#")}  # fmt: skip

    for t in (0.0, 100.0, 300.0):
        healthy, starved = values("healthy", t), values("starved", t)
        assert healthy["inference_queue_depth"] == 0.0
        assert 6.3 <= starved["inference_queue_depth"] <= 7.7
        assert healthy["inference_requests_running"] == starved["inference_requests_running"]
    assert values("starved", 0.0) != values("starved", 300.0)  # the captured queue moves
    with pytest.raises(ValueError, match="unknown fleet state"):
        fleet.in_state(template, "busy")
    assert fleet.Scenario(800, "node", state="starved").name == "node-800-mixdefault-starved"
    assert fleet.Scenario(800, "node").name == "node-800-mixdefault"
    assert fleet.Scenario(800, "node", state="starved").args()[-2:] == ["--state", "starved"]


def test_pack_without_the_pool_family_drops_only_it(tmp_path: Path) -> None:
    full = fleet.pack_of(fleet.RULES)
    without = fleet.without_family(full, "pool", fleet.POOL_GROUP, tmp_path)

    def rules(files: tuple[Path, ...]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for path in files:
            for group in yaml.safe_load(path.read_text())["groups"]:
                out[group["name"]] = [r.get("record") or r["alert"] for r in group["rules"]]
        return out

    before, after = rules(full.files), rules(without.files)
    assert fleet.POOL_GROUP in before and fleet.POOL_GROUP not in after
    dropped = set(before["inference.signatures"]) - set(after["inference.signatures"])
    assert dropped == fleet.family_alerts("pool")
    assert {"InferencePrefillPoolShort", "InferenceDecodePoolShort"} <= dropped
    for name, kept in after.items():
        if name != "inference.signatures":
            assert kept == before[name]


def group_intervals(full: fleet.Pack, timed: fleet.Pack) -> dict[str, str | None]:
    """Each group of ``timed`` by name, with its interval (None: the global one), after
    checking that it holds the same rules as ``full``'s, file by file."""
    intervals: dict[str, str | None] = {}
    for before, after in zip(full.files, timed.files, strict=True):
        old = yaml.safe_load(before.read_text())["groups"]
        new = yaml.safe_load(after.read_text())["groups"]
        assert [g["rules"] for g in new] == [g["rules"] for g in old]
        intervals.update((g["name"], g.get("interval")) for g in new)
    return intervals


def test_pack_with_a_record_interval_times_only_the_record_groups(tmp_path: Path) -> None:
    full = fleet.pack_of(fleet.RULES / "node")
    assert fleet.with_intervals(full, "", tmp_path) is full
    intervals = group_intervals(full, fleet.with_intervals(full, "1m", tmp_path))
    for name, interval in intervals.items():
        assert interval == ("1m" if name.startswith("inference.records") else None) or (
            name == BUDGET and interval == "2m30s"  # a group timed by the pack keeps its own
        ), name
    # as the chart's template times them: the SLO and verdict records too, not the alerts
    timed_names = {name for name, interval in intervals.items() if interval == "1m"}
    assert set(RECORD_GROUPS) < timed_names
    assert {"inference.records.slo", "inference.records.verdicts"} < timed_names
    assert not timed_names & {"inference.signatures", "inference.meta", "inference.slo"}
    # the default is what the chart installs: every group at the global interval
    assert yaml.safe_load(fleet.CHART_VALUES.read_text())["prometheusRule"]["recordInterval"] == ""
    assert fleet.chart_record_interval() == ""


def test_pack_with_an_alert_interval_times_the_alert_groups(tmp_path: Path) -> None:
    full = fleet.pack_of(fleet.RULES / "node")
    both = fleet.with_intervals(full, "1m", tmp_path, "2m")
    alone = fleet.with_intervals(full, "", tmp_path, "2m")
    assert (both.label, both.record_interval, both.alert_interval) == (
        "node-records1m-alerts2m",
        "1m",
        "2m",
    )
    assert (alone.label, alone.record_interval, alone.alert_interval) == ("node-alerts2m", "", "2m")
    for pack, records in ((both, "1m"), (alone, None)):
        for name, interval in group_intervals(full, pack).items():
            if name == BUDGET:  # timed by the pack: it keeps its own
                assert interval == "2m30s"
                continue
            assert interval == (records if name.startswith("inference.records") else "2m"), name
    # every alert group of the pack, as the chart's template times them
    intervals = group_intervals(full, alone)
    timed_names = {name for name, interval in intervals.items() if interval == "2m"}
    assert timed_names == {"inference.signatures", "inference.meta", "inference.slo"}
    assert yaml.safe_load(fleet.CHART_VALUES.read_text())["prometheusRule"]["alertInterval"] == ""
    assert fleet.chart_alert_interval() == ""


def test_a_pack_without_alerts_keeps_every_record_group_and_no_alert_group(
    tmp_path: Path,
) -> None:
    full = fleet.pack_of(fleet.RULES / "node")
    floor = fleet.with_intervals(full, "1m", tmp_path, fleet.NO_ALERTS)
    assert (floor.label, floor.record_interval, floor.alert_interval) == (
        "node-records1m-no-alerts",
        "1m",
        fleet.NO_ALERTS,
    )
    kept, all_groups = {}, {}
    for before, after in zip(full.files, floor.files, strict=True):
        all_groups.update((g["name"], g) for g in yaml.safe_load(before.read_text())["groups"])
        kept.update((g["name"], g) for g in yaml.safe_load(after.read_text())["groups"])
    records = {n for n in all_groups if n.startswith(fleet.RECORD_GROUP_PREFIX)}
    assert set(kept) == records and len(records) < len(all_groups)
    for name, group in kept.items():
        assert group["rules"] == all_groups[name]["rules"]
        assert group["interval"] == ("2m30s" if name == BUDGET else "1m"), name
    assert not any("alert" in r for g in kept.values() for r in g["rules"])
    # the global interval for the records, no alerts: still a pack of its own
    alone = fleet.with_intervals(full, "", tmp_path, fleet.NO_ALERTS)
    assert alone.label == "node-no-alerts"
    assert all(
        g.get("interval") in (None, "2m30s")
        for path in alone.files
        for g in yaml.safe_load(path.read_text())["groups"]
    )


def test_a_batch_measures_every_record_interval_with_every_alert_interval(tmp_path: Path) -> None:
    args = fleet.argparse.Namespace(
        rules=fleet.RULES,
        gpus=[800],
        layout=["node"],
        mix=["1"],
        record_interval=["1m", "2m"],
        alert_interval=["", fleet.NO_ALERTS],
        pack=[],
        pool_pods_per_model=[],
        pool_models=8,
        state="healthy",
    )
    (batch,) = fleet.batches(args, tmp_path)
    measured = {(p.label, p.record_interval, p.alert_interval) for _, packs in batch for p in packs}
    assert measured == {
        ("node-records1m", "1m", ""),
        ("node-records2m", "2m", ""),
        ("node-records1m-no-alerts", "1m", fleet.NO_ALERTS),
        ("node-records2m-no-alerts", "2m", fleet.NO_ALERTS),
    }
    assert fleet._name({"layout": "node", "pack": "p", "alert_interval": fleet.NO_ALERTS}) == (
        "node (p, records global, alerts none (records only))"
    )


def test_a_batch_measures_every_pack_of_a_layout_at_every_record_interval(tmp_path: Path) -> None:
    args = fleet.argparse.Namespace(
        rules=fleet.RULES,
        gpus=[800],
        layout=["sidecar", "node"],
        mix=["1"],
        record_interval=["1m", ""],
        alert_interval=[""],
        pack=[fleet._layout_pack(f"node={fleet.RULES / 'node'}")],
        pool_pods_per_model=[],
        pool_models=8,
        state="healthy",
    )
    (batch,) = fleet.batches(args, tmp_path)
    assert {scenario.state for scenario, _ in batch} == {"healthy"}
    measured = {
        (scenario.layout, pack.label, pack.record_interval)
        for scenario, packs in batch
        for pack in packs
    }
    assert measured == {
        ("sidecar", "alert_rules-records1m", "1m"),
        ("sidecar", "alert_rules", ""),
        ("node", "node-records1m", "1m"),
        ("node", "node", ""),
        # the other pack of the node layout, in a directory of its own
        ("node", "node-2-records1m", "1m"),
        ("node", "node-2", ""),
    }
    with pytest.raises(fleet.argparse.ArgumentTypeError):
        fleet._layout_pack(f"dcgm={tmp_path}")


def test_a_query_prometheus_does_not_answer_costs_one_figure_not_the_run() -> None:
    failed: list[str] = []

    def timed_out() -> float:
        raise TimeoutError("timed out")

    assert math.isnan(fleet._or_default(failed, "count(up)", timed_out, math.nan))
    assert failed == ["count(up): timed out"]
    assert fleet._or_default(failed, "count(up)", lambda: 3.0, math.nan) == 3.0
    assert len(failed) == 1
    # anything but an unanswered query is a bug in the benchmark: it still stops the run
    with pytest.raises(KeyError):
        fleet._or_default(failed, "q", lambda: {"present": 1.0}["missing"], 0.0)


class _FakeApi:
    """Hand-written: a Prometheus that answers /api/v1/rules and an instant query with stats
    for a pack whose group has two records of one name (as the verdicts' holding records)."""

    def __init__(self, groups: list[dict[str, object]]) -> None:
        self.groups = groups

    def text(self, path: str) -> str:
        assert path == "/metrics"
        return ""

    def get(self, path: str, **params: str) -> object:
        if path == "/api/v1/rules":
            return {"data": {"groups": self.groups}}
        assert path == "/api/v1/query"
        return {
            "data": {
                "result": [],
                "stats": {
                    "timings": {"evalTotalTime": 0.001},
                    "samples": {"totalQueryableSamples": len(params["query"])},
                },
            }
        }


def test_rules_of_one_name_are_timed_apart_and_keyed_as_their_costs(tmp_path: Path) -> None:
    pack = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {"record": "a:holding", "expr": "x", "labels": {"alertname": "A"}},
                    {"record": "a:holding", "expr": "yy", "labels": {"alertname": "B"}},
                    {"record": "a:holding_more", "expr": "zzz"},
                    {"record": "a:holding", "expr": "wwww", "labels": {"alertname": "C"}},
                ],
            },
            {"name": "h", "rules": [{"record": "a:holding", "expr": "v"}]},
        ]
    }
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(pack))
    served = [
        {
            "name": g["name"],
            "interval": 15,
            "rules": [
                {"name": r["record"], "lastEvaluation": "t0", "evaluationTime": 0.01 * (i + 1)}
                for i, r in enumerate(g["rules"])
            ],
        }
        for g in pack["groups"]
    ]
    api = _FakeApi(served)
    sample = fleet.Sample()

    class _Proc:
        def memory_info(self) -> object:
            return type("M", (), {"rss": 0})()

    fleet._poll(api, _Proc(), sample)
    timed = {key: values["t0"] for key, values in sample.rules.items()}
    assert timed == {
        "g/a:holding": 0.01,
        "g/a:holding#1": 0.02,
        "g/a:holding_more": 0.03,
        "g/a:holding#2": 0.04,
        "h/a:holding": 0.01,
    }
    costs = fleet.rule_costs(api, [path], repeat=1)
    assert set(costs) == set(timed)
    # each key names the rule whose expression it measured (samples: the expression's length)
    assert [costs[k]["samples"] for k in ("g/a:holding", "g/a:holding#1", "g/a:holding#2")] == [
        1,
        2,
        4,
    ]


@pytest.mark.parametrize("flag", ["--record-interval", "--alert-interval"])
def test_a_malformed_interval_exits_2_with_one_line(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fleet.main(["run", "--gpus", "16", flag, "every minute"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"fleet: {flag} must be a duration" in err


@pytest.mark.parametrize("seconds", ["5", "7200"])
def test_a_profile_out_of_range_exits_2_with_one_line(
    seconds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fleet.main(["run", "--gpus", "16", "--profile", seconds]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "fleet: --profile must be 10 to 3600 seconds" in err
