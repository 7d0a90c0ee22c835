"""TLS, basic auth, security headers and a rate limit from a web config in exporter-toolkit's
format (the ``--web.config.file`` of node_exporter and Prometheus)::

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      client_allowed_sans: [prometheus.monitoring.svc]
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hashes only

Every field of the format is in :data:`FIELDS` with what it does here. A field (or value) is
either applied with exporter-toolkit's documented meaning or refused with one line naming it
and saying what to use instead; nothing is accepted and then ignored. Where Python's ``ssl``
cannot express a Go setting exactly (a client certificate that is required but never
verified, a list of several curves), the setting is refused rather than mapped to something
stricter or looser.

One loaded file is a *generation*: its settings plus a complete server ``SSLContext`` built
from them. Each new TLS connection is set up by the context of the generation in force when
it arrives (:class:`_ListeningContext` hands the handshake to it), and every request on that
connection is checked against the same generation, so a connection never sees half of one
file and half of another. After a reload, a connection opened under an older generation gets
one more response and is then closed; the client reconnects under the new one. The file and
the certificate, key and CA files it names are checked for changes on every request and every
new connection (exporter-toolkit re-reads them as often); a new version that fails to load is
logged and the previous generation stays in force, whole.

Passwords are checked with bcrypt on every request that is not cached; the cache holds only
*successful* checks, keyed by an HMAC of the presented user and password under a key that lives
in this process alone — presenting the stored hash as the password (CVE-2022-46146 in
exporter-toolkit) or a wrong password can never hit it. Unknown users cost a bcrypt check too,
so timing does not reveal which users exist.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from exporter.config import ConfigError, parse_duration

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Field:
    """One field of exporter-toolkit's web config and what it does in this exporter."""

    name: str
    here: str


