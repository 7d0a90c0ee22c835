"""Configuration: one table of options, read from flags, environment and a YAML file.

Precedence is flag > environment (``INFERENCE_EXPORTER_<FLAG>``, dots and dashes as ``_``)
> ``--config.file`` > default. Every value is parsed and range-checked here; a bad one raises
:class:`ConfigError` naming the option and the problem, which the CLI prints as one line and
exits 2 (an exporter whose user set a 3 ms interval must refuse, not burn a core).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

ENV_PREFIX = "INFERENCE_EXPORTER_"
# Port 10960: the Prometheus default-port list (9100-9999) has been full since 2023 and newer
# exporters take ports from 10000 up; 10960 was free in it when this was written.
DEFAULT_PORT = 10960
LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_FORMATS = ("logfmt", "json")
ENGINE_TYPES = ("auto", "vllm", "sglang", "tgi", "triton", "llamacpp", "custom")
# Default engine processes to watch: the front-ends and servers of the mainstream engines.
DEFAULT_PROCESS_MATCH = (
    r"(?i)vllm|sglang|text-generation-launcher|text-generation-router|text-generation-server"
    r"|tritonserver|llama-server"
)


class ConfigError(ValueError):
    """A configuration value is invalid; ``str()`` is the one line the user sees."""

    def __init__(self, option: str, problem: str) -> None:
        self.option = option
        self.problem = problem
        super().__init__(f"{option}: {problem}")


_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Prometheus-style duration (``500ms``, ``15s``, ``1m30s``) in seconds."""
    text = text.strip()
    if not _DURATION_RE.match(text):
        raise ValueError(f"{text!r} is not a duration (use e.g. 500ms, 15s, 1m30s)")
    return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(text))


def format_duration(seconds: float) -> str:
    if seconds < 1 and seconds * 1000 == int(seconds * 1000):
        return f"{int(seconds * 1000)}ms"
    return f"{seconds:g}s"


def parse_address(text: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (all interfaces) or ``[v6]:port``."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ValueError(f"{text!r} is not [ipv6]:port")
        host, port_text = text[1:end], text[end + 2 :]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"{text!r} has no port (use host:port or :port)")
        if ":" in host:
            raise ValueError(f"{text!r}: write IPv6 addresses as [addr]:port")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: port must be 0-65535")
    return host, int(port_text)


_BYTES_RE = re.compile(r"^(\d+)(B|KiB|MiB|GiB)?$")
_BYTE_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def parse_bytes(text: str) -> int:
    """``16MiB``, ``512KiB``, ``1048576`` in bytes."""
    match = _BYTES_RE.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a size (use e.g. 16MiB, 512KiB)")
    return int(match.group(1)) * _BYTE_UNITS[match.group(2) or "B"]


def format_bytes(n: int) -> str:
    for unit in ("GiB", "MiB", "KiB"):
        if n % _BYTE_UNITS[unit] == 0:
            return f"{n // _BYTE_UNITS[unit]}{unit}"
    return f"{n}B"


def parse_url(text: str) -> str:
    """An absolute http(s) URL with a host."""
    parts = urlsplit(text.strip())
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"{text!r} is not an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError:
        raise ValueError(f"{text!r} has an invalid port") from None
    return text.strip()


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{text!r} is not a boolean (true/false)")


