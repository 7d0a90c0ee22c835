"""The aiohttp middleware of the web config in force: SANs, rate limit, basic auth, headers.

In exporter-toolkit's order: the client certificate's SANs, the rate limit, then basic auth;
and the configured headers on every response."""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from exporter.server.websec.reload import Generation, LiveWebConfig
from exporter.server.websec.webconfig import WebConfig

_PROBES = frozenset({"/-/healthy", "/-/ready"})
_CACHE_LIMIT = 256


@functools.cache
def _dummy_hash() -> bytes:
    """A bcrypt hash of a random password: unknown users are checked against it."""
    import bcrypt  # noqa: PLC0415

    return bytes(bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(10)))


def _go_ip(text: str) -> str:
    """An IP SAN as Go's ``net.IP.String`` writes it (Python writes IPv6 uncompressed)."""
    try:
        ip = ipaddress.ip_address(text.strip())
    except ValueError:
        return text
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def peer_sans(cert: Mapping[str, Any] | None) -> set[str]:
    """The DNS, IP, e-mail and URI SANs of a verified peer certificate (what Go compares)."""
    found: set[str] = set()
    for kind, value in (cert or {}).get("subjectAltName", ()):
        if kind in ("DNS", "email", "URI"):
            found.add(value)
        elif kind == "IP Address":
            found.add(_go_ip(value))
    return found


class WebSecurity:
    """The checks of the live web config on every request: SANs, rate limit, basic auth, and
    the configured headers on every response; :attr:`context` is the listening TLS context."""

    def __init__(self, path: Path, *, protect_health: bool = False) -> None:
        self.path = path
        self.protect_health = protect_health
        self._key = secrets.token_bytes(32)
        self.live = LiveWebConfig(path)
        self.context = self.live.context

    @property
    def config(self) -> WebConfig:
        return self.live.config

    def maybe_reload(self) -> None:
        """Load the file again if it or a file it names changed (see :class:`LiveWebConfig`)."""
        self.live.maybe_reload()

    def check(self, header: str | None, generation: Generation | None = None) -> str | None:
        """The authenticated user for an Authorization header, or None. Blocking (bcrypt)."""
        import bcrypt  # noqa: PLC0415 - only needed when basic auth is configured

        gen = generation or self.live.current
        if not header or not header.startswith("Basic "):
            return None
        try:
            decoded = base64.b64decode(header[6:], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, sep, password = decoded.partition(":")
        if not sep:
            return None
        digest = hmac.new(self._key, f"{user}\0{password}".encode(), hashlib.sha256).digest()
        users = gen.config.users
        with gen.lock:
            if gen.cache.get(digest) == user and user in users:
                return user
        stored = users.get(user)
        ok = bcrypt.checkpw(password.encode(), stored if stored is not None else _dummy_hash())
        if not ok or stored is None:
            return None
        with gen.lock:
            if len(gen.cache) >= _CACHE_LIMIT:
                gen.cache.clear()
            gen.cache[digest] = user
        return user

    def _san_refused(self, gen: Generation, request: web.Request) -> bool:
        tls = gen.config.tls
        if tls is None or tls.allowed_sans is None:
            return False
        transport = request.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        cert = ssl_object.getpeercert() if ssl_object is not None else None
        return not peer_sans(cert) & tls.allowed_sans

    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        self.live.maybe_reload()
        gen = self.live.generation_of(request)
        request[_GENERATION] = gen
        # In exporter-toolkit's order: the SAN check (its handshake), the limiter, then auth.
        if self._san_refused(gen, request):
            return web.Response(status=403, text="Forbidden\n")
        if gen.bucket is not None and not gen.bucket.allow():
            return web.Response(status=429, text="Too Many Requests\n")
        if not gen.config.users or (not self.protect_health and request.path in _PROBES):
            return await handler(request)
        header = request.headers.get("Authorization")
        loop = asyncio.get_running_loop()
        user = await loop.run_in_executor(None, self.check, header, gen)
        if user is None:
            return web.Response(
                status=401,
                text="Unauthorized\n",
                headers={"WWW-Authenticate": 'Basic realm="inference-bottleneck-exporter"'},
            )
        return await handler(request)

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Headers on every response, the router's 404 and aiohttp's 500 included."""
        gen = request.get(_GENERATION) or self.live.generation_of(request)
        for name, value in gen.config.headers:
            response.headers[name] = value
        if gen is not self.live.current:
            # The client reconnects under the new generation. aiohttp has already decided on
            # keep-alive when this hook runs, so the header is set here too.
            response.force_close()
            response.headers["Connection"] = "close"

    def install(self, app: web.Application) -> None:
        app.middlewares.append(self.middleware)
        app.on_response_prepare.append(self.on_response_prepare)


if hasattr(web, "RequestKey"):
    _GENERATION: Any = web.RequestKey("websec_generation", Generation)
else:  # aiohttp before RequestKey, which took plain keys without a warning
    _GENERATION = "websec_generation"