# exporter-toolkit's docs/web-configuration.md (as of commit 19a7c2d, July 2026), every field.
# The tables in SECURITY.md and docs/deployment.md are rendered from this (`python -m
# build-tools/docgen.py`); tests/server/test_websec_fields.py checks that each field is
# exercised by a test against the real CLI or refused there.
FIELDS: tuple[Field, ...] = (
    Field(
        "tls_server_config.cert_file",
        "Server certificate (PEM; a chain: leaf first). With `key_file`, switches TLS on. "
        "Re-read when it changes.",
    ),
    Field("tls_server_config.key_file", "Private key of `cert_file`. Re-read when it changes."),
    Field(
        "tls_server_config.cert",
        "The certificate inline, as PEM text. Refused together with `cert_file`.",
    ),
    Field(
        "tls_server_config.key",
        "The key inline, as PEM text. Refused together with `key_file`.",
    ),
    Field(
        "tls_server_config.client_auth_type",
        "`NoClientCert` (default), `VerifyClientCertIfGiven`, `RequireAndVerifyClientCert`: "
        "Go's meaning. Refused: `RequestClientCert`, `RequireAnyClientCert` (and its old "
        "name `RequireClientCert`): Go accepts an unverified certificate there, which "
        "Python's ssl cannot do; the message names the nearest safe mode.",
    ),
    Field(
        "tls_server_config.client_ca_file",
        "CAs that client certificates are verified against. Required with "
        "`VerifyClientCertIfGiven` and `RequireAndVerifyClientCert` (Go would fall back to "
        "the system's public CAs; refused here); refused with `NoClientCert`, as in "
        "exporter-toolkit. Re-read when it changes.",
    ),
    Field(
        "tls_server_config.client_ca",
        "The client CAs inline, as PEM text. Refused together with `client_ca_file`.",
    ),
    Field(
        "tls_server_config.client_allowed_sans",
        "The verified client certificate must carry one of these SANs (DNS, IP, e-mail or "
        "URI, exact match), else 403 before anything else happens; a client without a "
        "certificate gets 403 too. Needs `VerifyClientCertIfGiven` or "
        "`RequireAndVerifyClientCert` (refused with `NoClientCert`, where Go ignores it); "
        "an empty list is refused.",
    ),
    Field(
        "tls_server_config.min_version",
        "`TLS12` (default) or `TLS13`. `TLS10`, `TLS11` refused (RFC 8996).",
    ),
    Field(
        "tls_server_config.max_version",
        "`TLS13` (default) or `TLS12`. `TLS10`, `TLS11` refused; below `min_version` refused.",
    ),
    Field(
        "tls_server_config.cipher_suites",
        "TLS 1.2 suites by Go name (the ten ECDHE suites of Go's `tls.CipherSuites()`), "
        "mapped to OpenSSL's; the only suites offered for TLS 1.2. Default: the six ECDHE "
        "AEAD suites (no CBC). TLS 1.3 names refused (not configurable, as in Go); Go's "
        "insecure suites and unknown names refused.",
    ),
    Field(
        "tls_server_config.prefer_server_cipher_suites",
        "`true` (default): the order of `cipher_suites` decides; `false`: the client's "
        "order. (Go itself has ignored this since 1.17; here it has its documented meaning.)",
    ),
    Field(
        "tls_server_config.curve_preferences",
        "One curve (`CurveP256`, `CurveP384`, `CurveP521`, `X25519`): the only key-exchange "
        "group, for TLS 1.2 and 1.3. A list of several refused (Python 3.11's ssl sets one). "
        "Default: OpenSSL's groups (X25519, P-256, X448, P-521, P-384).",
    ),
    Field(
        "http_server_config.http2",
        "`false`: what is served anyway (HTTP/1.1). `true` refused with TLS (aiohttp has no "
        "HTTP/2); without TLS Go serves HTTP/1.1 too, so it is accepted.",
    ),
    Field(
        "http_server_config.headers.Strict-Transport-Security",
        "Sent on every response (401, 403, 404, 429 and the probes included); blank: not sent.",
    ),
    Field(
        "http_server_config.headers.Content-Security-Policy",
        "Sent on every response; blank: not sent.",
    ),
    Field(
        "http_server_config.headers.X-Frame-Options",
        "`deny` or `sameorigin` (anything else refused), sent on every response.",
    ),
    Field(
        "http_server_config.headers.X-Content-Type-Options",
        "`nosniff` (anything else refused), sent on every response.",
    ),
    Field(
        "http_server_config.headers.X-XSS-Protection",
        "Sent on every response; blank: not sent.",
    ),
    Field(
        "basic_auth_users",
        "User name to bcrypt hash (`$2a$`, `$2b$`, `$2y$`); any other value refused. Probes "
        "stay open unless `--web.protect-health`.",
    ),
    Field(
        "rate_limit.interval",
        "Token bucket over all requests (probes included): one token per interval, 429 "
        "when empty. `0` or absent: off. A duration (`500ms`, `1s`).",
    ),
    Field(
        "rate_limit.burst",
        "Bucket size; the bucket starts full. Must be at least 1 when `interval` is set "
        "(0 would refuse every request). A reload starts a new, full bucket.",
    ),
)

_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNVERIFIED_MODES = {
    # Go's RequestClientCert asks for a certificate and admits anyone: NoClientCert grants the
    # same access; VerifyClientCertIfGiven is what people usually mean by it.
    "RequestClientCert": "use NoClientCert (the same access: anyone) or VerifyClientCertIfGiven "
    "with client_ca_file",
    "RequireAnyClientCert": "the nearest safe mode is RequireAndVerifyClientCert with "
    "client_ca_file",
    "RequireClientCert": "the nearest safe mode is RequireAndVerifyClientCert with client_ca_file",
}
# Go's tls.CipherSuites() (the ones it calls secure) for TLS 1.2, to OpenSSL's names.
_CIPHERS = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
_TLS13_CIPHERS = {
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
}
# Go's tls.InsecureCipherSuites(): exporter-toolkit refuses them too.
_INSECURE_CIPHERS = {
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
}
# Forward secrecy and AEAD only, in Go's preference order: Go's defaults without its CBC-SHA1.
DEFAULT_CIPHERS = (
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
)
_CURVES = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}
# exporter-toolkit's extraHTTPHeaders: the configurable headers and, where it checks them,
# their allowed values (exact, case-sensitive, as there).
HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
_PROBES = frozenset({"/-/healthy", "/-/ready"})
_CACHE_LIMIT = 256


