"""Command line: one table of commands (:data:`COMMANDS`), ``serve`` when none is named.

``serve`` runs the exporter; ``record`` writes an NVML replay trace; ``diagnose`` gives the
verdict from a Prometheus or a sidecar; ``load`` and ``demo`` come from the lab (a source
checkout only). ``--help`` lists every command in one line each; an unknown command is an error.
Errors the user can cause end in one line on stderr and exit code 2; no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from exporter import __version__, logs
from exporter.config import (
    ArgumentParser,
    ConfigError,
    HttpOptions,
    Option,
    Settings,
    add_flag,
    given_flags,
    parse_duration,
    read_config_file,
    resolve,
    section,
    usage_error,
)

if TYPE_CHECKING:
    from exporter.server.app import Exporter

PROG = "inference-bottleneck-exporter"
# The flags of ``serve`` that are not options (no environment variable, no config file key).
VERSION_HELP = "Print the version and exit."
CONFIG_FILE_HELP = (
    "YAML file of options, nested (gpu: {poll-interval: 5s}) or dotted (gpu.poll-interval: 5s) "
    "[env INFERENCE_EXPORTER_CONFIG_FILE]."
)
CONFIG_CHECK_HELP = "Validate the configuration, print each value and where it came from, exit."
#: The serve options ``record`` takes too: how the GPUs are read, where the engine's processes
#: are found, the log level.
RECORD_OPTIONS = (
    "gpu.poll-interval",
    "gpu.replay-file",
    "process.match",
    "gpu.host-procfs",
    "log.level",
)

log = logging.getLogger("exporter")


def _fail(message: str) -> NoReturn:
    usage_error(PROG, message)


def version_text() -> str:
    return f"{PROG}, version {__version__} (python {platform.python_version()})"


def _serve_parser(options: tuple[Option, ...]) -> ArgumentParser:
    parser = ArgumentParser(
        prog=PROG,
        description="Prometheus exporter that finds what a GPU LLM inference server waits for.",
        epilog=commands_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--version", action="version", version=version_text(), help=VERSION_HELP)
    parser.add_argument("--config.file", dest="config_file", metavar="PATH", help=CONFIG_FILE_HELP)
    parser.add_argument(
        "--config.check", dest="config_check", action="store_true", help=CONFIG_CHECK_HELP
    )
    for opt in options:
        add_flag(parser, opt)
    return parser


def load_settings(argv: Sequence[str], env: Mapping[str, str]) -> tuple[Settings, bool]:
    """Parse ``serve`` arguments; raises ConfigError / SystemExit(2) on bad input."""
    from exporter.collectors import check_settings, serve_options  # noqa: PLC0415

    options = serve_options()
    args = _serve_parser(options).parse_args(list(argv))
    namespace = vars(args)
    config_path = namespace.get("config_file") or env.get("INFERENCE_EXPORTER_CONFIG_FILE")
    file_values = read_config_file(Path(config_path)) if config_path else {}
    values, sources = resolve(options, given_flags(options, args), env, file_values)
    settings = Settings.of(values, sources)
    check_settings(settings)
    if settings.web_config_file is not None:
        from exporter.server.websec import parse_web_config  # noqa: PLC0415

        parse_web_config(settings.web_config_file)
    return settings, bool(namespace.get("config_check", False))


def _describe(settings: Settings) -> str:
    from exporter.collectors import serve_options  # noqa: PLC0415

    lines = []
    for opt in serve_options():
        value = settings.values[opt.name]
        if opt.multiple:
            value = opt.show(value)
        lines.append(f"{opt.name}={value} ({settings.sources.get(opt.name, 'default')})")
    return "\n".join(lines)


async def _serve(settings: Settings) -> int:
    from exporter.collectors import build_collectors  # noqa: PLC0415
    from exporter.server.app import SHUTDOWN_BUDGET_S, Exporter  # noqa: PLC0415
    from exporter.server.limits import HttpGuard  # noqa: PLC0415
    from exporter.server.listen import start_site, wait_for_stop_signal  # noqa: PLC0415

    guard = HttpGuard(section(HttpOptions, settings))
    exporter = Exporter(settings, build_collectors(settings))
    exporter.registry.register(guard)
    security = None
    if settings.web_config_file is not None:
        from exporter.server.websec import WebSecurity  # noqa: PLC0415

        security = WebSecurity(settings.web_config_file, protect_health=settings.web_protect_health)
    app = exporter.make_app()
    if security is not None:
        security.install(app)  # the checks, and the configured headers on every response
    host, port = settings.listen
    try:
        runner = await start_site(
            app, host, port, security.context if security is not None else None, guard
        )
    except OSError as err:
        log.error("cannot listen on %s: %s", settings.listen_address, err.strerror or err)
        return 1
    addresses = ", ".join(_fmt_addr(a) for a in runner.addresses)
    scheme = "https" if security is not None and security.context is not None else "http"
    log.info(
        "listening on %s%s (%s, version %s)",
        addresses,
        settings.telemetry_path,
        scheme,
        __version__,
    )
    exporter.start()
    loop = asyncio.get_running_loop()
    settle = loop.create_task(_settle_heap(exporter))
    await wait_for_stop_signal()
    log.info("shutting down")
    settle.cancel()
    try:
        await asyncio.wait_for(runner.cleanup(), timeout=SHUTDOWN_BUDGET_S / 2)
    except TimeoutError:
        log.warning("HTTP server did not close in time")
    await loop.run_in_executor(None, exporter.stop, SHUTDOWN_BUDGET_S / 2)
    log.info("stopped")
    return 0


async def _settle_heap(exporter: Exporter) -> None:
    """After the first collection, take the long-lived heap out of the cyclic collector's scans.

    Imports and start-up leave ~40k objects that live as long as the process. Without this,
    every full collection walks all of them (~25 ms on a slow core, holding the GIL) and lands
    on whichever scrape allocated last: the p99 of /metrics at 10 scrapes/s went from ~9 to
    ~30 ms. Frozen objects are still freed by reference counting; only a reference cycle among
    them would outlive its use, and start-up state is kept for the whole run anyway.
    """
    await exporter.warmed_up()
    gc.collect()
    gc.freeze()
    log.info("start-up heap frozen: %d objects out of the collector's scans", gc.get_freeze_count())


def _fmt_addr(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host = str(address[0])
        return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"
    return str(address)


def serve(argv: Sequence[str], env: Mapping[str, str]) -> int:
    try:
        settings, check_only = load_settings(argv, env)
    except ConfigError as err:
        _fail(str(err))
    if check_only:
        print(_describe(settings))
        return 0
    logs.setup(settings.log_level, settings.log_format)
    return asyncio.run(_serve(settings))


def _duration(flag: str, text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as err:
        _fail(f"{flag}: {err}")


def record(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """``record``: its own ``--duration`` and ``--out``, and the serve options it shares
    (:data:`RECORD_OPTIONS`) from their one declaration, checked as ``serve`` checks them.
    Flags only: the sidecar's environment variables are not read."""
    from exporter.collectors import default_settings, nvml, serve_options  # noqa: PLC0415
    from exporter.collectors.process import ProcessOptions  # noqa: PLC0415

    by_name = {option.name: option for option in serve_options()}
    options = tuple(by_name[name] for name in RECORD_OPTIONS)
    parser = ArgumentParser(
        prog=f"{PROG} record",
        description="Record an NVML replay trace (JSON lines) from the GPUs of this machine.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--duration", default="60s", help="How long to record (default 60s).")
    parser.add_argument("--out", required=True, type=Path, help="Trace file to write.")
    for option in options:
        add_flag(parser, option, env=False)
    args = parser.parse_args(list(argv))
    duration = _duration("--duration", args.duration)
    if not 0 < duration <= 86400:
        _fail(f"--duration: {args.duration} must be more than 0 and at most 24h")
    try:
        values, _ = resolve(options, given_flags(options, args), {}, {})
        settings = default_settings(**{by_name[name].dest: v for name, v in values.items()})
        nvml.check(settings)
    except ConfigError as err:
        _fail(str(err))
    gpu = section(nvml.NvmlOptions, settings)
    logs.setup(settings.log_level, "logfmt")
    from exporter.recorder import record_trace  # noqa: PLC0415

    return record_trace(
        args.out,
        duration=duration,
        interval=gpu.poll_interval,
        replay=gpu.replay_file,
        match=section(ProcessOptions, settings).match,
        host_procfs=gpu.host_procfs,
    )


