"""TLS and basic authentication from a web config file in the exporter-toolkit format.

The file node_exporter users already have works here::

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default), ...
      client_ca_file: ca.crt
      min_version: TLS12                              # TLS12 (default) or TLS13
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hashes only

Passwords are checked with bcrypt on every request that is not cached; the cache holds only
*successful* checks, keyed by an HMAC of the presented user and password under a key that lives
in this process alone — presenting the stored hash as the password (CVE-2022-46146 in
exporter-toolkit) or a wrong password can never hit it. Unknown users cost a bcrypt check too,
so timing does not reveal which users exist. The file is re-read when it changes; a broken
new version is logged and the previous one stays in force.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import hmac
import logging
import os
import secrets
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from exporter.config import ConfigError

log = logging.getLogger(__name__)

CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_KNOWN_TOP = {"tls_server_config", "basic_auth_users", "http_server_config"}
_KNOWN_TLS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
    "client_allowed_sans",
}
_CACHE_LIMIT = 256


@functools.cache
def _dummy_hash() -> bytes:
    """A bcrypt hash of a random password: unknown users are checked against it."""
    import bcrypt  # noqa: PLC0415

    return bytes(bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(10)))


def _fail(problem: str) -> ConfigError:
    return ConfigError("--web.config.file", problem)


@dataclass(frozen=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    client_auth: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str | None = None


@dataclass(frozen=True)
class WebConfig:
    """A validated web config; ``users`` maps user names to bcrypt hashes."""

    tls: TlsConfig | None = None
    users: dict[str, bytes] = field(default_factory=dict)


def _path(base: Path, raw: Any, key: str) -> Path:
    if not isinstance(raw, str) or not raw:
        raise _fail(f"tls_server_config.{key} must be a file path")
    path = Path(raw)
    return path if path.is_absolute() else base / path


def parse_web_config(path: Path) -> WebConfig:
    """Read and validate; raises ConfigError (one line) on any problem."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise _fail(f"cannot read {path}: {err.strerror}") from None
    except yaml.YAMLError:
        raise _fail(f"{path} is not valid YAML") from None
    if data is None:
        return WebConfig()
    if not isinstance(data, dict):
        raise _fail("the top level must be a mapping")
    unknown = sorted(set(data) - _KNOWN_TOP)
    if unknown:
        raise _fail(f"unknown field {unknown[0]!r}")
    if data.get("http_server_config"):
        log.warning("web config: http_server_config (HTTP/2, headers) is not supported; ignored")
    base = path.parent
    tls: TlsConfig | None = None
    raw_tls = data.get("tls_server_config")
    if raw_tls is not None:
        if not isinstance(raw_tls, dict):
            raise _fail("tls_server_config must be a mapping")
        unknown = sorted(set(raw_tls) - _KNOWN_TLS)
        if unknown:
            raise _fail(f"unknown field tls_server_config.{unknown[0]}")
        client_auth = str(raw_tls.get("client_auth_type", "NoClientCert"))
        if client_auth not in CLIENT_AUTH_TYPES:
            raise _fail(
                f"tls_server_config.client_auth_type {client_auth!r} is not one of "
                f"{', '.join(CLIENT_AUTH_TYPES)}"
            )
        ca = raw_tls.get("client_ca_file")
        if client_auth in {"VerifyClientCertIfGiven", "RequireAndVerifyClientCert"} and not ca:
            raise _fail(f"tls_server_config.client_ca_file is required with {client_auth}")
        versions = {}
        for key, default in (("min_version", "TLS12"), ("max_version", None)):
            value = raw_tls.get(key, default)
            if value is not None and value not in TLS_VERSIONS:
                raise _fail(f"tls_server_config.{key} {value!r} is not TLS12 or TLS13")
            versions[key] = value
        tls = TlsConfig(
            cert_file=_path(base, raw_tls.get("cert_file"), "cert_file"),
            key_file=_path(base, raw_tls.get("key_file"), "key_file"),
            client_auth=client_auth,
            client_ca_file=_path(base, ca, "client_ca_file") if ca else None,
            min_version=str(versions["min_version"]),
            max_version=versions["max_version"],
        )
        build_ssl_context(tls)  # fails now, with the file's name, rather than at the handshake
    users: dict[str, bytes] = {}
    raw_users = data.get("basic_auth_users")
    if raw_users is not None:
        if not isinstance(raw_users, dict):
            raise _fail("basic_auth_users must map user names to bcrypt hashes")
        for user, hashed in raw_users.items():
            text = str(hashed)
            if not text.startswith(("$2a$", "$2b$", "$2y$")) or len(text) != 60:
                raise _fail(f"basic_auth_users.{user}: not a bcrypt hash")
            if ":" in str(user):
                raise _fail(f"basic_auth_users.{user}: user names cannot contain ':'")
            # Python's bcrypt accepts $2b$; $2y$ (htpasswd) is the same algorithm.
            users[str(user)] = ("$2b$" + text[4:]).encode()
    return WebConfig(tls=tls, users=users)


