"""``demo``: everything starts in the chart's default layout (a node agent beside the NVML-less
sidecar), the view shows it, Ctrl-C stops every process it started. The sidecar layout's stack
runs in tests/lab/test_roofline.py, its configuration in tests/lab/test_stack.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from playwright.sync_api import sync_playwright
from rich.console import Console
from rich.text import Text
from support.paths import ROOT

from exporter.lab import demo
from exporter.lab.demo import DEMO_LABELS
from exporter.lab.layouts import LAYOUTS, Kubelet, Node, rule_profile
from exporter.lab.processes import child_pythonpath, find_binary, http_get, stop_process
from exporter.lab.stack import Stack, StackConfig

SHOTS = ROOT / "build" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _started_by(workdir: Path) -> list[psutil.Process]:
    """Processes running in the demo's work directory or started with its configs."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.cwd() == str(workdir) or any(str(workdir) in a for a in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize(
    ("layout", "reader"),
    [("node", "node agent"), ("sidecar", ""), ("dcgm", "dcgm-exporter")],
)
def test_the_header_says_the_layout_and_who_reads_the_gpus(
    tmp_path: Path, layout: str, reader: str
) -> None:
    args = demo.parser().parse_args([] if layout == "node" else ["--layout", layout])
    assert args.layout == layout  # node unless asked
    stack = Stack(StackConfig(workdir=tmp_path, layout=args.layout, target_labels=DEMO_LABELS))
    stack.engine_url, stack.sidecar_url = "http://127.0.0.1:8000", "http://127.0.0.1:10960"
    stack.prometheus_url = "http://127.0.0.1:9090"
    if reader:
        stack.nodes = [Node(0, layout, Kubelet([]), "http://127.0.0.1:10961", None, lambda: None)]
    header = demo._header(stack, frozenset(), "replay of a trace")
    assert header[1].startswith(f" layout     {layout}: {LAYOUTS[layout]}; --layout "), header
    places = [line.split()[0] for line in header[2:] if line.strip()]
    reads = [line for line in header if "127.0.0.1:10961/metrics" in line]
    assert len(reads) == (1 if reader else 0) and (not reader or reads[0].startswith(f" {reader}"))
    assert ("(no NVML)" in header[3]) == bool(reader), header[3]
    assert f"({rule_profile(layout)} rules)" in "\n".join(header)
    assert places[:2] == ["engine", "sidecar"]
    title = demo._screen_state(stack, frozenset(), "replay of a trace").title
    assert title.startswith(f"inference-bottleneck-exporter demo ({layout} layout) - ")


def test_a_layout_the_lab_does_not_know_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        demo.main(["--layout", "nodes"])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--layout: invalid choice: 'nodes' (choose from" in lines[0], lines


def pod_gpu_utilization(prometheus: str) -> float | None:
    """The demo pod's GPU utilisation record in the demo's Prometheus, if it has one yet."""
    query = 'inference:gpu_utilization:mean30s{namespace="demo",pod="reference-0"}'
    status, body = http_get(
        f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    )
    result = json.loads(body)["data"]["result"] if status == 200 else []
    return float(result[0]["value"][1]) if result else None


def _demo(workdir: Path, log: Path, *flags: str) -> subprocess.Popen[bytes]:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "exporter.cli", "demo", "--workdir", str(workdir), *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
        )


def _stop_demo(proc: subprocess.Popen[bytes]) -> None:
    """A test's teardown: the demo stopped as SIGTERM stops it (each child waited for), then
    anything it started that still runs killed, so a failed test leaves nothing behind."""
    if proc.poll() is not None:
        return
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    stop_process(proc, 60)
    for left in psutil.wait_procs(tree, timeout=10)[1]:
        with contextlib.suppress(psutil.Error):
            left.kill()


@pytest.mark.timeout(150)
def test_sigterm_while_the_demo_starts_stops_what_it_started(tmp_path: Path) -> None:
    """SIGTERM once the node agent and the engine (with its softirq helper) run and the rest
    is starting: the demo stops and waits for each child, and exits 130."""
    workdir = tmp_path / "demo"
    log = tmp_path / "demo.out"
    proc = _demo(workdir, log, "--inject", "softirq", "--plain", "--duration", "100s")
    try:
        engine = workdir / "engine.log"
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline and not (
            engine.exists() and "listening on" in engine.read_text()
        ):
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        tree = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in tree)
        assert "exporter.lab.refengine" in names and "--podresources.socket" in names, names
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        _stop_demo(proc)
    assert proc.returncode == 130, log.read_text()
    alive = psutil.wait_procs(tree, timeout=10)[1]
    assert not alive, [p.cmdline() for p in alive]
    assert not _started_by(workdir)