def _lab(module_name: str, command: str, args: Sequence[str]) -> int:
    """``load`` and ``demo`` live in the lab, which the sidecar's image does not install."""
    import importlib  # noqa: PLC0415

    try:
        module = importlib.import_module(f"exporter.lab.{module_name}")
    except ModuleNotFoundError as err:
        if err.name is None or not err.name.startswith("exporter.lab"):
            raise
        _fail(
            f"{command} needs the lab (exporter.lab), which this installation leaves out: run "
            "it from a source checkout (make demo)"
        )
    result: int = module.main(list(args))
    return result


def _diagnose(argv: Sequence[str], env: Mapping[str, str]) -> int:
    from exporter.diagnose.cli import main as diagnose  # noqa: PLC0415

    return diagnose(list(argv))


def _inject(argv: Sequence[str], env: Mapping[str, str]) -> int:
    from exporter.inject.cli import run  # noqa: PLC0415

    return run(argv)


def _webhook(argv: Sequence[str], env: Mapping[str, str]) -> int:
    from exporter.inject.webhook import run  # noqa: PLC0415

    return run(argv)


def _load(argv: Sequence[str], env: Mapping[str, str]) -> int:
    return _lab("loadgen", "load", argv)


def _demo(argv: Sequence[str], env: Mapping[str, str]) -> int:
    return _lab("demo", "demo", argv)