def build_ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    if tls.max_version is not None:
        context.maximum_version = TLS_VERSIONS[tls.max_version]
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file is not None:
            context.load_verify_locations(cafile=str(tls.client_ca_file))
    except (OSError, ssl.SSLError) as err:
        raise _fail(f"TLS certificate or key: {err}") from None
    context.verify_mode = CLIENT_AUTH_TYPES[tls.client_auth]
    return context


class WebSecurity:
    """The live web config: auth middleware, TLS context, reload on change."""

    def __init__(self, path: Path, *, protect_health: bool = False) -> None:
        self.path = path
        self.protect_health = protect_health
        self.config = parse_web_config(path)
        self._stamp = self._file_stamp()
        self._key = secrets.token_bytes(32)
        self._cache: dict[bytes, str] = {}
        self._lock = threading.Lock()
        self.context = build_ssl_context(self.config.tls) if self.config.tls else None

    def _file_stamp(self) -> tuple[float, int] | None:
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return stat.st_mtime, stat.st_size

    def maybe_reload(self) -> None:
        """Re-read the file if it changed; keep the old config when the new one is broken."""
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            config = parse_web_config(self.path)
        except ConfigError as err:
            log.error("web config not reloaded, previous one stays in force: %s", err)
            return
        if (config.tls is None) != (self.config.tls is None):
            log.error("web config not reloaded: turning TLS on or off needs a restart")
            return
        if config.tls is not None and self.context is not None:
            # New handshakes use the new certificate; the listening socket stays.
            try:
                self.context.load_cert_chain(config.tls.cert_file, config.tls.key_file)
            except (OSError, ssl.SSLError) as err:
                log.error("web config not reloaded: %s", err)
                return
        with self._lock:
            self.config = config
            self._cache.clear()
        log.info("web config reloaded from %s", self.path)

    def check(self, header: str | None) -> str | None:
        """The authenticated user for an Authorization header, or None. Blocking (bcrypt)."""
        import bcrypt  # noqa: PLC0415 - only needed when basic auth is configured

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
        with self._lock:
            users = self.config.users
            if self._cache.get(digest) == user and user in users:
                return user
        stored = users.get(user)
        ok = bcrypt.checkpw(password.encode(), stored if stored is not None else _dummy_hash())
        if not ok or stored is None:
            return None
        with self._lock:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[digest] = user
        return user

    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        self.maybe_reload()
        if not self.config.users:
            return await handler(request)
        if not self.protect_health and request.path in {"/-/healthy", "/-/ready"}:
            return await handler(request)
        header = request.headers.get("Authorization")
        user = await asyncio.get_running_loop().run_in_executor(None, self.check, header)
        if user is None:
            return web.Response(
                status=401,
                text="Unauthorized\n",
                headers={"WWW-Authenticate": 'Basic realm="inference-bottleneck-exporter"'},
            )
        return await handler(request)