@dataclass(frozen=True)
class Option:
    """One configuration option. ``kind`` picks the parser; bounds apply to numbers."""

    name: str
    # str, duration, bool, path, choice, address, url-path, url, int, bytes, regex
    kind: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    metavar: str = ""
    attr: str = ""  # the Settings field it fills

    @property
    def env(self) -> str:
        return ENV_PREFIX + re.sub(r"[.-]", "_", self.name).upper()

    @property
    def dest(self) -> str:
        return re.sub(r"[.-]", "_", self.name)

    def parse(self, raw: Any) -> Any:
        """Parse and validate a raw value (a string from flags/env, any YAML scalar from file)."""
        try:
            value = self._parse(raw)
        except ValueError as err:
            raise ConfigError(f"--{self.name}", str(err)) from None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.minimum is not None and value < self.minimum:
                raise ConfigError(
                    f"--{self.name}", f"{raw} is below the minimum {self._show(self.minimum)}"
                )
            if self.maximum is not None and value > self.maximum:
                raise ConfigError(
                    f"--{self.name}", f"{raw} is above the maximum {self._show(self.maximum)}"
                )
        return value

    def _show(self, bound: float) -> str:
        if self.kind == "duration":
            return format_duration(bound)
        if self.kind == "bytes":
            return format_bytes(int(bound))
        return f"{bound:g}"

    def show(self, value: Any) -> str:
        """A value as the user would write it (``3s``, ``16MiB``)."""
        if self.kind in {"duration", "bytes"}:
            return self._show(value)
        return str(value)

    def _parse(self, raw: Any) -> Any:
        if raw is None:
            raise ValueError("a value is required")
        if self.kind == "bool":
            return raw if isinstance(raw, bool) else parse_bool(str(raw))
        if isinstance(raw, (dict, list)):
            raise ValueError("expected a single value")
        text = str(raw)
        if self.kind == "duration":
            seconds = (
                float(raw)
                if isinstance(raw, (int, float)) and not isinstance(raw, bool)
                else parse_duration(text)
            )
            if not math.isfinite(seconds):
                raise ValueError(f"{text!r} is not finite")
            return seconds
        if self.kind == "choice":
            if text not in self.choices:
                raise ValueError(f"{text!r} is not one of {', '.join(self.choices)}")
            return text
        if self.kind == "address":
            parse_address(text)
            return text
        if self.kind == "url-path":
            if not text.startswith("/") or any(c.isspace() for c in text) or text == "/":
                raise ValueError(f"{text!r} must start with '/' and name a path other than '/'")
            return text
        if self.kind == "url":
            return parse_url(text)
        if self.kind == "int":
            if isinstance(raw, float) or not text.strip().lstrip("-").isdigit():
                raise ValueError(f"{text!r} is not an integer")
            return int(text)
        if self.kind == "bytes":
            return parse_bytes(text)
        if self.kind == "regex":
            try:
                re.compile(text)
            except re.error as err:
                raise ValueError(f"{text!r} is not a regular expression ({err})") from None
            return text
        if self.kind == "path":
            if not text:
                raise ValueError("empty path")
            return Path(text)
        return text


