"""Configuration: options declared once, read from flags, environment and a YAML file.

An option is a field of an options dataclass, declared with :func:`flag` (name, default,
bounds, help); the dataclass is the table. The server's own options are :class:`ServerOptions`,
each collector's its own dataclass, and ``--help``, the environment variables, the config-file
keys, :class:`Settings` and the README's flag table are all derived from those fields.

Precedence is flag > environment (``INFERENCE_EXPORTER_<FLAG>``, dots and dashes as ``_``)
> ``--config.file`` > default. Every value is parsed and range-checked here; a bad one raises
:class:`ConfigError` naming the option and the problem, which the CLI prints as one line and
exits 2 (an exporter whose user set a 3 ms interval must refuse, not burn a core).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit

import yaml

ENV_PREFIX = "INFERENCE_EXPORTER_"
LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_FORMATS = ("logfmt", "json")
#: Exit code of every usage or configuration error, in every command.
EXIT_USAGE = 2


class ConfigError(ValueError):
    """A configuration value is invalid; ``str()`` is the one line the user sees."""

    def __init__(self, option: str, problem: str) -> None:
        self.option = option
        self.problem = problem
        super().__init__(f"{option}: {problem}")


def usage_error(prog: str, message: str) -> NoReturn:
    """End a command with one line on stderr and exit code 2: the way every command fails on
    input its user can fix."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(EXIT_USAGE)