@dataclass(frozen=True)
class Command:
    """One command of the CLI: its name, the one line ``--help`` shows, and what runs it."""

    name: str
    summary: str
    run: Callable[[Sequence[str], Mapping[str, str]], int]


# Every command, in the order ``--help`` lists them; ``serve`` runs when none is named.
COMMANDS: tuple[Command, ...] = (
    Command("serve", "run the exporter (the default command; its flags are above)", serve),
    Command("record", "record an NVML replay trace from this machine's GPUs", record),
    Command("diagnose", "name the bottleneck from a Prometheus or a sidecar", _diagnose),
    Command("inject", "add the sidecar to the pods of Kubernetes manifests", _inject),
    Command("webhook", "the admission webhook that adds the sidecar to pods", _webhook),
    Command("load", "drive an engine with an open-loop load (lab, source checkout)", _load),
    Command("demo", "the whole pipeline live on this machine (lab, source checkout)", _demo),
)
BY_COMMAND = {command.name: command for command in COMMANDS}


def commands_help() -> str:
    """The ``Commands:`` block of ``--help``: one line per command, as git and kubectl show."""
    width = max(len(command.name) for command in COMMANDS)
    lines = [f"  {command.name.ljust(width)}  {command.summary}" for command in COMMANDS]
    return "\n".join(
        [
            "commands:",
            *lines,
            "",
            f"'{PROG} COMMAND --help' shows a command's flags.",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    if not args or args[0].startswith("-"):
        return serve(args, env)
    command = BY_COMMAND.get(args[0])
    if command is None:
        _fail(f"unknown command {args[0]!r} (commands: {', '.join(BY_COMMAND)}; see --help)")
    return command.run(args[1:], env)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
