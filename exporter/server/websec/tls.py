"""The TLS server contexts: one per loaded web config, and the listening one in front of them.

Go's TLS names (versions, client auth modes, cipher suites, curves) are mapped here to what
Python's ``ssl`` and OpenSSL call them. The listening socket's context hands each new
connection to the complete context of the web config in force."""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Callable, Iterator

from exporter.server.websec.webconfig import Pem, TlsConfig, config_error

TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Go's tls.CipherSuites() (the ones it calls secure) for TLS 1.2, to OpenSSL's names.
CIPHERS = {
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
CURVES = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}


class ConfigContext(ssl.SSLContext):
    """A server context built from one generation; its connections find it through
    ``ssl_object.context`` and so are checked against the same generation."""

    # The generation (exporter.server.websec.reload) that built this context; TLS knows
    # nothing of reloading, so it is held as a plain object.
    generation: object | None = None


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


def build_ssl_context(tls: TlsConfig) -> ConfigContext:
    """A complete server context for ``tls``; ConfigError naming what failed to load."""
    context = ConfigContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.maximum_version = TLS_VERSIONS[tls.max_version]
    # Go's servers never renegotiate; OpenSSL would accept a client-initiated one.
    context.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_NO_COMPRESSION
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        context.set_ciphers(":".join(CIPHERS[name] for name in tls.cipher_suites))
    except ssl.SSLError:
        raise config_error(
            "tls_server_config.cipher_suites: this OpenSSL supports none of "
            f"{', '.join(tls.cipher_suites)}"
        ) from None
    if tls.curve is not None:
        if ssl.OPENSSL_VERSION_INFO < (3,):
            # Before OpenSSL 3, Python's set_ecdh_curve sets TLS 1.2's curve only.
            raise config_error(
                "tls_server_config.curve_preferences needs Python linked to OpenSSL 3 (this "
                f"one has {ssl.OPENSSL_VERSION}); remove the field"
            )
        context.set_ecdh_curve(CURVES[tls.curve])
    try:
        with _as_path(tls.cert) as cert, _as_path(tls.key) as key:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        where = f"{tls.cert.describe('cert_file')}, {tls.key.describe('key_file')}"
        raise config_error(f"TLS certificate or key ({where}): {_reason(err)}") from None
    if tls.client_ca is not None:
        try:
            _load_ca(context, tls.client_ca)
        except (OSError, ssl.SSLError) as err:
            where = tls.client_ca.describe("client_ca_file")
            raise config_error(f"TLS client CA ({where}): {_reason(err)}") from None
    context.verify_mode = CLIENT_AUTH[tls.client_auth]
    return context


def _reason(err: OSError | ssl.SSLError) -> str:
    if isinstance(err, ssl.SSLError):
        return str(err.reason or err).replace("_", " ").lower()
    return str(err.strerror or err)


class ListeningContext(ssl.SSLContext):
    """The context the listening socket is given. It only hands each new connection to the
    complete context of the generation in force. Switching a connection's context later, in
    an SNI callback, is not enough: OpenSSL (3.0, tried) then changes the certificate and the
    cipher list but keeps the verify mode, the protocol versions and the key-exchange groups
    of the context the connection was created with, so a client without a certificate, or
    with TLS 1.2 or another curve, would still get in."""

    pick: Callable[[], ConfigContext]

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