def _keys(prefix: str) -> frozenset[str]:
    """The field names directly under ``prefix`` (``""``: the top level)."""
    depth = prefix.count(".")
    return frozenset(f.name.split(".")[depth] for f in FIELDS if f.name.startswith(prefix))


_TOP = _keys("")
_TLS_KEYS = _keys("tls_server_config.")
_HTTP_KEYS = _keys("http_server_config.")
_HEADER_KEYS = frozenset(f.name.split(".", 2)[2] for f in FIELDS if ".headers." in f.name)
_RATE_KEYS = _keys("rate_limit.")
# Any of these switches TLS on (exporter-toolkit's TLSConfig.IsEnabled).
_TLS_SWITCHES = ("cert", "key", "cert_file", "key_file", "client_ca", "client_ca_file")


@functools.cache
def _dummy_hash() -> bytes:
    """A bcrypt hash of a random password: unknown users are checked against it."""
    import bcrypt  # noqa: PLC0415

    return bytes(bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(10)))


def _fail(problem: str) -> ConfigError:
    return ConfigError("--web.config.file", problem)


# --- the settings -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Pem:
    """PEM from a file (``path``) or inline in the web config (``text``)."""

    path: Path | None = None
    text: str | None = None

    def describe(self, key: str) -> str:
        return f"{key} {self.path}" if self.path is not None else f"{key} (inline)"


@dataclass(frozen=True)
class TlsConfig:
    cert: Pem
    key: Pem
    client_auth: str = "NoClientCert"
    client_ca: Pem | None = None
    allowed_sans: frozenset[str] | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = DEFAULT_CIPHERS
    prefer_server_cipher_suites: bool = True
    curve: str | None = None

    def files(self) -> tuple[Path, ...]:
        sources = (self.cert, self.key, self.client_ca)
        return tuple(s.path for s in sources if s is not None and s.path is not None)


@dataclass(frozen=True)
class RateLimit:
    interval: float
    burst: int


@dataclass(frozen=True)
class WebConfig:
    """A validated web config; ``users`` maps user names to bcrypt hashes."""

    tls: TlsConfig | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: tuple[tuple[str, str], ...] = ()
    rate_limit: RateLimit | None = None


# --- parsing ------------------------------------------------------------------------------------
class _StrictLoader(yaml.SafeLoader):
    """Refuses a key given twice, as exporter-toolkit's strict YAML decoding does (otherwise
    the last one would silently win over the one the reader saw first)."""


def _mapping_no_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    mapping = dict(loader.construct_mapping(node, deep=True))  # YAMLError on unhashable keys
    if len(mapping) < len(node.value):
        keys = [loader.construct_object(key_node, deep=True) for key_node, _ in node.value]
        twice = next(key for key in keys if keys.count(key) > 1)
        raise _fail(f"field {twice!r} is given twice")
    return mapping


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _mapping_no_duplicates,
)


