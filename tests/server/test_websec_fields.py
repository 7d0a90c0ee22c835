"""Every field of exporter-toolkit's web config is exercised by a test against the real CLI or
refused there: a field added to exporter/server/websec/fields.py without either fails here."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from types import ModuleType

import pytest
import support.tls
import yaml
from support.paths import ROOT, build_tool
from support.tls import refused_at_start, tls_config

from exporter.config import ConfigError
from exporter.server import websec

docgen = build_tool("docgen")

# Transcribed from exporter-toolkit's docs/web-configuration.md at commit 19a7c2d (July 2026):
# the format as a new user reads it. A new upstream field belongs here and in websec.FIELDS.
EXPORTER_TOOLKIT_FIELDS = {
    "tls_server_config.cert",
    "tls_server_config.key",
    "tls_server_config.client_ca",
    "tls_server_config.cert_file",
    "tls_server_config.key_file",
    "tls_server_config.client_auth_type",
    "tls_server_config.client_ca_file",
    "tls_server_config.client_allowed_sans",
    "tls_server_config.min_version",
    "tls_server_config.max_version",
    "tls_server_config.cipher_suites",
    "tls_server_config.prefer_server_cipher_suites",
    "tls_server_config.curve_preferences",
    "http_server_config.http2",
    "http_server_config.headers.Content-Security-Policy",
    "http_server_config.headers.X-Frame-Options",
    "http_server_config.headers.X-Content-Type-Options",
    "http_server_config.headers.X-XSS-Protection",
    "http_server_config.headers.Strict-Transport-Security",
    "basic_auth_users",
    "rate_limit.interval",
    "rate_limit.burst",
}

# Each field: the tests in test_websec.py that show its effect on real clients.
EXERCISED = {
    "tls_server_config.cert_file": [
        "test_tls_defaults_and_no_client_cert",
        "test_reload_rotated_certificate",
    ],
    "tls_server_config.key_file": [
        "test_tls_defaults_and_no_client_cert",
        "test_reload_rotated_certificate",
    ],
    "tls_server_config.cert": ["test_inline_cert_key_and_client_ca"],
    "tls_server_config.key": ["test_inline_cert_key_and_client_ca"],
    "tls_server_config.client_ca": ["test_inline_cert_key_and_client_ca"],
    "tls_server_config.client_auth_type": [
        "test_tls_defaults_and_no_client_cert",
        "test_verify_client_cert_if_given",
        "test_require_and_verify_client_cert",
        "test_unverified_client_auth_types_refused",
        "test_reload_client_auth_and_sans",
    ],
    "tls_server_config.client_ca_file": [
        "test_verify_client_cert_if_given",
        "test_require_and_verify_client_cert",
    ],
    "tls_server_config.client_allowed_sans": [
        "test_client_allowed_sans",
        "test_client_allowed_sans_with_verify_if_given",
        "test_reload_client_auth_and_sans",
    ],
    "tls_server_config.min_version": [
        "test_min_version_tls13",
        "test_tls_defaults_and_no_client_cert",
        "test_reload_versions_ciphers_curves",
    ],
    "tls_server_config.max_version": [
        "test_max_version_tls12",
        "test_reload_versions_ciphers_curves",
    ],
    "tls_server_config.cipher_suites": [
        "test_cipher_suites",
        "test_cbc_suite_only_when_listed",
        "test_reload_versions_ciphers_curves",
    ],
    "tls_server_config.prefer_server_cipher_suites": ["test_prefer_server_cipher_suites"],
    "tls_server_config.curve_preferences": [
        "test_curve_preferences",
        "test_curve_default_is_openssls",
        "test_reload_versions_ciphers_curves",
    ],
    "http_server_config.http2": ["test_http2_false_with_tls", "test_headers_on_every_response"],
    "http_server_config.headers.Content-Security-Policy": [
        "test_headers_on_every_response",
        "test_blank_header_is_not_sent",
    ],
    "http_server_config.headers.X-Frame-Options": [
        "test_headers_on_every_response",
        "test_client_allowed_sans",
        "test_reload_users_headers_rate_limit",
    ],
    "http_server_config.headers.X-Content-Type-Options": ["test_headers_on_every_response"],
    "http_server_config.headers.X-XSS-Protection": ["test_headers_on_every_response"],
    "http_server_config.headers.Strict-Transport-Security": ["test_headers_on_every_response"],
    "basic_auth_users": [
        "test_basic_auth_and_open_probes",
        "test_protect_health",
        "test_reload_users_headers_rate_limit",
    ],
    "rate_limit.interval": ["test_rate_limit", "test_rate_limit_refills"],
    "rate_limit.burst": ["test_rate_limit", "test_rate_limit_refills"],
}

_MTLS = ("client_auth_type: RequireAndVerifyClientCert", "client_ca_file: ca.crt")

# What is refused, with the field (and the way out) the one line must name.
REFUSED = {
    "unknown top-level field": ("web_server_config: {}\n", "unknown field 'web_server_config'"),
    "unknown TLS field": (tls_config("client_cas: x"), "'tls_server_config.client_cas'"),
    "unknown header": (
        "http_server_config:\n  headers:\n    Server: x\n",
        "'http_server_config.headers.Server'",
    ),
    "unknown rate_limit field": ("rate_limit:\n  every: 1s\n", "'rate_limit.every'"),
    "duplicate key": (
        tls_config(*_MTLS, "client_auth_type: NoClientCert"),
        "'client_auth_type' is given twice",
    ),
    "TLS field without TLS": (
        "tls_server_config:\n  min_version: TLS13\n",
        "min_version is set but TLS is off",
    ),
    "no cert": ("tls_server_config:\n  key_file: s.key\n", "missing one of cert or cert_file"),
    "no key": ("tls_server_config:\n  cert_file: s.crt\n", "missing one of key or key_file"),
    "cert and cert_file": (tls_config("cert: x"), "give cert or cert_file, not both"),
    "key and key_file": (tls_config("key: x"), "give key or key_file, not both"),
    "client_ca and client_ca_file": (
        tls_config(*_MTLS, "client_ca: x"),
        "give client_ca or client_ca_file, not both",
    ),
    "RequestClientCert": (tls_config("client_auth_type: RequestClientCert"), "use NoClientCert"),
    "RequireAnyClientCert": (
        tls_config("client_auth_type: RequireAnyClientCert"),
        "nearest safe mode is RequireAndVerifyClientCert",
    ),
    "RequireClientCert": (
        tls_config("client_auth_type: RequireClientCert"),
        "nearest safe mode is RequireAndVerifyClientCert",
    ),
    "unknown client_auth_type": (tls_config("client_auth_type: Maybe"), "client_auth_type 'Maybe'"),
    "verification without a CA": (
        tls_config("client_auth_type: RequireAndVerifyClientCert"),
        "client_ca_file is required with RequireAndVerifyClientCert",
    ),
    "verify-if-given without a CA": (
        tls_config("client_auth_type: VerifyClientCertIfGiven"),
        "client_ca_file is required with VerifyClientCertIfGiven",
    ),
    "CA without client auth": (
        tls_config("client_ca_file: ca.crt"),
        "client_ca_file is set but client_auth_type is NoClientCert",
    ),
    "SANs without client auth": (
        tls_config("client_allowed_sans: [prometheus.example]"),
        "client_allowed_sans needs verified client certificates",
    ),
    "empty SAN list": (
        tls_config(*_MTLS, "client_allowed_sans: []"),
        "client_allowed_sans is empty",
    ),
    "min_version TLS10": (
        tls_config("min_version: TLS10"),
        "min_version TLS10: TLS 1.0 and 1.1 are refused",
    ),
    "min_version TLS11": (
        tls_config("min_version: TLS11"),
        "min_version TLS11: TLS 1.0 and 1.1 are refused",
    ),
    "max_version TLS11": (
        tls_config("max_version: TLS11"),
        "max_version TLS11: TLS 1.0 and 1.1 are refused",
    ),
    "max below min": (
        tls_config("min_version: TLS13", "max_version: TLS12"),
        "max_version TLS12 is below min_version TLS13",
    ),
    "TLS 1.3 suite": (
        tls_config("cipher_suites: [TLS_AES_128_GCM_SHA256]"),
        "TLS_AES_128_GCM_SHA256 is a TLS 1.3 suite",
    ),
    "insecure suite": (
        tls_config("cipher_suites: [TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA]"),
        "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA is insecure",
    ),
    "RSA key exchange": (
        tls_config("cipher_suites: [TLS_RSA_WITH_AES_128_GCM_SHA256]"),
        "is insecure",
    ),
    "unknown suite": (tls_config("cipher_suites: [AES128-SHA]"), "unknown suite 'AES128-SHA'"),
    "several curves": (
        tls_config("curve_preferences: [X25519, CurveP256]"),
        "curve_preferences: Python's ssl can restrict the key exchange to one curve only",
    ),
    "unknown curve": (tls_config("curve_preferences: [P256]"), "unknown curve 'P256'"),
    "prefer not a bool": (
        tls_config("prefer_server_cipher_suites: 'yes'"),
        "must be true or false",
    ),
    "http2 with TLS": (
        tls_config() + "http_server_config:\n  http2: true\n",
        "http2: true cannot be honoured",
    ),
    "X-Frame-Options value": (
        "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
        "X-Frame-Options 'allow' is not one of deny, sameorigin",
    ),
    "X-Content-Type-Options value": (
        "http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n",
        "X-Content-Type-Options 'sniff' is not one of nosniff",
    ),
    "burst 0": (
        "rate_limit:\n  interval: 1s\n  burst: 0\n",
        "rate_limit.burst must be a whole number of at least 1",
    ),
    "burst without interval": (
        "rate_limit:\n  burst: 3\n",
        "rate_limit.burst is set but rate_limit.interval is 0 or missing",
    ),
    "burst with interval 0": (
        "rate_limit:\n  interval: 0s\n  burst: 3\n",
        "rate_limit.interval is 0 or missing",
    ),
    "bad interval": ("rate_limit:\n  interval: 1x\n  burst: 1\n", "rate_limit.interval"),
    "plain-text password": (
        "basic_auth_users:\n  u: plaintext\n",
        "basic_auth_users.u: not a bcrypt hash",
    ),
}


def test_fields_are_exporter_toolkits() -> None:
    assert {f.name for f in websec.FIELDS} == EXPORTER_TOOLKIT_FIELDS
    assert len(websec.FIELDS) == len(EXPORTER_TOOLKIT_FIELDS)  # none listed twice
    headers = {f.name.rsplit(".", 1)[1] for f in websec.FIELDS if ".headers." in f.name}
    assert headers == set(websec.HEADERS)


def _client_tests() -> ModuleType:
    """tests/server/test_websec.py, the tests against real clients, as a module."""
    path = Path(__file__).with_name("test_websec.py")
    spec = importlib.util.spec_from_file_location("websec_client_tests", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_field_is_exercised() -> None:
    """Each known field names tests that exist and are about it; a new field without one fails."""
    assert set(EXERCISED) == {f.name for f in websec.FIELDS}
    test_websec = _client_tests()
    source = Path(__file__).with_name("test_websec.py").read_text(encoding="utf-8")
    source += Path(support.tls.__file__).read_text(encoding="utf-8")
    for name, tests in EXERCISED.items():
        assert tests, name
        for test in tests:
            assert callable(getattr(test_websec, test, None)), f"{name}: no test {test}"
        assert name.rsplit(".", 1)[-1] in source, name


@pytest.mark.parametrize(("text", "message"), list(REFUSED.values()), ids=list(REFUSED))
def test_refused_at_start(tmp_path: Path, text: str, message: str) -> None:
    """Exit 2, one line naming the field, no traceback, no port opened."""
    line = refused_at_start(tmp_path, text)
    assert message in line


def test_refused_on_reload_keeps_the_old(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The same refusals on reload: logged with the same line, the old config stays whole."""
    config = tmp_path / "web.yml"
    config.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    security = websec.WebSecurity(config)
    before = security.config
    for text, message in REFUSED.values():
        caplog.clear()
        tmp = tmp_path / "next.yml"
        tmp.write_text(text)
        tmp.replace(config)  # a new inode: always seen as a change
        with caplog.at_level(logging.ERROR, logger="exporter.server.websec"):
            security.maybe_reload()
        assert security.config is before, message
        assert any(message in r.getMessage() for r in caplog.records), (message, caplog.text)


