"""What a validated web config is (:class:`WebConfig` and its parts), and the error it raises."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.config import ConfigError

# Forward secrecy and AEAD only, in Go's preference order: Go's defaults without its CBC-SHA1.
DEFAULT_CIPHERS = (
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
)


def config_error(problem: str) -> ConfigError:
    """A problem with the web config, named after the flag that points at it."""
    return ConfigError("--web.config.file", problem)


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
