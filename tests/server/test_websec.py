"""The web config against the real CLI process, with real TLS clients: Python's ssl, curl and
openssl s_client. Each test lets in the client that should get in and shows that every client
that should not is refused, by connecting."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest
from support.process import ExporterProcess
from support.tls import (
    REFUSED,
    Pki,
    Reply,
    call,
    refused_at_start,
    start,
    status,
    tls11_client,
    tls_config,
    write_atomically,
)

from exporter.config import ConfigError
from exporter.server.websec import WebSecurity, parse_web_config, read_web_config

Start = Callable[..., ExporterProcess]
HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
TLS12 = ssl.TLSVersion.TLSv1_2
TLS13 = ssl.TLSVersion.TLSv1_3


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return tmp_path / "web.yml"


def get(url: str, auth: tuple[str, str] | None = None) -> int:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def reply(proc: ExporterProcess, path: str, context: ssl.SSLContext) -> Reply:
    result = call(proc, path, context)
    assert isinstance(result, Reply), f"{path}: {result}"
    return result


def curl(proc: ExporterProcess, pki: Pki, *args: str, path: str = "/metrics") -> tuple[int, str]:
    """curl's exit code and the HTTP status it printed."""
    port = proc.base.rsplit(":", 1)[1]
    result = subprocess.run(
        [
            "curl",
            "-sS",
            "--max-time",
            "10",
            "--cacert",
            str(pki.root / "ca.crt"),
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            *args,
            f"https://127.0.0.1:{port}{path}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.returncode, result.stdout


def client_cert_args(pki: Pki, name: str) -> list[str]:
    return ["--cert", str(pki.root / f"{name}.crt"), "--key", str(pki.root / f"{name}.key")]


def s_client(proc: ExporterProcess, pki: Pki, *args: str) -> tuple[int, str]:
    """openssl s_client: a handshake and nothing else; exit code and output."""
    port = proc.base.rsplit(":", 1)[1]
    result = subprocess.run(
        [
            "openssl",
            "s_client",
            "-connect",
            f"127.0.0.1:{port}",
            "-CAfile",
            str(pki.root / "ca.crt"),
            "-verify_return_error",
            *args,
        ],
        input="",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.returncode, result.stdout


def handshake_error(proc: ExporterProcess, context: ssl.SSLContext) -> str:
    """The error a bare handshake ends in ('' if it succeeds)."""
    port = int(proc.base.rsplit(":", 1)[1])
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
            context.wrap_socket(sock, server_hostname="127.0.0.1"),
        ):
            return ""
    except ssl.SSLError as err:
        return str(err.reason)
    except ConnectionError as err:
        return type(err).__name__


# --- server certificate, versions, NoClientCert -----------------------------------------------
def test_tls_defaults_and_no_client_cert(pki: Pki, config: Path, exporter_process: Start) -> None:
    proc = start(exporter_process, config, tls_config("client_auth_type: NoClientCert"))
    assert any("(https," in e["msg"] for e in proc.logs)
    ok = reply(proc, "/metrics", pki.client())
    assert ok.status == 200 and b"inference_exporter_build_info" in ok.body
    assert ok.version == "TLSv1.3"
    # NoClientCert: a client certificate is neither asked for nor needed
    assert status(proc, "/metrics", pki.client("stranger")) == 200
    assert curl(proc, pki) == (0, "200")
    # the client checks the server: a client trusting another CA refuses it
    assert handshake_error(proc, pki.client(ca="other-ca")) == "CERTIFICATE_VERIFY_FAILED"
    # TLS 1.2 at defaults: forward secrecy and AEAD only, no CBC-SHA1 suite
    tls12 = reply(proc, "/metrics", pki.client(max_version=TLS12))
    assert (tls12.version, tls12.cipher) == ("TLSv1.2", "ECDHE-ECDSA-AES128-GCM-SHA256")
    cbc = pki.client(max_version=TLS12, ciphers="ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA")
    assert status(proc, "/metrics", cbc) == REFUSED
    # TLS 1.1 is offered by the client (a ClientHello goes out) and refused by the server
    assert handshake_error(proc, tls11_client(pki)) in {
        "UNEXPECTED_EOF_WHILE_READING",
        "TLSV1_ALERT_PROTOCOL_VERSION",
    }
    code, out = s_client(proc, pki, "-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0")
    assert code != 0 and "Cipher is (NONE)" in out
    # plain HTTP on the TLS port gets no metrics
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        get(proc.base + "/metrics")


def test_min_version_tls13(pki: Pki, config: Path, exporter_process: Start) -> None:
    proc = start(exporter_process, config, tls_config("min_version: TLS13"))
    assert reply(proc, "/metrics", pki.client()).version == "TLSv1.3"
    assert status(proc, "/metrics", pki.client(max_version=TLS12)) == REFUSED
    assert curl(proc, pki, "--tls-max", "1.2")[0] != 0


def test_max_version_tls12(pki: Pki, config: Path, exporter_process: Start) -> None:
    proc = start(exporter_process, config, tls_config("max_version: TLS12"))
    assert reply(proc, "/metrics", pki.client()).version == "TLSv1.2"
    assert status(proc, "/metrics", pki.client(min_version=TLS13)) == REFUSED
    assert curl(proc, pki, "--tlsv1.3")[0] != 0


def test_inline_cert_key_and_client_ca(pki: Pki, config: Path, exporter_process: Start) -> None:
    def block(name: str) -> str:
        return "|\n" + "".join(
            f"    {line}\n" for line in (pki.root / name).read_text().splitlines()
        )

    text = (
        "tls_server_config:\n"
        f"  cert: {block('server.crt')}"
        f"  key: {block('server.key')}"
        f"  client_ca: {block('ca.crt')}"
        "  client_auth_type: RequireAndVerifyClientCert\n"
    )
    proc = start(exporter_process, config, text)
    assert status(proc, "/metrics", pki.client("client")) == 200
    assert status(proc, "/metrics", pki.client()) == REFUSED
    assert status(proc, "/metrics", pki.client("stranger")) == REFUSED
    port = int(proc.base.rsplit(":", 1)[1])
    served = ssl.get_server_certificate(("127.0.0.1", port))
    assert ssl.PEM_cert_to_DER_cert(served) == pki.der("server")


# --- client_auth_type ----------------------------------------------------------------------------
def test_verify_client_cert_if_given(pki: Pki, config: Path, exporter_process: Start) -> None:
    text = tls_config("client_auth_type: VerifyClientCertIfGiven", "client_ca_file: ca.crt")
    proc = start(exporter_process, config, text)
    assert status(proc, "/metrics", pki.client()) == 200  # no certificate: let in
    assert status(proc, "/metrics", pki.client("client")) == 200
    assert status(proc, "/metrics", pki.client("stranger")) == REFUSED  # given, so verified
    assert status(proc, "/metrics", pki.client("stranger", max_version=TLS12)) == REFUSED
    assert curl(proc, pki) == (0, "200")
    assert curl(proc, pki, *client_cert_args(pki, "client")) == (0, "200")
    assert curl(proc, pki, *client_cert_args(pki, "stranger"))[0] != 0


def test_require_and_verify_client_cert(pki: Pki, config: Path, exporter_process: Start) -> None:
    text = tls_config("client_auth_type: RequireAndVerifyClientCert", "client_ca_file: ca.crt")
    proc = start(exporter_process, config, text)
    for version in (TLS12, TLS13):
        assert status(proc, "/metrics", pki.client("client", max_version=version)) == 200
        assert status(proc, "/metrics", pki.client(max_version=version)) == REFUSED
        assert status(proc, "/metrics", pki.client("stranger", max_version=version)) == REFUSED
    assert curl(proc, pki, *client_cert_args(pki, "client")) == (0, "200")
    assert curl(proc, pki)[0] != 0
    assert curl(proc, pki, *client_cert_args(pki, "stranger"))[0] != 0


@pytest.mark.parametrize(
    ("mode", "nearest"),
    [
        (
            "RequestClientCert",
            "use NoClientCert (the same access: anyone) or VerifyClientCertIfGiven",
        ),
        ("RequireAnyClientCert", "nearest safe mode is RequireAndVerifyClientCert"),
        ("RequireClientCert", "nearest safe mode is RequireAndVerifyClientCert"),
    ],
)
def test_unverified_client_auth_types_refused(tmp_path: Path, mode: str, nearest: str) -> None:
    line = refused_at_start(
        tmp_path, tls_config(f"client_auth_type: {mode}", "client_ca_file: ca.crt")
    )
    assert f"client_auth_type {mode}" in line and nearest in line


# --- client_allowed_sans --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("san", "client"),
    [
        ("prometheus.example", "client"),  # DNS
        ("2001:db8::7", "ip-client"),  # IP, written as Go writes it
        ("scraper@example.com", "mail-client"),  # e-mail
        ("spiffe://cluster.local/ns/monitoring/sa/prometheus", "uri-client"),  # URI
    ],
)
def test_client_allowed_sans(
    pki: Pki, config: Path, exporter_process: Start, san: str, client: str
) -> None:
    text = (
        tls_config(
            "client_auth_type: RequireAndVerifyClientCert",
            "client_ca_file: ca.crt",
            f"client_allowed_sans: ['{san}', other.example]",
        )
        + "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    )
    proc = start(exporter_process, config, text)
    assert status(proc, "/metrics", pki.client(client)) == 200
    for other in ("client", "intruder", "ip-client", "mail-client", "uri-client"):
        if other == client:
            continue
        for path in ("/metrics", "/-/healthy"):
            refused = reply(proc, path, pki.client(other))
            assert refused.status == 403, (other, path)
            assert b"inference_" not in refused.body
            assert refused.headers["X-Frame-Options"] == "deny"
    assert status(proc, "/metrics", pki.client("stranger")) == REFUSED  # right SAN, wrong CA
    if client == "client":
        assert curl(proc, pki, *client_cert_args(pki, "client")) == (0, "200")
        assert curl(proc, pki, *client_cert_args(pki, "intruder")) == (0, "403")


def test_client_allowed_sans_with_verify_if_given(
    pki: Pki, config: Path, exporter_process: Start
) -> None:
    text = tls_config(
        "client_auth_type: VerifyClientCertIfGiven",
        "client_ca_file: ca.crt",
        "client_allowed_sans: [prometheus.example]",
    )
    proc = start(exporter_process, config, text)
    assert status(proc, "/metrics", pki.client("client")) == 200
    assert status(proc, "/metrics", pki.client()) == 403  # no certificate, no allowed SAN
    assert status(proc, "/metrics", pki.client("intruder")) == 403
    assert status(proc, "/metrics", pki.client("stranger")) == REFUSED


# --- cipher_suites, prefer_server_cipher_suites, curve_preferences ---------------------------------
def test_cipher_suites(pki: Pki, config: Path, exporter_process: Start) -> None:
    text = tls_config("cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]")
    proc = start(exporter_process, config, text)
    only_128 = pki.client(max_version=TLS12, ciphers="ECDHE-ECDSA-AES128-GCM-SHA256")
    assert status(proc, "/metrics", only_128) == REFUSED
    both = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384"
    assert reply(proc, "/metrics", pki.client(max_version=TLS12, ciphers=both)).cipher == (
        "ECDHE-ECDSA-AES256-GCM-SHA384"
    )
    assert curl(proc, pki, "--tls-max", "1.2", "--ciphers", "ECDHE-ECDSA-AES128-GCM-SHA256")[0] != 0
    assert curl(proc, pki, "--tls-max", "1.2") == (0, "200")
    # TLS 1.3 suites are not configurable, as in Go
    assert reply(proc, "/metrics", pki.client()).cipher.startswith("TLS_AES_")


def test_cbc_suite_only_when_listed(pki: Pki, config: Path, exporter_process: Start) -> None:
    text = tls_config("cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA]")
    proc = start(exporter_process, config, text)
    cbc = pki.client(max_version=TLS12, ciphers="ECDHE-ECDSA-AES128-SHA")
    assert reply(proc, "/metrics", cbc).cipher == "ECDHE-ECDSA-AES128-SHA"
    gcm = pki.client(max_version=TLS12, ciphers="ECDHE-ECDSA-AES128-GCM-SHA256")
    assert status(proc, "/metrics", gcm) == REFUSED


@pytest.mark.parametrize(
    ("prefer", "chosen"),
    [
        (None, "ECDHE-ECDSA-AES256-GCM-SHA384"),  # default true: the server's order
        ("true", "ECDHE-ECDSA-AES256-GCM-SHA384"),
        ("false", "ECDHE-ECDSA-AES128-GCM-SHA256"),  # the client's order
    ],
)
def test_prefer_server_cipher_suites(
    pki: Pki, config: Path, exporter_process: Start, prefer: str | None, chosen: str
) -> None:
    lines = [
        "cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, "
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]"
    ]
    if prefer is not None:
        lines.append(f"prefer_server_cipher_suites: {prefer}")
    proc = start(exporter_process, config, tls_config(*lines))
    client_order = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384"
    client = pki.client(max_version=TLS12, ciphers=client_order)
    assert reply(proc, "/metrics", client).cipher == chosen


# Go's curve name: (OpenSSL's group name for -groups, how s_client reports it)
CURVES = {"CurveP384": ("P-384", "ECDH, secp384r1"), "X25519": ("X25519", "X25519")}


@pytest.mark.parametrize(
    ("curve", "other"), [("CurveP384", "X25519:P-256"), ("X25519", "P-256:P-384")]
)
def test_curve_preferences(
    pki: Pki, config: Path, exporter_process: Start, curve: str, other: str
) -> None:
    proc = start(exporter_process, config, tls_config(f"curve_preferences: [{curve}]"))
    group, reported = CURVES[curve]
    for version in ("-tls1_2", "-tls1_3"):
        code, out = s_client(proc, pki, version, "-groups", f"{other}:{group}")
        assert code == 0, out
        assert f"Server Temp Key: {reported}," in out
        code, out = s_client(proc, pki, version, "-groups", other)
        assert code != 0 and "Cipher is (NONE)" in out


def test_curve_default_is_openssls(pki: Pki, config: Path, exporter_process: Start) -> None:
    proc = start(exporter_process, config, tls_config())
    for group, name in (
        ("X25519", "X25519"),
        ("P-256", "ECDH, prime256v1"),
        ("P-384", "ECDH, secp384r1"),
    ):
        code, out = s_client(proc, pki, "-tls1_3", "-groups", group)
        assert code == 0 and f"Server Temp Key: {name}" in out


# --- http_server_config ---------------------------------------------------------------------------
ALL_HEADERS = {
    "Strict-Transport-Security": "max-age=31536000; includeSubDomains",
    "Content-Security-Policy": "default-src 'none'",
    "X-Frame-Options": "sameorigin",
    "X-Content-Type-Options": "nosniff",
    "X-XSS-Protection": "1; mode=block",
}


def _headers_yaml(headers: dict[str, str]) -> str:
    return "".join(f'    {k}: "{v}"\n' for k, v in headers.items())


def test_headers_on_every_response(config: Path, exporter_process: Start) -> None:
    text = (
        f"basic_auth_users:\n  prometheus: '{HASH}'\n"
        f"http_server_config:\n  http2: true\n  headers:\n{_headers_yaml(ALL_HEADERS)}"
    )
    proc = start(exporter_process, config, text)
    proc.wait_ready()
    token = "Basic " + base64.b64encode(b"prometheus:s3cret").decode()
    cases = [
        ("/metrics", {"Authorization": token}, 200),
        ("/", {"Authorization": token}, 200),
        ("/metrics", {}, 401),
        ("/nope", {"Authorization": token}, 404),
        ("/nope", {}, 401),
        ("/-/healthy", {}, 200),
        ("/-/ready", {}, 200),
    ]
    for path, headers, expected in cases:
        code, got, _ = proc.get(path, headers=headers)
        assert code == expected, path
        for name, value in ALL_HEADERS.items():
            assert got.get(name) == value, (path, name)
    # http2: true without TLS is HTTP/1.1 in exporter-toolkit too
    conn = http.client.HTTPConnection("127.0.0.1", int(proc.base.rsplit(":", 1)[1]), timeout=10)
    conn.request("GET", "/-/healthy")
    assert conn.getresponse().version == 11
    conn.close()


def test_blank_header_is_not_sent(config: Path, exporter_process: Start) -> None:
    text = "http_server_config:\n  headers:\n    Content-Security-Policy: ''\n    X-Frame-Options: deny\n"
    proc = start(exporter_process, config, text)
    _, headers, _ = proc.get("/-/healthy")
    assert headers["X-Frame-Options"] == "deny"
    assert "Content-Security-Policy" not in headers


def test_http2_false_with_tls(pki: Pki, config: Path, exporter_process: Start) -> None:
    proc = start(exporter_process, config, tls_config() + "http_server_config:\n  http2: false\n")
    context = pki.client()
    context.set_alpn_protocols(["h2", "http/1.1"])
    port = int(proc.base.rsplit(":", 1)[1])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.selected_alpn_protocol() is None  # no h2 offered back
    assert curl(proc, pki, "--http2") == (0, "200")  # curl falls back to HTTP/1.1


# --- rate_limit -----------------------------------------------------------------------------------
def test_rate_limit(config: Path, exporter_process: Start) -> None:
    text = "rate_limit:\n  interval: 1m\n  burst: 2\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    proc = start(exporter_process, config, text)
    first, second, third = (proc.get("/-/healthy") for _ in range(3))
    assert (first[0], second[0], third[0]) == (200, 200, 429)
    assert third[1]["X-Frame-Options"] == "deny"
    assert proc.get("/metrics")[0] == 429


def test_rate_limit_refills(config: Path, exporter_process: Start) -> None:
    proc = start(exporter_process, config, "rate_limit:\n  interval: 3s\n  burst: 1\n")
    assert proc.get("/-/healthy")[0] == 200
    codes = [proc.get("/-/healthy")[0]]
    proc.wait_for(lambda: codes.append(proc.get("/-/healthy")[0]) or codes[-1] == 200, timeout=15)
    assert codes[0] == 429  # refused at once, let in again a token later


# --- basic_auth_users -----------------------------------------------------------------------------
def test_basic_auth_and_open_probes(config: Path, exporter_process: Start) -> None:
    proc = start(exporter_process, config, f"basic_auth_users:\n  prometheus: '{HASH}'\n")
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


def test_protect_health(config: Path, exporter_process: Start) -> None:
    proc = start(
        exporter_process,
        config,
        f"basic_auth_users:\n  prometheus: '{HASH}'\n",
        "--web.protect-health",
    )
    assert get(proc.base + "/-/healthy") == 401
    assert get(proc.base + "/-/healthy", auth=("prometheus", "s3cret")) == 200


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


# --- reload ---------------------------------------------------------------------------------------
def _logged(proc: ExporterProcess, text: str, after: int) -> bool:
    return any(text in e["msg"] for e in proc.logs[after:])


def poke(proc: ExporterProcess, pki: Pki) -> bool:
    call(proc, "/-/healthy", pki.client("client"))
    return True


def test_reload_client_auth_and_sans(pki: Pki, config: Path, exporter_process: Start) -> None:
    proc = start(exporter_process, config, tls_config())
    assert status(proc, "/metrics", pki.client()) == 200
    mtls = ["client_auth_type: RequireAndVerifyClientCert", "client_ca_file: ca.crt"]
    write_atomically(config, tls_config(*mtls, "client_allowed_sans: [prometheus.example]"))
    proc.wait_for(lambda: status(proc, "/metrics", pki.client()) == REFUSED)
    assert status(proc, "/metrics", pki.client("client")) == 200
    assert status(proc, "/metrics", pki.client("intruder")) == 403
    write_atomically(config, tls_config(*mtls, "client_allowed_sans: [intruder.example]"))
    proc.wait_for(lambda: status(proc, "/metrics", pki.client("intruder")) == 200)
    assert status(proc, "/metrics", pki.client("client")) == 403
    assert status(proc, "/metrics", pki.client()) == REFUSED
    # another client CA: its certificate gets in, the old CA's no longer
    other_ca = ["client_auth_type: RequireAndVerifyClientCert", "client_ca_file: other-ca.crt"]
    write_atomically(config, tls_config(*other_ca))
    proc.wait_for(lambda: status(proc, "/metrics", pki.client("stranger")) == 200)
    assert status(proc, "/metrics", pki.client("client")) == REFUSED


def test_reload_versions_ciphers_curves(pki: Pki, config: Path, exporter_process: Start) -> None:
    proc = start(exporter_process, config, tls_config())
    assert status(proc, "/metrics", pki.client(max_version=TLS12)) == 200
    write_atomically(config, tls_config("min_version: TLS13"))
    proc.wait_for(lambda: status(proc, "/metrics", pki.client(max_version=TLS12)) == REFUSED)
    assert status(proc, "/metrics", pki.client()) == 200
    aes128 = pki.client(max_version=TLS12, ciphers="ECDHE-ECDSA-AES128-GCM-SHA256")
    aes256 = pki.client(max_version=TLS12, ciphers="ECDHE-ECDSA-AES256-GCM-SHA384")
    write_atomically(
        config,
        tls_config(
            "max_version: TLS12", "cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]"
        ),
    )
    proc.wait_for(lambda: status(proc, "/metrics", aes256) == 200)
    assert status(proc, "/metrics", aes128) == REFUSED
    assert status(proc, "/metrics", pki.client(min_version=TLS13)) == REFUSED
    p256, p384 = pki.client(), pki.client()
    p256.set_ecdh_curve("prime256v1")
    p384.set_ecdh_curve("secp384r1")
    assert status(proc, "/metrics", p256) == 200
    write_atomically(config, tls_config("curve_preferences: [CurveP384]"))
    proc.wait_for(lambda: status(proc, "/metrics", p256) == REFUSED)
    assert status(proc, "/metrics", p384) == 200


def test_reload_users_headers_rate_limit(config: Path, exporter_process: Start) -> None:
    text = f"basic_auth_users:\n  prometheus: '{HASH}'\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    proc = start(exporter_process, config, text)
    url = proc.base + "/metrics"
    assert get(url, auth=("prometheus", "s3cret")) == 200
    new_hash = bcrypt.hashpw(b"other", bcrypt.gensalt(4)).decode()
    write_atomically(
        config,
        f"basic_auth_users:\n  scraper: '{new_hash}'\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n"
        "rate_limit:\n  interval: 1h\n  burst: 3\n",
    )
    proc.wait_for(lambda: get(url, auth=("scraper", "other")) == 200)  # 1 of 3
    assert get(url, auth=("prometheus", "s3cret")) == 401  # 2 of 3
    assert proc.get("/-/healthy")[1]["X-Frame-Options"] == "sameorigin"  # 3 of 3
    assert proc.get("/-/healthy")[0] == 429


def test_reload_rotated_certificate(pki: Pki, config: Path, exporter_process: Start) -> None:
    """cert-manager rewrites the certificate files, not the web config: picked up too."""
    (pki.root / "live.crt").write_bytes((pki.root / "server.crt").read_bytes())
    (pki.root / "live.key").write_bytes((pki.root / "server.key").read_bytes())
    proc = start(exporter_process, config, tls_config(cert="live"))
    port = int(proc.base.rsplit(":", 1)[1])

    def served() -> bytes:
        return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", port)))

    assert served() == pki.der("server")
    write_atomically(pki.root / "live.key", (pki.root / "server2.key").read_text())
    write_atomically(pki.root / "live.crt", (pki.root / "server2.crt").read_text())
    proc.wait_for(lambda: served() == pki.der("server2"))
    assert status(proc, "/metrics", pki.client()) == 200


def test_reload_broken_or_refused_keeps_the_old_whole(
    pki: Pki, config: Path, exporter_process: Start
) -> None:
    mtls = ["client_auth_type: RequireAndVerifyClientCert", "client_ca_file: ca.crt"]
    users = f"basic_auth_users:\n  prometheus: '{HASH}'\n"
    proc = start(exporter_process, config, tls_config(*mtls) + users)
    auth = {"Authorization": "Basic " + base64.b64encode(b"prometheus:s3cret").decode()}

    def old_in_force() -> None:
        assert status(proc, "/metrics", pki.client()) == REFUSED
        ok = call(proc, "/metrics", pki.client("client"), auth)
        assert isinstance(ok, Reply) and ok.status == 200
        assert status(proc, "/metrics", pki.client("client")) == 401

    old_in_force()
    other = bcrypt.hashpw(b"other", bcrypt.gensalt(4)).decode()
    broken = [
        # new users with a certificate that does not load: neither half is taken
        (tls_config(*mtls, cert="missing") + f"basic_auth_users:\n  x: '{other}'\n", "missing.crt"),
        ("tls_server_config: [\n", "not valid YAML"),
        (
            tls_config("client_auth_type: RequireAnyClientCert", "client_ca_file: ca.crt"),
            "RequireAnyClientCert",
        ),
        (
            tls_config(*mtls, "cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]"),
            "TLS_RSA_WITH_RC4_128_SHA",
        ),
        (tls_config(*mtls, "curve_preferences: [CurveP256, X25519]"), "curve_preferences"),
        (tls_config(*mtls) + "http_server_config:\n  http2: true\n", "http2"),
        (users, "turning TLS on or off needs a restart"),
    ]
    for text, reason in broken:
        mark = len(proc.logs)
        write_atomically(config, text)
        # a new connection makes the exporter look at the file
        proc.wait_for(lambda: poke(proc, pki) and _logged(proc, reason, mark))  # noqa: B023
        assert _logged(proc, "not reloaded", mark)
        old_in_force()
        assert not _logged(proc, "reloaded from", mark)


def test_reload_closes_connections_of_the_old_config(
    pki: Pki, config: Path, exporter_process: Start
) -> None:
    """A kept-alive connection is answered once more under the config it was opened with,
    then closed; the next connection gets the new config."""
    header = "http_server_config:\n  headers:\n    X-Frame-Options: {}\n"
    proc = start(exporter_process, config, tls_config() + header.format("deny"))
    port = int(proc.base.rsplit(":", 1)[1])
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=pki.client(), timeout=10)
    conn.request("GET", "/-/healthy")
    first = conn.getresponse()
    first.read()
    assert first.getheader("X-Frame-Options") == "deny"
    assert first.getheader("Connection") != "close"
    write_atomically(config, tls_config() + header.format("sameorigin"))
    proc.wait_for(
        lambda: reply(proc, "/-/healthy", pki.client()).headers["X-Frame-Options"] == "sameorigin"
    )
    conn.request("GET", "/-/healthy")
    last = conn.getresponse()
    last.read()
    assert last.getheader("X-Frame-Options") == "deny"  # the old config, whole
    assert last.getheader("Connection") == "close"
    conn.close()


# --- refused at start-up --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope: 1\n", "unknown field 'nope'"),
        ("tls_server_config:\n  cert_file: x.crt\n  key_file: x.key\n", "TLS certificate or key"),
        ("basic_auth_users:\n  u: plaintext\n", "basic_auth_users.u: not a bcrypt hash"),
        ("basic_auth_users: [1]\n", "basic_auth_users must map"),
        ("rate_limit:\n  interval: 1s\n  burst: 1\n  burst: 2\n", "'burst' is given twice"),
    ],
)
def test_bad_web_config(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "web.yml"
    config.write_text(text)
    with pytest.raises(ConfigError) as info:
        parse_web_config(config)
    assert message in str(info.value)
    assert str(info.value).startswith("--web.config.file: ")


def test_rate_limit_zero_interval_is_off(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text("rate_limit:\n  interval: 0\n")
    assert read_web_config(config).rate_limit is None
    config.write_text("rate_limit:\n  interval: 2s\n  burst: 5\n")
    limit = read_web_config(config).rate_limit
    assert limit is not None and (limit.interval, limit.burst) == (2.0, 5)