OPTIONS: tuple[Option, ...] = (
    Option(
        "web.listen-address",
        "address",
        f":{DEFAULT_PORT}",
        "Address to listen on for /metrics and the health endpoints.",
        metavar="HOST:PORT",
        attr="listen_address",
    ),
    Option(
        "web.telemetry-path",
        "url-path",
        "/metrics",
        "Path under which to expose metrics.",
        metavar="PATH",
        attr="telemetry_path",
    ),
    Option(
        "web.config.file",
        "path",
        None,
        "Web config (exporter-toolkit format): TLS and basic auth users (bcrypt).",
        metavar="PATH",
        attr="web_config_file",
    ),
    Option(
        "web.protect-health",
        "bool",
        False,
        "Require basic auth on /-/healthy and /-/ready too (default: they stay open for probes).",
        attr="web_protect_health",
    ),
    Option(
        "path.procfs", "path", Path("/proc"), "procfs mountpoint.", metavar="PATH", attr="procfs"
    ),
    Option(
        "gpu.replay-file",
        "path",
        None,
        "Replay this NVML trace (JSON lines) instead of reading NVML.",
        metavar="PATH",
        attr="gpu_replay_file",
    ),
    Option(
        "gpu.devices",
        "str",
        "",
        "Comma-separated GPU indexes or UUIDs to watch (default: every GPU the sidecar sees; "
        "give it the engine's GPUs through NVIDIA_VISIBLE_DEVICES or list them here).",
        metavar="LIST",
        attr="gpu_devices",
    ),
    Option(
        "gpu.poll-interval",
        "duration",
        3.0,
        "How often each GPU is read (about 10 NVML calls per read).",
        minimum=0.5,
        maximum=300.0,
        metavar="DURATION",
        attr="gpu_poll_interval",
    ),
    Option(
        "scrape.timeout",
        "duration",
        2.0,
        "Deadline for one collector in a scrape, and after which an NVML call counts as hung.",
        minimum=0.1,
        maximum=60.0,
        metavar="DURATION",
        attr="scrape_timeout",
    ),
    Option(
        "engine.url",
        "url",
        "http://127.0.0.1:8000/metrics",
        "The inference engine's Prometheus endpoint.",
        metavar="URL",
        attr="engine_url",
    ),
    Option(
        "engine.type",
        "choice",
        "auto",
        "Engine whose metric names to read; auto recognises it from the names.",
        choices=ENGINE_TYPES,
        attr="engine_type",
    ),
    Option(
        "engine.mapping-file",
        "path",
        None,
        "YAML mapping from source metrics to normalised names (engine.type custom).",
        metavar="PATH",
        attr="engine_mapping_file",
    ),
    Option(
        "engine.poll-interval",
        "duration",
        5.0,
        "How often the engine's metrics are polled (off the scrape path).",
        minimum=0.5,
        maximum=300.0,
        metavar="DURATION",
        attr="engine_poll_interval",
    ),
    Option(
        "engine.timeout",
        "duration",
        2.0,
        "Deadline of one engine poll, body included (slow-drip bodies are cut).",
        minimum=0.1,
        maximum=60.0,
        metavar="DURATION",
        attr="engine_timeout",
    ),
    Option(
        "engine.max-body",
        "bytes",
        16 * 1024**2,
        "Largest engine response read; a larger one is a failed poll.",
        minimum=1024,
        maximum=1024**3,
        metavar="SIZE",
        attr="engine_max_body",
    ),
    Option(
        "engine.max-series",
        "int",
        1000,
        "Most normalised series kept per metric; the rest are dropped and counted.",
        minimum=1,
        maximum=1_000_000,
        metavar="N",
        attr="engine_max_series",
    ),
    Option(
        "tokenizer.probe-interval",
        "duration",
        15.0,
        "How often the tokenizer probe runs (two tokenize requests per probe).",
        minimum=1.0,
        maximum=3600.0,
        metavar="DURATION",
        attr="tokenizer_probe_interval",
    ),
    Option(
        "tokenizer.url",
        "str",
        "",
        "Tokenize endpoint; empty: the engine URL's host with the engine's tokenize path.",
        metavar="URL",
        attr="tokenizer_url",
    ),
    Option(
        "tokenizer.prompt-file",
        "path",
        None,
        "Text of the probe prompt (default: a bundled ~512-token prompt).",
        metavar="PATH",
        attr="tokenizer_prompt_file",
    ),
    Option(
        "tokenizer.model",
        "str",
        "",
        "Model name sent with the probe where the engine wants one (default: from the engine's "
        "metrics).",
        metavar="NAME",
        attr="tokenizer_model",
    ),
    Option(
        "process.match",
        "regex",
        DEFAULT_PROCESS_MATCH,
        "Regular expression matched against process command lines to find the engine.",
        metavar="REGEX",
        attr="process_match",
    ),
    Option("log.level", "choice", "info", "Log level.", choices=LOG_LEVELS, attr="log_level"),
    Option("log.format", "choice", "logfmt", "Log format.", choices=LOG_FORMATS, attr="log_format"),
)
BY_NAME = {o.name: o for o in OPTIONS}


def collector_option(name: str, enabled: bool, help_text: str) -> Option:
    return Option(
        f"collector.{name}", "bool", enabled, f"Enable the {name} collector: {help_text}."
    )


