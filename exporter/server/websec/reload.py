"""The web config in force and its reload, one whole generation at a time.

One loaded file is a generation: its settings and the TLS context, rate-limit bucket and auth
cache built from them. It is replaced whole when the file or a file it names changes, and kept
whole when the new version fails to load."""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from exporter.config import ConfigError
from exporter.server.websec.parsing import parse_web_config, read_web_config
from exporter.server.websec.tls import ConfigContext, ListeningContext, build_ssl_context
from exporter.server.websec.webconfig import RateLimit, WebConfig, config_error

# The package's logger, as before the package was split into modules.
log = logging.getLogger(__name__.rpartition(".")[0])


class TokenBucket:
    """golang.org/x/time/rate's token bucket: starts full, one token per interval."""

    def __init__(self, limit: RateLimit) -> None:
        self.limit = limit
        self.tokens = float(limit.burst)
        self.last = time.monotonic()

    def allow(self) -> bool:  # called on the event loop only
        now = time.monotonic()
        self.tokens = min(
            float(self.limit.burst), self.tokens + (now - self.last) / self.limit.interval
        )
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class Generation:
    """One loaded web config with everything built from it, replaced as a whole."""

    def __init__(self, config: WebConfig, stamp: tuple[Any, ...]) -> None:
        self.config = config
        self.stamp = stamp
        self.context = build_ssl_context(config.tls) if config.tls is not None else None
        if self.context is not None:
            self.context.generation = self
        self.bucket = TokenBucket(config.rate_limit) if config.rate_limit is not None else None
        self.cache: dict[bytes, str] = {}
        self.lock = threading.Lock()


def file_stamp(path: Path, config: WebConfig | None) -> tuple[Any, ...]:
    """Size and mtime of the file and of every file it names, to notice any change."""
    files = [path, *(config.tls.files() if config is not None and config.tls else ())]
    out: list[Any] = []
    for name in files:
        try:
            stat = os.stat(name)
        except OSError:
            out.append(None)
        else:
            out.append((stat.st_mtime_ns, stat.st_size, stat.st_ino))
    return tuple(out)


class LiveWebConfig:
    """The web config in force: its generation, reloaded on change; the context the listening
    socket holds (None without TLS); and which generation a request belongs to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        config = parse_web_config(path)
        self.current = Generation(config, file_stamp(path, config))
        self._seen = self.current.stamp
        self.context: ListeningContext | None = None
        if self.current.context is not None:
            self.context = ListeningContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.pick = self._pick_context

    @property
    def config(self) -> WebConfig:
        return self.current.config

    def _pick_context(self) -> ConfigContext:
        self.maybe_reload()
        context = self.current.context
        assert context is not None  # TLS cannot be switched off without a restart
        return context

    def maybe_reload(self) -> None:
        """Load the file again if it or a file it names changed; keep the old one whole when
        the new one fails."""
        stamp = file_stamp(self.path, self.current.config)
        if stamp == self._seen:
            return
        try:
            config = read_web_config(self.path)
            stamp = file_stamp(self.path, config)  # the files the new version names
            if (config.tls is None) != (self.current.config.tls is None):
                raise config_error("turning TLS on or off needs a restart")
            generation = Generation(config, stamp)
        except ConfigError as err:
            self._seen = stamp  # logged once per change, not on every request
            log.error("web config not reloaded, previous one stays in force: %s", err)
            return
        self._seen = stamp
        self.current = generation
        log.info("web config reloaded from %s", self.path)

    def generation_of(self, request: web.BaseRequest) -> Generation:
        """The generation whose context set up the request's TLS connection; for plain HTTP,
        the one in force."""
        transport = request.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        if ssl_object is not None:
            context = ssl_object.context
            if isinstance(context, ConfigContext) and isinstance(context.generation, Generation):
                return context.generation
        return self.current