@pytest.mark.timeout(200)
def test_demo_runs_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    if not (find_binary("prometheus") and find_binary("alertmanager", "prometheus-alertmanager")):
        pytest.fail("prometheus and alertmanager not found: run `make tools`")
    workdir = tmp_path / "demo"
    log = tmp_path / "demo.out"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "exporter.cli", "demo", "--inject", "softirq",
                "--plain", "--refresh", "1s", "--workdir", str(workdir), "--duration", "150s",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 150
        # The second block has rates (two samples of the sidecar).
        while time.monotonic() < deadline and " host CPU " not in log.read_text():
            assert proc.poll() is None, log.read_text()
            time.sleep(0.5)
        text = log.read_text()
        assert " host CPU " in text, text
        # The node layout: the GPU the node agent reads is the demo pod's, in the screen (the
        # agent's GPU series) and in Prometheus (the fast-node rules' join to the pod).
        assert re.search(r" GPU        utilisation \d+ % \(mean of 1 GPU\)", text), text
        match = re.search(r" Prometheus (http://127\.0\.0\.1:\d+)/alerts", text)
        assert match, text
        util = pod_gpu_utilization(match[1])
        while util is None and time.monotonic() < deadline:
            time.sleep(1)
            util = pod_gpu_utilization(match[1])
        # Positive: the rate's window is not full yet (its first values read low).
        assert util is not None and util > 0, util
        children = _started_by(workdir)
        assert len(children) >= 5, text  # engine, sidecar, node agent, Prometheus, Alertmanager
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        _stop_demo(proc)
    text = log.read_text()
    assert proc.returncode == 0, text
    for needle in (
        "injected: softirq",
        "in the node layout...",
        " layout     node: the node agent reads the GPUs and the kubelet names their pod",
        "; --layout sidecar or dcgm for the others",
        " engine     http://127.0.0.1:",
        " sidecar    http://127.0.0.1:",
        "(no NVML)",
        " node agent http://127.0.0.1:",
        "(a stand-in kubelet gives demo/reference-0 its GPUs)",
        " Prometheus http://127.0.0.1:",
        "(fast-node rules)",
        " Alertmanager http://127.0.0.1:",
        "replay of the 'starved' drill trace",
        " load       2 req/s offered",
        " host CPU   softirq",
        "stopped.",
        "requests: ",
    ):
        assert needle in text, f"{needle!r} missing from:\n{text}"
    gone = psutil.wait_procs(children, timeout=10)[1]
    assert not gone, [p.cmdline() for p in gone]
    assert not _started_by(workdir)


class Tmux:
    """A tmux server of this test's own (its socket in the test's directory)."""

    def __init__(self, socket: Path) -> None:
        binary = shutil.which("tmux")
        if binary is None:
            pytest.fail("tmux not found: run `make tools`")
        self.base = [binary, "-S", str(socket)]
        # The server passes its environment to the pane: a COLUMNS or LINES set here (pytest
        # sets them under some runners) would pin the program's idea of its terminal's size.
        self.env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}

    def __call__(self, *args: str) -> str:
        result = subprocess.run(
            [*self.base, *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            env=self.env,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def screen(self, *flags: str) -> list[str]:
        return self("capture-pane", "-p", *flags, "-t", "demo").split("\n")[:-1]

    def wait_for(self, found: Callable[[list[str]], bool], timeout: float, what: str) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.screen()
            if found(lines):
                return lines
            time.sleep(0.5)
        size = self("display", "-p", "-t", "demo", "#{pane_width}x#{pane_height}").strip()
        screen = "\n".join(self.screen())
        pytest.fail(f"{what} not on the {size} screen after {timeout:.0f}s:\n{screen}")

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=10, check=False)


def _value(lines: list[str], label: str) -> str:
    line = next((x for x in lines if x.startswith(f" {label} ")), "")
    return line.rsplit("  ", 1)[-1].strip() if line else ""


def _as_image(ansi: str, name: str, width: int, height: int) -> None:
    """The captured screen (with its colours) through rich's SVG export, and that SVG as
    Chromium shows it (a PNG for the README); the page must load without a console error."""
    console = Console(record=True, width=width, height=height, file=io.StringIO())
    console.print(Text.from_ansi(ansi), end="")
    SHOTS.mkdir(parents=True, exist_ok=True)
    svg = SHOTS / f"{name}.svg"
    # rich's template fetches a web font; the image uses the local monospace font instead
    exported = console.export_svg(title="make demo INJECT=frontend-gil")
    svg.write_text(re.sub(r"@font-face\s*\{[^}]*\}", "", exported))
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 13 * width, "height": 28 * height})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("request", lambda r: requests.append(r.url))
            page.goto(svg.as_uri())
            page.locator("svg").screenshot(path=str(SHOTS / f"{name}.png"))
        finally:
            browser.close()
    assert errors == []
    assert requests == [svg.as_uri()]


