"""A throwaway PKI, TLS clients and CLI helpers for the web config tests.

Everything is generated per test (EC P-256 keys, one-day certificates); the clients talk only
to 127.0.0.1.
"""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import os
import ssl
import subprocess
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from support.paths import FIXTURES, ROOT, TRACE
from support.process import ExporterProcess

BASE = [
    "--gpu.replay-file",
    str(TRACE),
    "--path.procfs",
    str(FIXTURES / "proc" / "two-cpu"),
    "--no-collector.engine",
    "--no-collector.tokenizer",
    "--no-collector.process",
]
SERVER_AUTH = ExtendedKeyUsageOID.SERVER_AUTH
CLIENT_AUTH = ExtendedKeyUsageOID.CLIENT_AUTH
REFUSED = "refused"  # the TLS handshake (or the connection) was refused

# The client certificates, by name: (subject alternative names, issuing CA).
CLIENTS: dict[str, tuple[list[x509.GeneralName], str]] = {
    "client": ([x509.DNSName("prometheus.example")], "ca"),
    "intruder": ([x509.DNSName("intruder.example")], "ca"),
    "ip-client": ([x509.IPAddress(ipaddress.ip_address("2001:db8::7"))], "ca"),
    "mail-client": ([x509.RFC822Name("scraper@example.com")], "ca"),
    "uri-client": (
        [x509.UniformResourceIdentifier("spiffe://cluster.local/ns/monitoring/sa/prometheus")],
        "ca",
    ),
    # the right SAN, the wrong CA
    "stranger": ([x509.DNSName("prometheus.example")], "other-ca"),
}


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    sans: Sequence[x509.GeneralName] = (),
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = (issuer[0].subject, issuer[1]) if issuer else (name, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


class Pki:
    """Files under ``root``: ``ca.crt``, ``other-ca.crt``, ``server.crt``/``.key`` (for
    127.0.0.1), ``server2.crt``/``.key`` (another one, for rotation), ``chain.crt`` (server
    leaf + intermediate, ``chain.key``) and a ``<name>.crt``/``.key`` per entry of CLIENTS."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.keys: dict[str, ec.EllipticCurvePrivateKey] = {}
        self.certs: dict[str, x509.Certificate] = {}
        for ca in ("ca", "other-ca"):
            self._add(ca, make_cert(f"test {ca}", self._key(ca), None, ca=True))
        server_sans = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        for server in ("server", "server2"):
            cert = make_cert(
                server, self._key(server), self._issuer("ca"), sans=server_sans, usage=SERVER_AUTH
            )
            self._add(server, cert)
        inter = make_cert("test intermediate", self._key("inter"), self._issuer("ca"), ca=True)
        self._add("inter", inter)
        leaf = make_cert(
            "chain", self._key("chain"), self._issuer("inter"), sans=server_sans, usage=SERVER_AUTH
        )
        self._add("chain", leaf)
        (root / "chain.crt").write_bytes(_pem(leaf) + _pem(inter))
        for client, (sans, issuer) in CLIENTS.items():
            key = self._key(client)
            cert = make_cert(client, key, self._issuer(issuer), sans=sans, usage=CLIENT_AUTH)
            self._add(client, cert)

    def _key(self, name: str) -> ec.EllipticCurvePrivateKey:
        key = ec.generate_private_key(ec.SECP256R1())
        self.keys[name] = key
        (self.root / f"{name}.key").write_bytes(_key_pem(key))
        return key

    def _issuer(self, name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        return self.certs[name], self.keys[name]

    def _add(self, name: str, cert: x509.Certificate) -> None:
        self.certs[name] = cert
        (self.root / f"{name}.crt").write_bytes(_pem(cert))

    def der(self, name: str) -> bytes:
        return self.certs[name].public_bytes(serialization.Encoding.DER)

    def client(
        self,
        cert: str | None = None,
        *,
        ca: str = "ca",
        min_version: ssl.TLSVersion | None = None,
        max_version: ssl.TLSVersion | None = None,
        ciphers: str | None = None,
    ) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.root / f"{ca}.crt"))
        if cert is not None:
            context.load_cert_chain(self.root / f"{cert}.crt", self.root / f"{cert}.key")
        if min_version is not None:
            context.minimum_version = min_version
        if max_version is not None:
            context.maximum_version = max_version
        if ciphers is not None:
            context.set_ciphers(ciphers)
        return context


def tls11_client(pki: Pki) -> ssl.SSLContext:
    """A client that offers TLS 1.1 only (OpenSSL 3 needs security level 0 for it)."""
    context = pki.client()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # ssl.TLSVersion.TLSv1_1 itself
        context.minimum_version = ssl.TLSVersion.TLSv1_1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    version: str  # the TLS version
    cipher: str


def call(
    proc: ExporterProcess,
    path: str,
    context: ssl.SSLContext,
    headers: dict[str, str] | None = None,
) -> Reply | str:
    """One HTTPS request on a new connection: the reply, or REFUSED."""
    port = proc.base.rsplit(":", 1)[1]
    conn = http.client.HTTPSConnection("127.0.0.1", int(port), context=context, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        body = response.read()
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        cipher = sock.cipher()
        return Reply(
            response.status,
            dict(response.getheaders()),
            body,
            str(sock.version()),
            cipher[0] if cipher else "",
        )
    except (ssl.SSLError, ConnectionError):
        return REFUSED
    finally:
        conn.close()


def status(proc: ExporterProcess, path: str, context: ssl.SSLContext) -> int | str:
    reply = call(proc, path, context)
    return reply if isinstance(reply, str) else reply.status


def write_atomically(path: Path, text: str) -> None:
    """Replace the file in one step, as Kubernetes updates a mounted Secret."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def start(
    exporter_process: Callable[..., ExporterProcess],
    config: Path,
    text: str,
    *args: str,
) -> ExporterProcess:
    config.write_text(text)
    proc = exporter_process("--web.config.file", str(config), *args, *BASE)
    proc.wait_for(lambda: proc._port is not None, timeout=30)
    return proc


def tls_config(*lines: str, cert: str = "server") -> str:
    """A tls_server_config block with the test server certificate and ``lines`` under it."""
    body = "".join(f"  {line}\n" for line in lines)
    return f"tls_server_config:\n  cert_file: {cert}.crt\n  key_file: {cert}.key\n{body}"


def refused_at_start(tmp_path: Path, text: str) -> str:
    """Start the CLI with this web config; assert exit 2 with one line and no traceback, and
    return that line."""
    config = tmp_path / "refused.yml"
    config.write_text(text)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "--web.listen-address",
            "127.0.0.1:0",
            "--web.config.file",
            str(config),
            *BASE,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("inference-bottleneck-exporter: error: --web.config.file: ")
    return lines[0]