@dataclass(frozen=True)
class Settings:
    """Resolved, validated configuration of ``serve``."""

    listen_address: str = f":{DEFAULT_PORT}"
    telemetry_path: str = "/metrics"
    web_config_file: Path | None = None
    web_protect_health: bool = False
    procfs: Path = Path("/proc")
    gpu_replay_file: Path | None = None
    gpu_devices: str = ""
    gpu_poll_interval: float = 3.0
    scrape_timeout: float = 2.0
    log_level: str = "info"
    log_format: str = "logfmt"
    engine_url: str = "http://127.0.0.1:8000/metrics"
    engine_type: str = "auto"
    engine_mapping_file: Path | None = None
    engine_poll_interval: float = 5.0
    engine_timeout: float = 2.0
    engine_max_body: int = 16 * 1024**2
    engine_max_series: int = 1000
    tokenizer_probe_interval: float = 15.0
    tokenizer_url: str = ""
    tokenizer_prompt_file: Path | None = None
    tokenizer_model: str = ""
    process_match: str = DEFAULT_PROCESS_MATCH
    collectors: dict[str, bool] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def listen(self) -> tuple[str, int]:
        return parse_address(self.listen_address)


def flatten_file(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{web: {listen-address: x}}`` and ``{"web.listen-address": x}`` both become dotted keys."""
    if not isinstance(data, Mapping):
        raise ConfigError("--config.file", "the top level must be a mapping of options")
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_file(value, f"{name}."))
        else:
            out[name] = value
    return out


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError("--config.file", f"cannot read {path}: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError("--config.file", f"{path} is not valid YAML{where}") from None
    return {} if data is None else flatten_file(data)


def resolve(
    options: tuple[Option, ...],
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    file_values: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, str]]:
    """Apply precedence to every option; returns (values by option name, source by name)."""
    known = {o.name for o in options}
    unknown = sorted(set(file_values) - known)
    if unknown:
        raise ConfigError("--config.file", f"unknown option {unknown[0]!r}")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for opt in options:
        if opt.name in flags:
            values[opt.name], sources[opt.name] = opt.parse(flags[opt.name]), "flag"
        elif opt.env in env:
            try:
                values[opt.name] = opt.parse(env[opt.env])
            except ConfigError as err:
                raise ConfigError(opt.env, err.problem) from None
            sources[opt.name] = "env"
        elif opt.name in file_values:
            try:
                values[opt.name] = opt.parse(file_values[opt.name])
            except ConfigError as err:
                raise ConfigError(f"--config.file {opt.name}", err.problem) from None
            sources[opt.name] = "file"
        else:
            values[opt.name], sources[opt.name] = opt.default, "default"
    return values, sources


def settings_from(
    values: Mapping[str, Any],
    sources: Mapping[str, str],
    validate_replay: Callable[[Path], None] | None = None,
) -> Settings:
    """Build :class:`Settings` and check cross-field rules."""
    collectors = {
        name.removeprefix("collector."): bool(v)
        for name, v in values.items()
        if name.startswith("collector.")
    }
    fields = {o.attr: values[o.name] for o in OPTIONS}
    settings = Settings(**fields, collectors=collectors, sources=dict(sources))
    if settings.telemetry_path in {"/-/healthy", "/-/ready"}:
        raise ConfigError("--web.telemetry-path", "collides with a health endpoint")
    if any(not d.strip() for d in settings.gpu_devices.split(",")) and settings.gpu_devices:
        raise ConfigError("--gpu.devices", f"{settings.gpu_devices!r} has an empty entry")
    if settings.tokenizer_url:
        try:
            parse_url(settings.tokenizer_url)
        except ValueError as err:
            raise ConfigError("--tokenizer.url", str(err)) from None
    if settings.engine_type == "custom" and settings.engine_mapping_file is None:
        raise ConfigError("--engine.mapping-file", "required with --engine.type custom")
    if settings.gpu_replay_file is not None and validate_replay is not None:
        validate_replay(settings.gpu_replay_file)
    return settings
