"""Reading a web config file: strict YAML, every field validated or refused in one line.

Every key is checked against :data:`FIELDS`, and each value is validated with
exporter-toolkit's meaning or refused in one line that says what to use instead."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from exporter.config import parse_duration
from exporter.server.websec.fields import FIELDS
from exporter.server.websec.tls import CIPHERS, CLIENT_AUTH, CURVES, TLS_VERSIONS, build_ssl_context
from exporter.server.websec.webconfig import (
    DEFAULT_CIPHERS,
    Pem,
    RateLimit,
    TlsConfig,
    WebConfig,
    config_error,
)

_UNVERIFIED_MODES = {
    # Go's RequestClientCert asks for a certificate and admits anyone: NoClientCert grants the
    # same access; VerifyClientCertIfGiven is what people usually mean by it.
    "RequestClientCert": "use NoClientCert (the same access: anyone) or VerifyClientCertIfGiven "
    "with client_ca_file",
    "RequireAnyClientCert": "the nearest safe mode is RequireAndVerifyClientCert with "
    "client_ca_file",
    "RequireClientCert": "the nearest safe mode is RequireAndVerifyClientCert with client_ca_file",
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
# exporter-toolkit's extraHTTPHeaders: the configurable headers and, where it checks them,
# their allowed values (exact, case-sensitive, as there).
HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}


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


class _StrictLoader(yaml.SafeLoader):
    """Refuses a key given twice, as exporter-toolkit's strict YAML decoding does (otherwise
    the last one would silently win over the one the reader saw first)."""


def _mapping_no_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    mapping = dict(loader.construct_mapping(node, deep=True))  # YAMLError on unhashable keys
    if len(mapping) < len(node.value):
        keys = [loader.construct_object(key_node, deep=True) for key_node, _ in node.value]
        twice = next(key for key in keys if keys.count(key) > 1)
        raise config_error(f"field {twice!r} is given twice")
    return mapping


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _mapping_no_duplicates,
)


def _mapping(value: Any, where: str, known: frozenset[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise config_error(f"{where} must be a mapping")
    for key in value:
        if key not in known:
            dotted = f"{where}.{key}" if where else str(key)
            raise config_error(f"unknown field {dotted!r}")
    return value


def _text(raw: Mapping[str, Any], key: str) -> str | None:
    """A string field; ``""`` counts as absent, as in Go."""
    value = raw.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise config_error(f"tls_server_config.{key} must be a string")
    return value


def _pem(raw: Mapping[str, Any], base: Path, file_key: str, inline_key: str) -> Pem | None:
    path, text = _text(raw, file_key), _text(raw, inline_key)
    if path is not None and text is not None:
        raise config_error(
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
        raise config_error(f"tls_server_config.{key} must be TLS12 or TLS13")
    if value in ("TLS10", "TLS11"):
        raise config_error(
            f"tls_server_config.{key} {value}: TLS 1.0 and 1.1 are refused here (deprecated "
            "by RFC 8996); use TLS12"
        )
    if value not in TLS_VERSIONS:
        raise config_error(f"tls_server_config.{key} {value!r} is not TLS12 or TLS13")
    return str(value)


def _string_list(raw: Mapping[str, Any], key: str) -> list[str] | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise config_error(f"tls_server_config.{key} must be a list of strings")
    return value


def _cipher_suites(raw: Mapping[str, Any]) -> tuple[str, ...]:
    names = _string_list(raw, "cipher_suites")
    if not names:
        return DEFAULT_CIPHERS
    for name in names:
        if name in _TLS13_CIPHERS:
            raise config_error(
                f"tls_server_config.cipher_suites: {name} is a TLS 1.3 suite; TLS 1.3 suites "
                "are not configurable (as in Go): list only TLS 1.2 suites"
            )
        if name in _INSECURE_CIPHERS:
            raise config_error(
                f"tls_server_config.cipher_suites: {name} is insecure (Go's "
                "InsecureCipherSuites); use ECDHE suites such as "
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
            )
        if name not in CIPHERS:
            raise config_error(
                f"tls_server_config.cipher_suites: unknown suite {name!r} "
                f"(one of {', '.join(CIPHERS)})"
            )
    return tuple(names)


def _curve(raw: Mapping[str, Any]) -> str | None:
    names = _string_list(raw, "curve_preferences")
    if not names:
        return None
    for name in names:
        if name not in CURVES:
            raise config_error(
                f"tls_server_config.curve_preferences: unknown curve {name!r} "
                f"(one of {', '.join(CURVES)})"
            )
    if len(set(names)) > 1:
        raise config_error(
            "tls_server_config.curve_preferences: Python's ssl can restrict the key exchange "
            f"to one curve only, not to the list {names}; list one curve, or remove the field "
            "for OpenSSL's default set"
        )
    return names[0]


def _client_auth(raw: Mapping[str, Any]) -> str:
    mode = _text(raw, "client_auth_type") or "NoClientCert"
    if mode in _UNVERIFIED_MODES:
        raise config_error(
            f"tls_server_config.client_auth_type {mode} (a client certificate that is never "
            "verified) cannot be expressed with Python's ssl, which verifies every certificate "
            f"it accepts; {_UNVERIFIED_MODES[mode]}"
        )
    if mode not in CLIENT_AUTH:
        raise config_error(
            f"tls_server_config.client_auth_type {mode!r} is not one of {', '.join(CLIENT_AUTH)}"
        )
    return mode


def _allowed_sans(raw: Mapping[str, Any], mode: str) -> frozenset[str] | None:
    sans = _string_list(raw, "client_allowed_sans")
    if sans is None:
        return None
    if not sans:
        raise config_error(
            "tls_server_config.client_allowed_sans is empty, which would refuse every client; "
            "list the allowed SANs or remove the field"
        )
    if mode == "NoClientCert":
        raise config_error(
            "tls_server_config.client_allowed_sans needs verified client certificates: set "
            "client_auth_type RequireAndVerifyClientCert and client_ca_file"
        )
    return frozenset(sans)


def _parse_tls(raw_tls: Any, base: Path) -> TlsConfig | None:
    raw = _mapping(raw_tls, "tls_server_config", _TLS_KEYS)
    enabled = any(_text(raw, key) for key in (*_TLS_SWITCHES, "client_auth_type"))
    if not enabled:
        if raw:
            raise config_error(
                f"tls_server_config.{sorted(raw)[0]} is set but TLS is off (no cert_file and "
                "key_file): add them, or remove the field"
            )
        return None
    cert = _pem(raw, base, "cert_file", "cert")
    key = _pem(raw, base, "key_file", "key")
    if cert is None:
        raise config_error("tls_server_config: missing one of cert or cert_file")
    if key is None:
        raise config_error("tls_server_config: missing one of key or key_file")
    mode = _client_auth(raw)
    client_ca = _pem(raw, base, "client_ca_file", "client_ca")
    if client_ca is not None and mode == "NoClientCert":
        raise config_error(
            "tls_server_config.client_ca_file is set but client_auth_type is NoClientCert; "
            "set client_auth_type RequireAndVerifyClientCert, or remove client_ca_file"
        )
    if client_ca is None and mode != "NoClientCert":
        raise config_error(
            f"tls_server_config.client_ca_file is required with {mode} (Go would trust the "
            "system's public CAs, admitting any publicly issued certificate): name the CA "
            "that issues your scrapers' certificates"
        )
    prefer = raw.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise config_error("tls_server_config.prefer_server_cipher_suites must be true or false")
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
    if TLS_VERSIONS[tls.min_version] > TLS_VERSIONS[tls.max_version]:
        raise config_error(
            f"tls_server_config: max_version {tls.max_version} is below min_version "
            f"{tls.min_version}, so no client could connect"
        )
    return tls


# Server limits people look for in http_server_config (Go's http.Server field names): the
# toolkit has none of them, so they are refused, naming the flag that sets each here.
_FLAG_INSTEAD = {
    "read_header_timeout": "use --web.read-header-timeout",
    "read_timeout": "use --web.read-header-timeout and --web.read-body-timeout",
    "idle_timeout": "use --web.idle-timeout",
    "write_timeout": "use --web.write-timeout",
    "max_connections": "use --web.max-connections",
    "max_requests": "use --web.max-requests",
    "max_header_bytes": "request headers are capped at 64 fields of up to 8 KiB each",
}


def _parse_http(raw_http: Any, tls: TlsConfig | None) -> tuple[tuple[str, str], ...]:
    if isinstance(raw_http, dict):
        for key in raw_http:
            if str(key).lower() in _FLAG_INSTEAD:
                raise config_error(
                    f"http_server_config.{key}: exporter-toolkit's web config has no such field "
                    f"(its http_server_config has http2 and headers only); "
                    f"{_FLAG_INSTEAD[str(key).lower()]}"
                )
    raw = _mapping(raw_http, "http_server_config", _HTTP_KEYS)
    http2 = raw.get("http2", False)
    if not isinstance(http2, bool):
        raise config_error("http_server_config.http2 must be true or false")
    if http2 and tls is not None:
        raise config_error(
            "http_server_config.http2: true cannot be honoured: this exporter serves HTTP/1.1 "
            "only (Prometheus scrapes it the same); set http2: false or remove it"
        )
    headers = _mapping(raw.get("headers"), "http_server_config.headers", _HEADER_KEYS)
    out = []
    for name, given in headers.items():
        value = "" if given is None else given
        if not isinstance(value, str) or "\n" in value or "\r" in value:
            raise config_error(f"http_server_config.headers.{name} must be a one-line string")
        allowed = HEADERS[name]
        if allowed and value not in allowed:
            raise config_error(
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
        raise config_error(f"rate_limit.interval: {err}") from None
    burst = raw.get("burst")
    if interval == 0:  # exporter-toolkit: 0 switches the limiter off
        if burst is not None:
            raise config_error(
                "rate_limit.burst is set but rate_limit.interval is 0 or missing, so there is "
                "no limit: set an interval, or remove burst"
            )
        return None
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise config_error(
            "rate_limit.burst must be a whole number of at least 1 (0 would refuse every request)"
        )
    return RateLimit(interval=interval, burst=burst)


def _parse_users(raw_users: Any) -> dict[str, bytes]:
    if raw_users is None:
        return {}
    if not isinstance(raw_users, dict):
        raise config_error("basic_auth_users must map user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for user, hashed in raw_users.items():
        text = str(hashed)
        if not text.startswith(("$2a$", "$2b$", "$2y$")) or len(text) != 60:
            raise config_error(f"basic_auth_users.{user}: not a bcrypt hash")
        if ":" in str(user):
            raise config_error(f"basic_auth_users.{user}: user names cannot contain ':'")
        # Python's bcrypt accepts $2b$; $2y$ (htpasswd) is the same algorithm.
        users[str(user)] = ("$2b$" + text[4:]).encode()
    return users


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise config_error(f"cannot read {path}: {err.strerror}") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: plain data only
    except yaml.YAMLError:
        raise config_error(f"{path} is not valid YAML") from None


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
