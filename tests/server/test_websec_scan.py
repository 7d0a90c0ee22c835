"""sslyze scans the running exporter's TLS at its defaults; SECURITY.md reports this scan."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from sslyze import (
    ScanCommand,
    ScanCommandsExtraArguments,
    Scanner,
    ServerNetworkLocation,
    ServerScanRequest,
    ServerScanStatusEnum,
)
from sslyze.plugins.certificate_info.implementation import CertificateInfoExtraArgument
from support.process import ExporterProcess
from support.tls import Pki, start, tls_config

# sslyze bundles Mozilla's and other platforms' trust stores; one of their old roots has a
# negative serial number, which cryptography warns about on every load.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Parsed a serial number which wasn't positive:cryptography.utils.CryptographyDeprecationWarning"
)

# Go's default TLS 1.2 suites without CBC: ECDHE key exchange and AEAD only. The server's key
# is ECDSA, so these are the ECDSA ones.
TLS12_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
}
TLS13_SUITES = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
WEAK = ("NULL", "EXPORT", "RC4", "3DES", "DES_", "_CBC_SHA", "anon", "MD5")


def scan(proc: ExporterProcess, ca_file: Path) -> Any:
    port = int(proc.base.rsplit(":", 1)[1])
    request = ServerScanRequest(
        server_location=ServerNetworkLocation("127.0.0.1", port, ip_address="127.0.0.1"),
        scan_commands=set(ScanCommand),
        scan_commands_extra_arguments=ScanCommandsExtraArguments(
            certificate_info=CertificateInfoExtraArgument(custom_ca_file=ca_file)
        ),
    )
    scanner = Scanner()
    scanner.queue_scans([request])
    (result,) = list(scanner.get_results())
    assert result.scan_status == ServerScanStatusEnum.COMPLETED, result.connectivity_error_trace
    return result.scan_result


def accepted(attempt: Any) -> set[str]:
    assert attempt.error_reason is None, attempt.error_trace
    return {suite.cipher_suite.name for suite in attempt.result.accepted_cipher_suites}


def test_sslyze_scan_at_defaults(
    tmp_path: Path, exporter_process: Callable[..., ExporterProcess]
) -> None:
    pki = Pki(tmp_path)
    hsts = "http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\n"
    proc = start(exporter_process, tmp_path / "web.yml", tls_config(cert="chain") + hsts)
    result = scan(proc, tmp_path / "ca.crt")

    # no protocol below TLS 1.2
    for old in ("ssl_2_0", "ssl_3_0", "tls_1_0", "tls_1_1"):
        assert accepted(getattr(result, f"{old}_cipher_suites")) == set(), old
    tls12 = accepted(result.tls_1_2_cipher_suites)
    tls13 = accepted(result.tls_1_3_cipher_suites)
    assert tls12 == TLS12_SUITES
    assert tls13 == TLS13_SUITES
    assert not [s for s in tls12 | tls13 if any(weak in s for weak in WEAK)]

    # the configured chain, leaf first, and it verifies against the test CA
    (deployment,) = result.certificate_info.result.certificate_deployments
    served = [
        c.public_bytes(serialization.Encoding.DER) for c in deployment.received_certificate_chain
    ]
    assert served == [pki.der("chain"), pki.der("inter")]
    supplied = [
        v for v in deployment.path_validation_results if v.trust_store.name == "Supplied CA file"
    ]
    assert [v.was_validation_successful for v in supplied] == [True]

    assert result.tls_compression.result.supports_compression is False
    renegotiation = result.session_renegotiation.result
    assert renegotiation.supports_secure_renegotiation is True
    assert renegotiation.is_vulnerable_to_client_renegotiation_dos is False
    assert result.tls_fallback_scsv.result.supports_fallback_scsv is True
    assert result.heartbleed.result.is_vulnerable_to_heartbleed is False
    assert result.openssl_ccs_injection.result.is_vulnerable_to_ccs_injection is False
    assert result.robot.result.robot_result.name.startswith("NOT_VULNERABLE")
    assert result.tls_extended_master_secret.result.supports_ems_extension is True
    assert result.tls_1_3_early_data.result.supports_early_data is False
    curves = {c.name for c in result.elliptic_curves.result.supported_curves}
    assert curves == {"X25519", "X448", "secp256r1", "secp384r1", "secp521r1"}
    headers = result.http_headers.result
    assert headers.strict_transport_security_header.max_age == 31536000