@pytest.mark.timeout(300)
def test_demo_screen_in_a_real_terminal(tmp_path: Path) -> None:
    """80x24 tmux: the screen draws, fills its sparklines, `d` shows the verdict, a larger
    window gets the full addresses, `q` quits and leaves nothing running."""
    if not (find_binary("prometheus") and find_binary("alertmanager", "prometheus-alertmanager")):
        pytest.fail("prometheus and alertmanager not found: run `make tools`")
    workdir = tmp_path / "demo"
    rc = tmp_path / "rc"
    command = " ".join(
        [
            f"cd {ROOT} &&",
            f"env PYTHONPATH={child_pythonpath()} TERM=xterm-256color",
            sys.executable, "-m", "exporter.cli", "demo", "--inject", "frontend-gil",
            "--refresh", "1s", "--workdir", str(workdir), "--duration", "250s",
            f"; echo $? > {rc}; sleep 120",
        ]
    )  # fmt: skip
    tmux = Tmux(tmp_path / "tmux.sock")
    try:
        tmux("new-session", "-d", "-s", "demo", "-x", "80", "-y", "24", command)
        lines = tmux.wait_for(
            lambda s: (
                _value(s, "GPU util") not in ("", "-")
                and _value(s, "tokenizer") not in ("", "-")
                and _value(s, "busiest thread") not in ("", "-")
            ),
            150,
            "GPU, tokenizer and busiest-thread readings",
        )
        assert len(lines) == 24 and all(len(line) <= 80 for line in lines)
        assert lines[0].startswith(
            "inference-bottleneck-exporter demo (node layout) - injected: frontend-gil"
        )
        assert re.match(
            r" engine 127\.0\.0\.1:\d+ · sidecar 127\.0\.0\.1:\d+ · node agent 127\.0\.0\.1:",
            lines[1],
        ), lines[1]
        assert lines[2].startswith(" GPU: read by the node agent: replay of the "), lines[2]
        assert any(line.startswith(" state    since     signature") for line in lines) or any(
            "signatures: none pending or firing" in line for line in lines
        )
        assert lines[-2].startswith(" last page: ")
        assert "q quits · d runs diagnose" in lines[-1]
        # the screen redraws in place: the readings move, the layout stays
        spark = next(x for x in lines if x.startswith(" GPU util"))
        later = tmux.wait_for(
            lambda s: next(x for x in s if x.startswith(" GPU util")) != spark, 30, "a redraw"
        )
        assert len(later) == 24 and later[0] == lines[0]
        # a larger window: full addresses, longer sparklines
        tmux("resize-window", "-t", "demo", "-x", "160", "-y", "48")
        size = tmux("display", "-p", "-t", "demo", "#{window_width}x#{window_height}")
        assert size.strip() == "160x48"
        large = tmux.wait_for(
            lambda s: len(s) == 48 and any(x.startswith(" engine       http://") for x in s),
            20,
            "the full addresses on a larger window",
        )
        assert any(x.startswith(" node agent   http://127.0.0.1:") for x in large), large
        assert all(len(line) <= 160 for line in large)
        tmux.wait_for(lambda s: s != large, 30, "a redraw")
        _as_image("\n".join(tmux.screen("-e")), "demo", 160, 48)
        # `d` until Prometheus holds the pack's records (their first evaluation takes a while)
        deadline = time.monotonic() + 90
        while True:
            tmux("send-keys", "-t", "demo", "d")
            time.sleep(0.5)  # the key read: the status says "diagnose running" until done
            verdict = tmux.wait_for(
                lambda s: any(x.startswith(" verdict of ") for x in s), 30, "diagnose's verdict"
            )
            errors = [x for x in verdict if x.startswith(" diagnose: ")]
            if not errors or time.monotonic() > deadline:
                break
            time.sleep(5)
        text = "\n".join(verdict)
        assert not errors, text
        assert " diagnose (d):" in verdict, text
        assert any(
            re.fullmatch(r" \d+ hold, \d+ nearly hold \(\d+ rules\)", x.rstrip()) for x in verdict
        ), text
        # the screen goes on after the verdict
        load = next(x for x in verdict if x.startswith(" load: "))
        tmux.wait_for(
            lambda s: next((x for x in s if x.startswith(" load: ")), load) != load, 30, "a redraw"
        )
        # the demo (the pane's shell's child) and what it started
        shell = psutil.Process(int(tmux("display", "-p", "-t", "demo", "#{pane_pid}")))
        demo = next(p for p in shell.children() if "exporter.cli" in " ".join(p.cmdline()))
        children = [demo, *demo.children(recursive=True)]
        assert len(children) >= 6  # the demo, engine, sidecar, node agent, Prometheus, AM
        tmux("send-keys", "-t", "demo", "q")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not rc.exists():
            time.sleep(0.5)
        assert rc.exists() and rc.read_text().strip() == "0", tmux.screen()
        after = "\n".join(tmux.screen())
        assert "stopped." in after and "firing at the end:" in after, after
        alive = psutil.wait_procs(children, timeout=10)[1]
        assert not alive, [p.cmdline() for p in alive]
    finally:
        tmux.close()