class ArgumentParser(argparse.ArgumentParser):
    """The argument parser of every command: a usage error is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        usage_error(self.prog, message)


# One duration grammar for every flag, environment variable, config file and subcommand:
# Prometheus's units, largest first, each at most once, a part may have a fraction
# (``500ms``, ``15s``, ``1m30s``, ``1.5m``, ``2h``, ``1d``).
_UNITS = {
    "y": 365 * 86400.0,
    "w": 7 * 86400.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}
_UNIT_ORDER = tuple(_UNITS)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")


def parse_duration(text: str) -> float:
    """A duration (``500ms``, ``15s``, ``1m30s``, ``1.5m``) in seconds; ValueError otherwise."""
    text = text.strip()
    position, last, seconds = 0, -1, 0.0
    for match in _DURATION_PART.finditer(text):
        rank = _UNIT_ORDER.index(match.group(2))
        if match.start() != position or rank <= last:
            break
        position, last = match.end(), rank
        seconds += float(match.group(1)) * _UNITS[match.group(2)]
    if not text or position != len(text):
        raise ValueError(
            f"{text!r} is not a duration (use e.g. 500ms, 15s, 1m30s, 1.5m: units ms, s, m, "
            "h, d, w, y, largest first)"
        )
    return seconds


_FORMAT_UNITS = (("d", 86400000), ("h", 3600000), ("m", 60000), ("s", 1000), ("ms", 1))


def format_duration(seconds: float) -> str:
    """Seconds as the shortest duration of that grammar (``300`` -> ``5m``, ``90`` ->
    ``1m30s``, ``0.5`` -> ``500ms``), which PromQL reads too.

    Rounded to whole milliseconds, the finest unit Prometheus accepts; ``0`` is ``0s``.
    """
    ms = round(seconds * 1000)
    if ms <= 0:
        return "0s"
    parts = []
    for unit, size in _FORMAT_UNITS:
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


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


def format_bytes(size: int) -> str:
    """Bytes in the largest unit that divides them (``16777216`` -> ``16MiB``)."""
    for unit in ("GiB", "MiB", "KiB"):
        if size % _BYTE_UNITS[unit] == 0:
            return f"{size // _BYTE_UNITS[unit]}{unit}"
    return f"{size}B"


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
    """One configuration option, as :func:`flag` declares it on its options dataclass.
    ``kind`` picks the parser; bounds apply to numbers.

    A ``multiple`` option takes one or more values, as a tuple: the flag given several times,
    a comma-separated environment variable, or a YAML list (or one value) in the file."""

    name: str
    # str, duration, bool, path, choice, address, url-path, url, int, bytes, regex
    kind: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    metavar: str = ""
    multiple: bool = False

    @property
    def env(self) -> str:
        return ENV_PREFIX + re.sub(r"[.-]", "_", self.name).upper()

    @property
    def dest(self) -> str:
        return re.sub(r"[.-]", "_", self.name)

    def parse(self, raw: Any) -> Any:
        """Parse and validate a raw value (a string from flags/env, any YAML scalar from file;
        for a ``multiple`` option also a list, or a comma-separated string)."""
        if self.multiple:
            return tuple(self._one(item) for item in self._items(raw))
        return self._one(raw)

    def _items(self, raw: Any) -> list[Any]:
        """The values of a ``multiple`` option: list items, each string split at commas."""
        given = list(raw) if isinstance(raw, (list, tuple)) else [raw]
        items: list[Any] = []
        for item in given:
            if not isinstance(item, str):
                items.append(item)
                continue
            parts = [part.strip() for part in item.split(",")]
            if any(not part for part in parts):
                raise ConfigError(f"--{self.name}", f"{item!r} has an empty value")
            items += parts
        if not items:
            raise ConfigError(f"--{self.name}", "expected one or more values")
        return items

    def _one(self, raw: Any) -> Any:
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
        """A value as the user would write it (``3s``, ``16MiB``; values of a ``multiple``
        option separated by commas)."""
        if self.multiple and isinstance(value, tuple):
            return ",".join(self.show(item) for item in value)
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


def add_flag(parser: argparse.ArgumentParser, opt: Option, *, env: bool = True) -> None:
    """The flag of an option (``--no-<name>`` too for a boolean), its help from the declaration;
    ``env``: the help names the environment variable, which the command reads. A flag not
    given leaves no attribute (``SUPPRESS``): read the given ones back with
    :func:`given_flags`."""
    env_help = f" [env {opt.env}]" if env else ""
    if opt.kind == "bool":
        state = "enabled" if opt.default else "disabled"
        parser.add_argument(
            f"--{opt.name}",
            dest=opt.dest,
            action="store_const",
            const=True,
            default=argparse.SUPPRESS,
            help=f"{opt.help} (default: {state}; --no-{opt.name} turns it off){env_help}",
        )
        parser.add_argument(
            f"--no-{opt.name}",
            dest=opt.dest,
            action="store_const",
            const=False,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )
        return
    default = "" if opt.default in (None, "", ()) else f" (default: {opt.show(opt.default)})"
    parser.add_argument(
        f"--{opt.name}",
        dest=opt.dest,
        metavar=opt.metavar or opt.kind.upper(),
        default=argparse.SUPPRESS,
        help=f"{opt.help}{default}{env_help}",
        action="append" if opt.multiple else "store",
    )


def given_flags(options: Sequence[Option], namespace: argparse.Namespace) -> dict[str, Any]:
    """The options given as flags, by name (the parser's ``argument_default`` is SUPPRESS)."""
    parsed = vars(namespace)
    return {o.name: parsed[o.dest] for o in options if o.dest in parsed}


# The key of an option in its dataclass field's metadata.
_OPTION = "option"
_Value = TypeVar("_Value")
_Options = TypeVar("_Options")


def flag(
    name: str,
    default: _Value,
    help: str,
    *,
    kind: str,
    choices: tuple[str, ...] = (),
    bounds: tuple[float | None, float | None] = (None, None),
    metavar: str = "",
    multiple: bool = False,
) -> _Value:
    """Declare an option as a field of its options dataclass: the one place its name, default,
    bounds (``(minimum, maximum)``, either ``None``) and help are written."""
    minimum, maximum = bounds
    option = Option(
        name,
        kind,
        default,
        help,
        choices=choices,
        minimum=minimum,
        maximum=maximum,
        metavar=metavar,
        multiple=multiple,
    )
    declared: _Value = field(default=default, metadata={_OPTION: option})
    return declared


def options_of(cls: type) -> tuple[Option, ...]:
    """The options an options dataclass declares, in field order."""
    return tuple(f.metadata[_OPTION] for f in fields(cls) if _OPTION in f.metadata)


def _by_field(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The values of the options ``cls`` declares, by field name."""
    return {f.name: values[f.metadata[_OPTION].name] for f in fields(cls) if _OPTION in f.metadata}


def options_from(cls: type[_Options], values: Mapping[str, Any]) -> _Options:
    """An options dataclass filled from resolved values by option name."""
    return cls(**_by_field(cls, values))


@dataclass(frozen=True)
class ServerOptions:
    """The options of the server itself; each collector declares its own (an options dataclass
    in its module) and :mod:`exporter.collectors` adds them and the ``--collector.<name>``
    toggles."""

    # Port 10960: the Prometheus default-port list (9100-9999) has been full since 2023 and
    # newer exporters take ports from 10000 up; 10960 was free in it when this was written.
    listen_address: str = flag(
        "web.listen-address",
        ":10960",
        "Address of /metrics, /, /-/healthy and /-/ready; 127.0.0.1:0 picks a free port and "
        "logs it.",
        kind="address",
        metavar="HOST:PORT",
    )
    telemetry_path: str = flag(
        "web.telemetry-path",
        "/metrics",
        "Path under which to expose metrics.",
        kind="url-path",
        metavar="PATH",
    )
    web_config_file: Path | None = flag(
        "web.config.file",
        None,
        "Web config in exporter-toolkit's format: TLS, client certificates, basic auth users "
        "(bcrypt) and response headers; SECURITY.md lists every field.",
        kind="path",
        metavar="PATH",
    )
    web_protect_health: bool = flag(
        "web.protect-health",
        False,
        "Require basic auth on /-/healthy and /-/ready too (default: they stay open for probes).",
        kind="bool",
    )
    scrape_timeout: float = flag(
        "scrape.timeout",
        2.0,
        "Deadline for one collector in a scrape, and after which an NVML call counts as hung.",
        kind="duration",
        bounds=(0.1, 60.0),
        metavar="DURATION",
    )
    # signals branch: the landing page of a sidecar that reads no GPU names who reads them.
    gpus_read_by: str = flag(
        "gpu.read-by",
        "",
        "Who reads this pod's GPUs where the nvml collector is off, as the landing page says "
        "it: the chart sets 'the node agent on <node>' (mode node) or 'dcgm-exporter on "
        "<node>' (mode dcgm); empty: the page says only that this sidecar reads none.",
        kind="str",
        metavar="TEXT",
    )
    log_level: str = flag("log.level", "info", "Log level.", kind="choice", choices=LOG_LEVELS)
    log_format: str = flag(
        "log.format", "logfmt", "Log format.", kind="choice", choices=LOG_FORMATS
    )


# --- HTTP limits: every listener (sidecar, node agent, webhook) -------------------------------
# Defaults a Prometheus scrape at any interval never meets: the request arrives at once, the
# response is read at once, and an idle keep-alive connection is closed by Prometheus itself
# after 5 minutes (prometheus/common's IdleConnTimeout) before the exporter would close it.


@dataclass(frozen=True)
class HttpOptions:
    """Timeouts and limits of the HTTP server; ``serve`` and ``webhook`` take the same flags.

    exporter-toolkit's web config has no field for any of them (its ``http_server_config``
    has ``http2`` and ``headers`` only), so they are flags; the web config refuses such a field
    and names the flag."""

    read_header_timeout: float = flag(
        "web.read-header-timeout",
        10.0,
        "Longest a client may take to send a request's headers, from the connection's start "
        "(TLS handshake included) or from the first byte of the next request on a kept-alive "
        "connection; then 408 and closed.",
        kind="duration",
        bounds=(0.1, 600.0),
        metavar="DURATION",
    )
    read_body_timeout: float = flag(
        "web.read-body-timeout",
        30.0,
        "Longest a client may take to send a request's body, from the end of its headers; "
        "then closed.",
        kind="duration",
        bounds=(0.1, 600.0),
        metavar="DURATION",
    )
    idle_timeout: float = flag(
        "web.idle-timeout",
        360.0,
        "Longest a kept-alive connection may wait for its next request; then closed.",
        kind="duration",
        bounds=(0.1, 3600.0),
        metavar="DURATION",
    )
    write_timeout: float = flag(
        "web.write-timeout",
        30.0,
        "Longest a response may wait on a client that reads none of it; then closed.",
        kind="duration",
        bounds=(0.1, 600.0),
        metavar="DURATION",
    )
    max_connections: int = flag(
        "web.max-connections",
        128,
        "Most connections open at once (lowered to fit the process's file limit). At the "
        "limit a new connection takes the place of the oldest one that is idle or still "
        "sending its request, which is closed; with none, it gets 503.",
        kind="int",
        bounds=(2, 65536),
        metavar="N",
    )
    max_requests: int = flag(
        "web.max-requests",
        40,
        "Most requests in progress at once (the health probes not counted); one more gets "
        "503 and its connection is closed. Below --web.max-connections.",
        kind="int",
        bounds=(1, 65535),
        metavar="N",
    )

    def check(self) -> None:
        """Cross-field checks; :class:`ConfigError` naming the flag."""
        if self.max_requests >= self.max_connections:
            raise ConfigError(
                "--web.max-requests",
                f"{self.max_requests} must be below --web.max-connections "
                f"({self.max_connections}), so that a new connection can always find room",
            )


HTTP_OPTIONS: tuple[Option, ...] = options_of(HttpOptions)
CORE_OPTIONS: tuple[Option, ...] = options_of(ServerOptions) + HTTP_OPTIONS


def collector_option(name: str, enabled: bool, help_text: str) -> Option:
    return Option(
        f"collector.{name}", "bool", enabled, f"Enable the {name} collector: {help_text}."
    )


@dataclass(frozen=True, kw_only=True)
class Settings(ServerOptions):
    """Resolved, validated configuration of ``serve``.

    The server's own options are its typed fields (:class:`ServerOptions`); ``values`` holds
    every option by name, the collectors' too, which each collector reads through its own
    options dataclass (:func:`section`). Build one with
    :func:`exporter.collectors.default_settings` or from resolved values (:meth:`of`).
    """

    values: Mapping[str, Any]
    collectors: Mapping[str, bool]
    sources: Mapping[str, str]

    @property
    def listen(self) -> tuple[str, int]:
        return parse_address(self.listen_address)

    @classmethod
    def of(cls, values: Mapping[str, Any], sources: Mapping[str, str]) -> Settings:
        """From resolved values by option name (every option's, incl. ``collector.<name>``)."""
        collectors = {
            name.removeprefix("collector."): bool(v)
            for name, v in values.items()
            if name.startswith("collector.")
        }
        settings = cls(
            **_by_field(ServerOptions, values),
            values=dict(values),
            collectors=collectors,
            sources=dict(sources),
        )
        if settings.telemetry_path in {"/-/healthy", "/-/ready"}:
            raise ConfigError("--web.telemetry-path", "collides with a health endpoint")
        options_from(HttpOptions, values).check()
        if settings.gpus_read_by and collectors.get("nvml", False):
            raise ConfigError(
                "--gpu.read-by", "this sidecar reads its GPUs itself (the nvml collector is on)"
            )
        return settings


def section(cls: type[_Options], settings: Settings) -> _Options:
    """A collector's typed view of its options: its options dataclass, filled from
    ``settings``."""
    return options_from(cls, settings.values)


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
