"""TLS and basic auth with a real TLS client against the real CLI process."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.paths import FIXTURES, TRACE
from support.process import ExporterProcess

from exporter.config import ConfigError
from exporter.server.websec import WebSecurity, parse_web_config

BASE = [
    "--gpu.replay-file",
    str(TRACE),
    "--path.procfs",
    str(FIXTURES / "proc" / "two-cpu"),
    "--no-collector.engine",
    "--no-collector.tokenizer",
    "--no-collector.process",
]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


class Pki:
    """A CA, a server certificate for 127.0.0.1, a client certificate, and a stranger CA."""

    def __init__(self, root: Path) -> None:
        self.root = root
        ca_key, other_key = _key(), _key()
        ca = _cert("test-ca", ca_key, None, ca=True)
        other = _cert("other-ca", other_key, None, ca=True)
        server_key, client_key = _key(), _key()
        server = _cert("127.0.0.1", server_key, ("test-ca", ca_key), server=True)
        client = _cert("prometheus", client_key, ("test-ca", ca_key))
        for name, cert in (("ca", ca), ("other-ca", other), ("server", server), ("client", client)):
            (root / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(server_key, root / "server.key")
        _write_key(client_key, root / "client.key")

    def client_context(self, ca: str = "ca", with_cert: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.root / f"{ca}.crt"))
        if with_cert:
            context.load_cert_chain(self.root / "client.crt", self.root / "client.key")
        return context


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()


def get(
    url: str, context: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None
) -> int:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def https(proc: ExporterProcess, path: str) -> str:
    return proc.base.replace("http://", "https://") + path


def wait_listening(proc: ExporterProcess) -> None:
    proc.wait_for(lambda: proc._port is not None, timeout=20)


def test_tls_with_the_right_ca_and_only_with_it(
    pki: Pki, tmp_path: Path, exporter_process: Callable[..., ExporterProcess]
) -> None:
    config = tmp_path / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    proc = exporter_process("--web.config.file", str(config), *BASE)
    wait_listening(proc)
    assert any("(https," in e["msg"] for e in proc.logs)
    url = https(proc, "/metrics")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and get(https(proc, "/-/ready"), pki.client_context()) != 200:
        time.sleep(0.1)
    assert get(url, pki.client_context()) == 200
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        get(url, pki.client_context("other-ca"))
    # plain HTTP on the TLS port gets no metrics
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        get(proc.base + "/metrics")


def test_client_certificates_required(
    pki: Pki, tmp_path: Path, exporter_process: Callable[..., ExporterProcess]
) -> None:
    config = tmp_path / "web.yml"
    config.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
        "  min_version: TLS13\n"
    )
    proc = exporter_process("--web.config.file", str(config), *BASE)
    wait_listening(proc)
    url = https(proc, "/metrics")
    proc.wait_for(lambda: get(url, pki.client_context(with_cert=True)) == 200)
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        get(url, pki.client_context())
    old = pki.client_context(with_cert=True)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        get(url, old)


def test_basic_auth_and_open_probes(
    tmp_path: Path, exporter_process: Callable[..., ExporterProcess]
) -> None:
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    proc = exporter_process("--web.config.file", str(config), *BASE)
    proc.wait_ready()  # probes need no password
    url = proc.base + "/metrics"
    assert get(url) == 401
    assert get(url, auth=("prometheus", "s3cret")) == 200
    assert get(url, auth=("prometheus", "wrong")) == 401
    assert get(url, auth=("nobody", "s3cret")) == 401
    # CVE-2022-46146: the stored hash is not a password, also not after a cached success
    assert get(url, auth=("prometheus", HASH)) == 401
    assert get(url, auth=("prometheus", "s3cret")) == 200
    assert get(url, auth=("prometheus", "s3cret ")) == 401
    assert get(proc.base + "/-/healthy") == 200
    # the file is re-read when it changes: a new user works, the old one no longer does
    new_hash = bcrypt.hashpw(b"other", bcrypt.gensalt(4)).decode()
    time.sleep(0.05)
    config.write_text(f"basic_auth_users:\n  scraper: '{new_hash}'\n")
    proc.wait_for(lambda: get(url, auth=("scraper", "other")) == 200)
    assert get(url, auth=("prometheus", "s3cret")) == 401
    # a broken new version keeps the previous one in force
    config.write_text("basic_auth_users: [\n")
    assert get(url, auth=("scraper", "other")) == 200
    # the log line arrives through the process's stderr, read by another thread
    proc.wait_for(lambda: any("not reloaded" in e["msg"] for e in proc.logs), timeout=10)


def test_protect_health(tmp_path: Path, exporter_process: Callable[..., ExporterProcess]) -> None:
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    proc = exporter_process("--web.config.file", str(config), "--web.protect-health", *BASE)
    wait_listening(proc)
    assert get(proc.base + "/-/healthy") == 401
    assert get(proc.base + "/-/healthy", auth=("prometheus", "s3cret")) == 200


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope: 1\n", "unknown field 'nope'"),
        ("tls_server_config:\n  cert_file: x.crt\n  key_file: x.key\n", "TLS certificate or key"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: Maybe\n",
            "client_auth_type 'Maybe'",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n",
            "client_ca_file is required",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS10\n",
            "min_version 'TLS10'",
        ),
        ("basic_auth_users:\n  u: plaintext\n", "basic_auth_users.u: not a bcrypt hash"),
        ("basic_auth_users: [1]\n", "basic_auth_users must map"),
    ],
)
def test_bad_web_config(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "web.yml"
    config.write_text(text)
    with pytest.raises(ConfigError) as info:
        parse_web_config(config)
    assert message in str(info.value)
    assert str(info.value).startswith("--web.config.file: ")


def test_auth_cache_never_admits_a_wrong_password(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    security = WebSecurity(config)

    def header(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    assert security.check(header("prometheus", "s3cret")) == "prometheus"
    assert security.check(header("prometheus", "s3cret")) == "prometheus"  # cached
    assert security.check(header("prometheus", "S3cret")) is None
    assert security.check(header("prometheus", HASH)) is None
    assert security.check("Basic !!!") is None
    assert security.check("Bearer x") is None
    assert security.check(None) is None
