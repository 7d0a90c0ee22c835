"""Every field of exporter-toolkit's web config and what it does in this exporter.

The source of the tables in ``SECURITY.md`` and ``docs/deployment.md`` (``python
build-tools/docgen.py``), and the fields :mod:`exporter.server.websec.parsing` knows (any other
is refused)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    """One field of exporter-toolkit's web config and what it does in this exporter."""

    name: str
    here: str


# exporter-toolkit's docs/web-configuration.md (as of commit 19a7c2d, July 2026), every field.
# The tables in SECURITY.md and docs/deployment.md are rendered from this (`python
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


def field_table() -> str:
    """Every field of the format and what it does here, as a markdown table."""
    rows = ["| field | here |", "|---|---|"]
    rows += [f"| `{f.name}` | {f.here.replace('|', '/')} |" for f in FIELDS]
    return "\n".join(rows)