ODD_VALUES = [None, 0, 1, -1, 1.5, True, "", "x", "TLS12", [], ["x"], [1], [[]], {}, {"a": 1}]


def _nest(name: str, value: object) -> dict[str, object]:
    """{a: {b: value}} for "a.b"; a header name stays one key."""
    parts = name.split(".", 2) if ".headers." in name else name.split(".")
    for part in reversed(parts):
        value = {part: value}
    assert isinstance(value, dict)
    return value


SECTIONS = ["tls_server_config", "http_server_config", "http_server_config.headers", "rate_limit"]


@pytest.mark.parametrize("name", SECTIONS + [f.name for f in websec.FIELDS])
def test_odd_values_are_refused_in_one_line(tmp_path: Path, name: str) -> None:
    """Any YAML value in any field, with or without TLS switched on: a config, or one line."""
    config = tmp_path / "web.yml"
    for value in ODD_VALUES:
        for base in ({}, {"tls_server_config": {"cert_file": "s.crt", "key_file": "s.key"}}):
            data = _nest(name, value)
            merged = {**base, **data}
            tls = data.get("tls_server_config")
            if base and isinstance(tls, dict):  # the field next to cert_file and key_file
                merged["tls_server_config"] = {**base["tls_server_config"], **tls}
            config.write_text(yaml.safe_dump(merged))
            try:
                websec.read_web_config(config)
            except ConfigError as err:
                assert "\n" not in str(err)


def test_docs_list_every_field() -> None:
    """SECURITY.md and docs/deployment.md carry the table rendered from websec.FIELDS."""
    generated = docgen.generated()
    for doc in ("SECURITY.md", "docs/deployment.md"):
        path = ROOT / doc
        assert path.read_text(encoding="utf-8") == generated[path], f"{doc}: run docgen"
    root = ROOT
    for doc in ("SECURITY.md", "docs/deployment.md"):
        text = (root / doc).read_text(encoding="utf-8")
        for f in websec.FIELDS:
            assert f"| `{f.name}` |" in text, (doc, f.name)
