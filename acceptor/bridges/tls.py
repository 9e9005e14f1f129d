"""A bridge's TLS toward the remote broker: the remote's certificate checked against `cafile` (or the
system's CAs) and the name it must hold, a client certificate where one is named, ALPN where asked."""

from __future__ import annotations

import ssl
from typing import Any


def client_context(tls: dict[str, Any]) -> ssl.SSLContext:
    """The context of a [bridges.NAME.tls] table; OSError or ValueError (ssl.SSLError) when a file
    cannot be read or holds no certificate or key."""
    context = ssl.create_default_context(cafile=tls["cafile"] or None)
    if tls["certfile"]:
        context.load_cert_chain(tls["certfile"], tls["keyfile"] or None)
    if tls["alpn"]:
        context.set_alpn_protocols(tls["alpn"])
    return context