def _mapping(value: Any, where: str, known: frozenset[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(f"{where} must be a mapping")
    for key in value:
        if key not in known:
            dotted = f"{where}.{key}" if where else str(key)
            raise _fail(f"unknown field {dotted!r}")
    return value


def _text(raw: Mapping[str, Any], key: str) -> str | None:
    """A string field; ``""`` counts as absent, as in Go."""
    value = raw.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _fail(f"tls_server_config.{key} must be a string")
    return value


def _pem(raw: Mapping[str, Any], base: Path, file_key: str, inline_key: str) -> Pem | None:
    path, text = _text(raw, file_key), _text(raw, inline_key)
    if path is not None and text is not None:
        raise _fail(
            f"tls_server_config: give {inline_key} or {file_key}, not both "
            "(exporter-toolkit would silently use the file)"
        )
    if path is not None:
        return Pem(path=Path(path) if Path(path).is_absolute() else base / path)
    return Pem(text=text) if text is not None else None


def _version(raw: Mapping[str, Any], key: str, default: str) -> str:
    value = raw.get(key)
    value = default if value is None or value == "" else value
    if not isinstance(value, str):
        raise _fail(f"tls_server_config.{key} must be TLS12 or TLS13")
    if value in ("TLS10", "TLS11"):
        raise _fail(
            f"tls_server_config.{key} {value}: TLS 1.0 and 1.1 are refused here (deprecated "
            "by RFC 8996); use TLS12"
        )
    if value not in _TLS_VERSIONS:
        raise _fail(f"tls_server_config.{key} {value!r} is not TLS12 or TLS13")
    return str(value)


def _string_list(raw: Mapping[str, Any], key: str) -> list[str] | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(f"tls_server_config.{key} must be a list of strings")
    return value


def _cipher_suites(raw: Mapping[str, Any]) -> tuple[str, ...]:
    names = _string_list(raw, "cipher_suites")
    if not names:
        return DEFAULT_CIPHERS
    for name in names:
        if name in _TLS13_CIPHERS:
            raise _fail(
                f"tls_server_config.cipher_suites: {name} is a TLS 1.3 suite; TLS 1.3 suites "
                "are not configurable (as in Go): list only TLS 1.2 suites"
            )
        if name in _INSECURE_CIPHERS:
            raise _fail(
                f"tls_server_config.cipher_suites: {name} is insecure (Go's "
                "InsecureCipherSuites); use ECDHE suites such as "
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
            )
        if name not in _CIPHERS:
            raise _fail(
                f"tls_server_config.cipher_suites: unknown suite {name!r} "
                f"(one of {', '.join(_CIPHERS)})"
            )
    return tuple(names)


def _curve(raw: Mapping[str, Any]) -> str | None:
    names = _string_list(raw, "curve_preferences")
    if not names:
        return None
    for name in names:
        if name not in _CURVES:
            raise _fail(
                f"tls_server_config.curve_preferences: unknown curve {name!r} "
                f"(one of {', '.join(_CURVES)})"
            )
    if len(set(names)) > 1:
        raise _fail(
            "tls_server_config.curve_preferences: Python's ssl can restrict the key exchange "
            f"to one curve only, not to the list {names}; list one curve, or remove the field "
            "for OpenSSL's default set"
        )
    return names[0]


def _client_auth(raw: Mapping[str, Any]) -> str:
    mode = _text(raw, "client_auth_type") or "NoClientCert"
    if mode in _UNVERIFIED_MODES:
        raise _fail(
            f"tls_server_config.client_auth_type {mode} (a client certificate that is never "
            "verified) cannot be expressed with Python's ssl, which verifies every certificate "
            f"it accepts; {_UNVERIFIED_MODES[mode]}"
        )
    if mode not in _CLIENT_AUTH:
        raise _fail(
            f"tls_server_config.client_auth_type {mode!r} is not one of {', '.join(_CLIENT_AUTH)}"
        )
    return mode


def _allowed_sans(raw: Mapping[str, Any], mode: str) -> frozenset[str] | None:
    sans = _string_list(raw, "client_allowed_sans")
    if sans is None:
        return None
    if not sans:
        raise _fail(
            "tls_server_config.client_allowed_sans is empty, which would refuse every client; "
            "list the allowed SANs or remove the field"
        )
    if mode == "NoClientCert":
        raise _fail(
            "tls_server_config.client_allowed_sans needs verified client certificates: set "
            "client_auth_type RequireAndVerifyClientCert and client_ca_file"
        )
    return frozenset(sans)


def _parse_tls(raw_tls: Any, base: Path) -> TlsConfig | None:
    raw = _mapping(raw_tls, "tls_server_config", _TLS_KEYS)
    enabled = any(_text(raw, key) for key in (*_TLS_SWITCHES, "client_auth_type"))
    if not enabled:
        if raw:
            raise _fail(
                f"tls_server_config.{sorted(raw)[0]} is set but TLS is off (no cert_file and "
                "key_file): add them, or remove the field"
            )
        return None
    cert = _pem(raw, base, "cert_file", "cert")
    key = _pem(raw, base, "key_file", "key")
    if cert is None:
        raise _fail("tls_server_config: missing one of cert or cert_file")
    if key is None:
        raise _fail("tls_server_config: missing one of key or key_file")
    mode = _client_auth(raw)
    client_ca = _pem(raw, base, "client_ca_file", "client_ca")
    if client_ca is not None and mode == "NoClientCert":
        raise _fail(
            "tls_server_config.client_ca_file is set but client_auth_type is NoClientCert; "
            "set client_auth_type RequireAndVerifyClientCert, or remove client_ca_file"
        )
    if client_ca is None and mode != "NoClientCert":
        raise _fail(
            f"tls_server_config.client_ca_file is required with {mode} (Go would trust the "
            "system's public CAs, admitting any publicly issued certificate): name the CA "
            "that issues your scrapers' certificates"
        )
    prefer = raw.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise _fail("tls_server_config.prefer_server_cipher_suites must be true or false")
    tls = TlsConfig(
        cert=cert,
        key=key,
        client_auth=mode,
        client_ca=client_ca,
        allowed_sans=_allowed_sans(raw, mode),
        min_version=_version(raw, "min_version", "TLS12"),
        max_version=_version(raw, "max_version", "TLS13"),
        cipher_suites=_cipher_suites(raw),
        prefer_server_cipher_suites=prefer,
        curve=_curve(raw),
    )
    if _TLS_VERSIONS[tls.min_version] > _TLS_VERSIONS[tls.max_version]:
        raise _fail(
            f"tls_server_config: max_version {tls.max_version} is below min_version "
            f"{tls.min_version}, so no client could connect"
        )
    return tls


def _parse_http(raw_http: Any, tls: TlsConfig | None) -> tuple[tuple[str, str], ...]:
    raw = _mapping(raw_http, "http_server_config", _HTTP_KEYS)
    http2 = raw.get("http2", False)
    if not isinstance(http2, bool):
        raise _fail("http_server_config.http2 must be true or false")
    if http2 and tls is not None:
        raise _fail(
            "http_server_config.http2: true cannot be honoured: this exporter serves HTTP/1.1 "
            "only (Prometheus scrapes it the same); set http2: false or remove it"
        )
    headers = _mapping(raw.get("headers"), "http_server_config.headers", _HEADER_KEYS)
    out = []
    for name, given in headers.items():
        value = "" if given is None else given
        if not isinstance(value, str) or "\n" in value or "\r" in value:
            raise _fail(f"http_server_config.headers.{name} must be a one-line string")
        allowed = HEADERS[name]
        if allowed and value not in allowed:
            raise _fail(
                f"http_server_config.headers.{name} {value!r} is not one of {', '.join(allowed)}"
            )
        if value:  # blank means unset, as documented by exporter-toolkit
            out.append((name, value))
    return tuple(out)


def _parse_rate_limit(raw_rate: Any) -> RateLimit | None:
    raw = _mapping(raw_rate, "rate_limit", _RATE_KEYS)
    text = raw.get("interval")
    try:
        interval = 0.0 if text in (None, 0, "0") else parse_duration(str(text))
    except ValueError as err:
        raise _fail(f"rate_limit.interval: {err}") from None
    burst = raw.get("burst")
    if interval == 0:  # exporter-toolkit: 0 switches the limiter off
        if burst is not None:
            raise _fail(
                "rate_limit.burst is set but rate_limit.interval is 0 or missing, so there is "
                "no limit: set an interval, or remove burst"
            )
        return None
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise _fail(
            "rate_limit.burst must be a whole number of at least 1 (0 would refuse every request)"
        )
    return RateLimit(interval=interval, burst=burst)


def _parse_users(raw_users: Any) -> dict[str, bytes]:
    if raw_users is None:
        return {}
    if not isinstance(raw_users, dict):
        raise _fail("basic_auth_users must map user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for user, hashed in raw_users.items():
        text = str(hashed)
        if not text.startswith(("$2a$", "$2b$", "$2y$")) or len(text) != 60:
            raise _fail(f"basic_auth_users.{user}: not a bcrypt hash")
        if ":" in str(user):
            raise _fail(f"basic_auth_users.{user}: user names cannot contain ':'")
        # Python's bcrypt accepts $2b$; $2y$ (htpasswd) is the same algorithm.
        users[str(user)] = ("$2b$" + text[4:]).encode()
    return users


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise _fail(f"cannot read {path}: {err.strerror}") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: plain data only
    except yaml.YAMLError:
        raise _fail(f"{path} is not valid YAML") from None


def read_web_config(path: Path) -> WebConfig:
    """Read and validate the file alone (no certificate is loaded); ConfigError on a problem."""
    data = _read(path)
    raw = _mapping(data, "", _TOP)
    tls = _parse_tls(raw.get("tls_server_config"), path.parent)
    return WebConfig(
        tls=tls,
        users=_parse_users(raw.get("basic_auth_users")),
        headers=_parse_http(raw.get("http_server_config"), tls),
        rate_limit=_parse_rate_limit(raw.get("rate_limit")),
    )


def parse_web_config(path: Path) -> WebConfig:
    """Read and validate, loading the certificates too; raises ConfigError (one line)."""
    config = read_web_config(path)
    if config.tls is not None:
        build_ssl_context(config.tls)  # fails now, with the file's name, not at a handshake
    return config


# --- TLS ----------------------------------------------------------------------------------------
class _ConfigContext(ssl.SSLContext):
    """A server context built from one generation; its connections find it through
    ``ssl_object.context`` and so are checked against the same generation."""

    generation: _Generation | None = None


@contextlib.contextmanager
def _as_path(pem: Pem) -> Iterator[str]:
    """A path OpenSSL can open: the file, or inline PEM in an anonymous memory file (the
    sidecar's root filesystem is read-only, and the key never touches a disk)."""
    if pem.path is not None:
        yield str(pem.path)
        return
    if not hasattr(os, "memfd_create"):
        raise OSError("inline PEM needs Linux here; use cert_file and key_file")
    fd = os.memfd_create("web-config-pem", os.MFD_CLOEXEC)
    try:
        os.write(fd, (pem.text or "").encode())
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _load_ca(context: ssl.SSLContext, pem: Pem) -> None:
    if pem.path is not None:
        context.load_verify_locations(cafile=str(pem.path))
    else:
        context.load_verify_locations(cadata=pem.text)


def build_ssl_context(tls: TlsConfig) -> _ConfigContext:
    """A complete server context for ``tls``; ConfigError naming what failed to load."""
    context = _ConfigContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _TLS_VERSIONS[tls.min_version]
    context.maximum_version = _TLS_VERSIONS[tls.max_version]
    # Go's servers never renegotiate; OpenSSL would accept a client-initiated one.
    context.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_NO_COMPRESSION
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        context.set_ciphers(":".join(_CIPHERS[name] for name in tls.cipher_suites))
    except ssl.SSLError:
        raise _fail(
            "tls_server_config.cipher_suites: this OpenSSL supports none of "
            f"{', '.join(tls.cipher_suites)}"
        ) from None
    if tls.curve is not None:
        if ssl.OPENSSL_VERSION_INFO < (3,):
            # Before OpenSSL 3, Python's set_ecdh_curve sets TLS 1.2's curve only.
            raise _fail(
                "tls_server_config.curve_preferences needs Python linked to OpenSSL 3 (this "
                f"one has {ssl.OPENSSL_VERSION}); remove the field"
            )
        context.set_ecdh_curve(_CURVES[tls.curve])
    try:
        with _as_path(tls.cert) as cert, _as_path(tls.key) as key:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        where = f"{tls.cert.describe('cert_file')}, {tls.key.describe('key_file')}"
        raise _fail(f"TLS certificate or key ({where}): {_reason(err)}") from None
    if tls.client_ca is not None:
        try:
            _load_ca(context, tls.client_ca)
        except (OSError, ssl.SSLError) as err:
            where = tls.client_ca.describe("client_ca_file")
            raise _fail(f"TLS client CA ({where}): {_reason(err)}") from None
    context.verify_mode = _CLIENT_AUTH[tls.client_auth]
    return context


def _reason(err: OSError | ssl.SSLError) -> str:
    if isinstance(err, ssl.SSLError):
        return str(err.reason or err).replace("_", " ").lower()
    return str(err.strerror or err)


class _ListeningContext(ssl.SSLContext):
    """The context the listening socket is given. It only hands each new connection to the
    complete context of the generation in force. Switching a connection's context later, in
    an SNI callback, is not enough: OpenSSL (3.0, tried) then changes the certificate and the
    cipher list but keeps the verify mode, the protocol versions and the key-exchange groups
    of the context the connection was created with, so a client without a certificate, or
    with TLS 1.2 or another curve, would still get in."""

    pick: Callable[[], _ConfigContext]

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return self.pick().wrap_bio(
            incoming,
            outgoing,
            server_side=server_side,
            server_hostname=server_hostname,
            session=session,
        )


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


# --- one generation -------------------------------------------------------------------------
class _Bucket:
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


class _Generation:
    """One loaded web config with everything built from it, replaced as a whole."""

    def __init__(self, config: WebConfig, stamp: tuple[Any, ...]) -> None:
        self.config = config
        self.stamp = stamp
        self.context = build_ssl_context(config.tls) if config.tls is not None else None
        if self.context is not None:
            self.context.generation = self
        self.bucket = _Bucket(config.rate_limit) if config.rate_limit is not None else None
        self.cache: dict[bytes, str] = {}
        self.lock = threading.Lock()


def _stamp(path: Path, config: WebConfig | None) -> tuple[Any, ...]:
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


class WebSecurity:
    """The live web config: the auth middleware, the listening TLS context, reload on change."""

    def __init__(self, path: Path, *, protect_health: bool = False) -> None:
        self.path = path
        self.protect_health = protect_health
        self._key = secrets.token_bytes(32)
        config = parse_web_config(path)
        self._current = _Generation(config, _stamp(path, config))
        self._seen = self._current.stamp
        self.context: _ListeningContext | None = None
        if self._current.context is not None:
            self.context = _ListeningContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.pick = self._pick_context

    @property
    def config(self) -> WebConfig:
        return self._current.config

    def _pick_context(self) -> _ConfigContext:
        self.maybe_reload()
        context = self._current.context
        assert context is not None  # TLS cannot be switched off without a restart
        return context

    def maybe_reload(self) -> None:
        """Load the file again if it or a file it names changed; keep the old one whole when
        the new one fails."""
        stamp = _stamp(self.path, self._current.config)
        if stamp == self._seen:
            return
        try:
            config = read_web_config(self.path)
            stamp = _stamp(self.path, config)  # the files the new version names
            if (config.tls is None) != (self._current.config.tls is None):
                raise _fail("turning TLS on or off needs a restart")
            generation = _Generation(config, stamp)
        except ConfigError as err:
            self._seen = stamp  # logged once per change, not on every request
            log.error("web config not reloaded, previous one stays in force: %s", err)
            return
        self._seen = stamp
        self._current = generation
        log.info("web config reloaded from %s", self.path)

    def _generation_of(self, request: web.BaseRequest) -> _Generation:
        """The generation whose context set up the request's TLS connection; for plain HTTP,
        the one in force."""
        transport = request.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        if ssl_object is not None:
            context = ssl_object.context
            if isinstance(context, _ConfigContext) and context.generation is not None:
                return context.generation
        return self._current

    def check(self, header: str | None, generation: _Generation | None = None) -> str | None:
        """The authenticated user for an Authorization header, or None. Blocking (bcrypt)."""
        import bcrypt  # noqa: PLC0415 - only needed when basic auth is configured

        gen = generation or self._current
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

    def _san_refused(self, gen: _Generation, request: web.Request) -> bool:
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
        self.maybe_reload()
        gen = self._generation_of(request)
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
        gen = request.get(_GENERATION) or self._generation_of(request)
        for name, value in gen.config.headers:
            response.headers[name] = value
        if gen is not self._current:
            # The client reconnects under the new generation. aiohttp has already decided on
            # keep-alive when this hook runs, so the header is set here too.
            response.force_close()
            response.headers["Connection"] = "close"

    def install(self, app: web.Application) -> None:
        app.middlewares.append(self.middleware)
        app.on_response_prepare.append(self.on_response_prepare)


if hasattr(web, "RequestKey"):
    _GENERATION: Any = web.RequestKey("websec_generation", _Generation)
else:  # aiohttp before RequestKey, which took plain keys without a warning
    _GENERATION = "websec_generation"


# --- the field table in the docs ------------------------------------------------------------


def field_table() -> str:
    """Every field of the format and what it does here, as a markdown table."""
    rows = ["| field | here |", "|---|---|"]
    rows += [f"| `{f.name}` | {f.here.replace('|', '/')} |" for f in FIELDS]
    return "\n".join(rows)
