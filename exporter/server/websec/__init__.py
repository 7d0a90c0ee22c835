"""Web security: TLS, basic auth, security headers and a rate limit from a web config file.

The file is in exporter-toolkit's format (the ``--web.config.file`` of node_exporter and
Prometheus)::

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

One loaded file is a *generation*: its settings plus a complete server ``SSLContext`` built from
them. Each new TLS connection is set up by the context of the generation in force when it
arrives (:class:`~exporter.server.websec.tls.ListeningContext` hands the handshake to it), and
every request on that connection is checked against the same generation, so a connection never
sees half of one file and half of another. After a reload, a connection opened under an older
generation gets one more response and is then closed; the client reconnects under the new one.
The file and the certificate, key and CA files it names are checked for changes on every request
and every new connection (exporter-toolkit re-reads them as often); a new version that fails to
load is logged and the previous generation stays in force, whole.

Passwords are checked with bcrypt on every request that is not cached; the cache holds only
*successful* checks, keyed by an HMAC of the presented user and password under a key that lives
in this process alone — presenting the stored hash as the password (CVE-2022-46146 in
exporter-toolkit) or a wrong password can never hit it. Unknown users cost a bcrypt check too,
so timing does not reveal which users exist.

Modules, each importing only those above it: :mod:`~exporter.server.websec.fields` (the format's
fields and what they do here), :mod:`~exporter.server.websec.webconfig` (the validated config),
:mod:`~exporter.server.websec.tls` (the server contexts), :mod:`~exporter.server.websec.parsing`
(the file, validated), :mod:`~exporter.server.websec.reload` (generations),
:mod:`~exporter.server.websec.middleware` (the checks on each request).
"""

from __future__ import annotations

from exporter.server.websec.fields import FIELDS, Field, field_table
from exporter.server.websec.middleware import WebSecurity, peer_sans
from exporter.server.websec.parsing import HEADERS, parse_web_config, read_web_config
from exporter.server.websec.tls import build_ssl_context
from exporter.server.websec.webconfig import Pem, RateLimit, TlsConfig, WebConfig

__all__ = [
    "FIELDS",
    "HEADERS",
    "Field",
    "Pem",
    "RateLimit",
    "TlsConfig",
    "WebConfig",
    "WebSecurity",
    "build_ssl_context",
    "field_table",
    "parse_web_config",
    "peer_sans",
    "read_web_config",
]
