"""Flags, environment and config file: precedence, validation, one-line errors with exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.cli import load_settings, main
from exporter.config import ConfigError, parse_address, parse_duration

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "exporter" / "data" / "replay-2gpu-synthetic.jsonl"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("15s", 15.0),
        ("1m30s", 90.0),
        ("2h", 7200.0),
        ("1.5s", 1.5),
        ("1.5m", 90.0),
        ("1d2h", 93600.0),
        ("1w", 604800.0),
        ("0s", 0.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "s", "1x", "-1s", "1s2", "30s1m", "1m1m", "1.s", ".5s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [(":10960", ("", 10960)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9", ("::1", 9))],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["10960", "host:99999", "::1:80", "[::1]80", "h:x"])
def test_parse_address_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_address(text)


def test_defaults() -> None:
    settings, check = load_settings([], {})
    assert settings.listen_address == ":10960"
    assert settings.telemetry_path == "/metrics"
    assert settings.values["path.procfs"] == Path("/proc")
    assert settings.values["gpu.replay-file"] is None
    assert settings.values["gpu.poll-interval"] == 3.0
    assert settings.scrape_timeout == 2.0
    assert settings.collectors == {
        "nvml": True,
        "cpu": True,
        "engine": True,
        "tokenizer": True,
        "process": True,
        "model": True,
        "podresources": False,
    }
    assert settings.values["engine.url"] == ("http://127.0.0.1:8000/metrics",)
    assert settings.values["engine.type"] == "auto"
    assert settings.values["engine.max-body"] == 16 * 1024 * 1024
    assert settings.values["tokenizer.probe-interval"] == 15.0
    assert not check
    assert set(settings.sources.values()) == {"default"}


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "web:\n  listen-address: '127.0.0.1:1'\n  telemetry-path: /file\n"
        "gpu.poll-interval: 10s\ncollector:\n  cpu: false\nlog:\n  level: debug\n"
    )
    env = {
        "INFERENCE_EXPORTER_WEB_LISTEN_ADDRESS": "127.0.0.1:2",
        "INFERENCE_EXPORTER_GPU_POLL_INTERVAL": "20s",
    }
    settings, _ = load_settings(
        ["--config.file", str(cfg), "--web.listen-address", "127.0.0.1:3"], env
    )
    assert settings.listen_address == "127.0.0.1:3"
    assert settings.sources["web.listen-address"] == "flag"
    assert settings.values["gpu.poll-interval"] == 20.0
    assert settings.sources["gpu.poll-interval"] == "env"
    assert settings.telemetry_path == "/file"
    assert settings.collectors["cpu"] is False
    assert settings.log_level == "debug"


def test_collector_flags_and_env() -> None:
    settings, _ = load_settings(
        ["--no-collector.nvml"], {"INFERENCE_EXPORTER_COLLECTOR_CPU": "false"}
    )
    assert settings.collectors["nvml"] is False
    assert settings.collectors["cpu"] is False
    assert settings.collectors["engine"] is True
    settings, _ = load_settings(["--collector.cpu"], {"INFERENCE_EXPORTER_COLLECTOR_CPU": "false"})
    assert settings.collectors["cpu"] is True


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--gpu.poll-interval", "3ms"], {}, "--gpu.poll-interval: 3ms is below the minimum 500ms"),
        (["--scrape.timeout", "2h"], {}, "--scrape.timeout: 2h is above the maximum 1m"),
        (["--web.listen-address", "nope"], {}, "--web.listen-address: 'nope' has no port"),
        (
            ["--web.telemetry-path", "metrics"],
            {},
            "--web.telemetry-path: 'metrics' must start with '/'",
        ),
        (["--log.level", "loud"], {}, "--log.level: 'loud' is not one of debug, info, warn, error"),
        (
            [],
            {"INFERENCE_EXPORTER_COLLECTOR_CPU": "maybe"},
            "INFERENCE_EXPORTER_COLLECTOR_CPU: 'maybe' is not a boolean",
        ),
        (
            [],
            {"INFERENCE_EXPORTER_SCRAPE_TIMEOUT": "1"},
            "INFERENCE_EXPORTER_SCRAPE_TIMEOUT: '1' is not a duration",
        ),
        (
            ["--gpu.replay-file", "/nonexistent.jsonl"],
            {},
            "--gpu.replay-file: /nonexistent.jsonl: cannot read",
        ),
        (
            ["--web.telemetry-path", "/-/ready"],
            {},
            "--web.telemetry-path: collides with a health endpoint",
        ),
    ],
)
def test_bad_values_name_the_field(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(argv, env)
    assert str(info.value).startswith(message)


def test_an_option_given_several_times_from_flags_env_and_file(tmp_path: Path) -> None:
    a, b = "http://127.0.0.1:8000/metrics", "http://127.0.0.1:8081/metrics"
    flags, _ = load_settings(["--engine.url", a, "--engine.url", b], {})
    assert flags.values["engine.url"] == (a, b)
    assert flags.sources["engine.url"] == "flag"
    comma, _ = load_settings([f"--engine.url={a},{b}"], {})
    assert comma.values["engine.url"] == (a, b)
    env, _ = load_settings([], {"INFERENCE_EXPORTER_ENGINE_URL": f"{a}, {b}"})
    assert (env.values["engine.url"], env.sources["engine.url"]) == ((a, b), "env")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engine:\n  url:\n    - {a}\n    - {b}\n")
    listed, _ = load_settings(["--config.file", str(cfg)], {})
    assert listed.values["engine.url"] == (a, b)
    cfg.write_text(f"engine:\n  url: {b}\n")
    single, _ = load_settings(["--config.file", str(cfg)], {})
    assert single.values["engine.url"] == (b,)
    # the flag replaces the file's list, it does not add to it
    both, _ = load_settings(["--config.file", str(cfg), "--engine.url", a], {})
    assert both.values["engine.url"] == (a,)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["--engine.url", "http://a:1/metrics", "--engine.url", "ftp://b"],
            {},
            "--engine.url: 'ftp://b' is not an http:// or https:// URL with a host",
        ),
        (
            [],
            {"INFERENCE_EXPORTER_ENGINE_URL": "http://a:1/metrics,,http://b:2/metrics"},
            "INFERENCE_EXPORTER_ENGINE_URL: 'http://a:1/metrics,,http://b:2/metrics' has an "
            "empty value",
        ),
        (
            ["--engine.url", "http://a:1/metrics", "--engine.url", "http://a:1/metrics"],
            {},
            "--engine.url: 'http://a:1/metrics' is given twice",
        ),
        (
            ["--engine.url", "http://a:8002/metrics", "--engine.url", "http://b:8002/metrics"],
            {"INFERENCE_EXPORTER_ENGINE_API_URL": "http://a:8000"},
            "--engine.api-url: 1 given for 2 --engine.url; give one per --engine.url, in the "
            "same order",
        ),
        (
            ["--engine.api-url", "a:8000"],
            {},
            "--engine.api-url: 'a:8000' is not an http:// or https:// URL with a host",
        ),
    ],
)
def test_bad_repeated_values(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(argv, env)
    assert str(info.value) == message


def test_repeated_option_in_a_config_file_must_not_be_empty(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("engine:\n  url: []\n")
    with pytest.raises(ConfigError, match=r"engine\.url: expected one or more values"):
        load_settings(["--config.file", str(cfg)], {})


def test_config_check_shows_repeated_values(capsys: pytest.CaptureFixture[str]) -> None:
    urls = ["http://127.0.0.1:8000/metrics", "http://127.0.0.1:8081/metrics"]
    assert main(["--config.check", "--engine.url", urls[0], "--engine.url", urls[1]]) == 0
    assert f"engine.url={urls[0]},{urls[1]} (flag)" in capsys.readouterr().out


def test_bad_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("web:\n  listen-address: [1, 2\n")
    with pytest.raises(ConfigError, match=r"--config.file: .*bad.yaml is not valid YAML at line"):
        load_settings(["--config.file", str(bad)], {})
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("web:\n  listen-adress: ':1'\n")
    with pytest.raises(ConfigError, match=r"unknown option 'web\.listen-adress'"):
        load_settings(["--config.file", str(unknown)], {})
    typed = tmp_path / "typed.yaml"
    typed.write_text("gpu:\n  poll-interval: 1ms\n")
    with pytest.raises(ConfigError, match=r"--config\.file gpu\.poll-interval: 1ms is below"):
        load_settings(["--config.file", str(typed)], {})
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(["--config.file", str(tmp_path / "missing.yaml")], {})


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_bad_flag_exits_2_with_one_line() -> None:
    result = run_cli("--gpu.poll-interval", "3ms")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "inference-bottleneck-exporter: error: --gpu.poll-interval: 3ms is below the minimum 500ms"
    ]
    unknown = run_cli("--no-such-flag")
    assert unknown.returncode == 2
    assert len(unknown.stderr.strip().splitlines()) == 1
    assert "unrecognized arguments: --no-such-flag" in unknown.stderr


def test_cli_bad_replay_trace_exits_2(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"kind": "header"}\n')
    result = run_cli("--gpu.replay-file", str(trace))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "--gpu.replay-file:" in result.stderr and "t.jsonl:1" in result.stderr


def test_cli_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("inference-bottleneck-exporter, version 0.1.0")


def test_config_check_prints_resolved_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config.check", "--gpu.replay-file", str(TRACE), "--no-collector.cpu"]) == 0
    out = capsys.readouterr().out
    assert f"gpu.replay-file={TRACE} (flag)" in out
    assert "collector.cpu=False (flag)" in out
    assert "web.listen-address=:10960 (default)" in out


def test_record_rejects_bad_duration() -> None:
    result = run_cli("record", "--duration", "soon", "--out", "/tmp/x.jsonl")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "inference-bottleneck-exporter: error: --duration: 'soon' is not a duration (use e.g. "
        "500ms, 15s, 1m30s, 1.5m: units ms, s, m, h, d, w, y, largest first)"
    )


@pytest.mark.parametrize("command", ["demo", "load"])
def test_lab_commands_say_when_the_lab_is_left_out(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As in the sidecar's image, which installs no exporter/lab: one line, exit 2."""
    import importlib  # noqa: PLC0415

    real = importlib.import_module

    def without_lab(name: str, package: str | None = None) -> object:
        if name.startswith("exporter.lab"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", without_lab)
    with pytest.raises(SystemExit) as exit_info:
        main([command])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"inference-bottleneck-exporter: error: {command} needs the lab (exporter.lab), which "
        "this installation leaves out: run it from a source checkout (make demo)\n"
    )


def test_each_flag_is_declared_once() -> None:
    """Every option is one field of an options dataclass; record takes serve's declarations."""
    from exporter.cli import RECORD_OPTIONS  # noqa: PLC0415
    from exporter.collectors import serve_options  # noqa: PLC0415

    names = [option.name for option in serve_options()]
    assert len(names) == len(set(names))
    assert set(RECORD_OPTIONS) <= set(names)
