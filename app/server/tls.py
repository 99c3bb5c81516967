"""TLS for ``SSL://`` and ``SASL_SSL://`` listeners: one server certificate and key
(``kip98 serve --tls-cert FILE --tls-key FILE``), TLS 1.2 or later.

Clients are not asked for certificates: on an SSL listener a connection acts as the
server's principal, as on a PLAINTEXT one; SASL_SSL authenticates users over the
encrypted connection, where PLAIN's password no longer travels in the clear."""

from __future__ import annotations

import ssl


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """ValueError, naming the file, when the certificate or key cannot be loaded."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        raise ValueError(f"no such file: {exc.filename or cert}") from exc
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"cannot load the TLS certificate {cert} with key {key}: {exc}") from exc
    return context
