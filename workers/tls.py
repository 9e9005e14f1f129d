"""TLS for the listeners: the server context built from `[tls]`, and the identity in a client certificate.

The acceptor builds the context once at startup (and at a reload) only to refuse a bad setting with one
line; each worker builds its own (contexts do not cross processes), again at each reload so that a new
CRL takes effect, and runs the handshakes.
"""

from __future__ import annotations

import re
import ssl
from typing import Any

VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def wanted(config: dict[str, Any]) -> bool:
    """Whether a listener speaks TLS: `[tls]` itself, or WebSocket over TLS or a tenant's mqtts/wss
    listener, which use its certificate."""
    websocket = config["websocket"]
    return (config["tls"]["enabled"] or websocket["enabled"] and websocket["tls"]
            or any(url.startswith(("mqtts:", "wss:")) for table in config["tenants"].values() for url in table["listeners"]))


def console_wanted(config: dict[str, Any]) -> bool:
    """Whether the web console serves HTTPS: `console_tls` (the default) with a `[tls]` certificate."""
    return config["console_port"] >= 0 and config["console_tls"] and bool(config["tls"]["certfile"])


def server_context(tls: dict[str, Any]) -> ssl.SSLContext:
    """The context for `[tls]`; ValueError("tls.KEY: why") names the first setting that does not work."""
    for key in ("certfile", "keyfile"):
        if not tls[key]:
            raise ValueError(f"tls.{key}: required by a TLS listener")
    if tls["require_certificate"] and not tls["cafile"]:
        raise ValueError("tls.cafile: required by require_certificate (the CA that signs client certificates)")
    for key in ("use_identity_as_username", "crlfile"):
        if tls[key] and not tls["require_certificate"]:
            raise ValueError(f"tls.{key}: needs require_certificate = true")
    for key in ("certfile", "keyfile", "cafile", "crlfile"):
        if tls[key]:
            try:
                with open(tls[key], "rb"):
                    pass
            except OSError as exc:
                raise ValueError(f"tls.{key}: cannot read {tls[key]}: {exc.strerror}") from None
    certfile, keyfile = tls["certfile"], tls["keyfile"]
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=certfile)
    except ssl.SSLError as exc:
        raise ValueError(f"tls.certfile: no PEM certificate in {certfile} ({_detail(exc)})") from None

    def encrypted() -> bytes:  # OpenSSL would prompt on the terminal instead
        raise ValueError(f"tls.keyfile: {keyfile} is encrypted; give the key without a passphrase")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = VERSIONS[tls["min_version"]]
    try:
        context.load_cert_chain(certfile, keyfile, password=encrypted)
    except ssl.SSLError as exc:
        raise ValueError(f"tls.keyfile: {keyfile} is not the PEM key of {certfile} ({_detail(exc)})") from None
    if tls["cafile"]:
        try:
            context.load_verify_locations(cafile=tls["cafile"])
        except ssl.SSLError as exc:
            raise ValueError(f"tls.cafile: no PEM certificate in {tls['cafile']} ({_detail(exc)})") from None
    if tls["crlfile"]:
        _load_crl(context, tls["crlfile"])
    if tls["ciphers"]:
        try:
            context.set_ciphers(tls["ciphers"])
        except ssl.SSLError as exc:
            raise ValueError(f"tls.ciphers: {_detail(exc)}") from None
    if tls["require_certificate"]:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _load_crl(context: ssl.SSLContext, crlfile: str) -> None:
    """Refuse at the handshake a client certificate that the CRL of its issuer revokes (the leaf only,
    as mosquitto's crlfile). OpenSSL reads certificates from the file too and would trust them as CAs:
    a file with one is refused."""
    with open(crlfile, "rb") as f:
        pem = f.read()
    if b"-----BEGIN X509 CRL-----" not in pem or b"-----BEGIN CERTIFICATE-----" in pem:
        raise ValueError(f"tls.crlfile: {crlfile} is not a PEM CRL (or holds a certificate as well)")
    try:
        context.load_verify_locations(cafile=crlfile)
    except ssl.SSLError as exc:
        raise ValueError(f"tls.crlfile: no PEM CRL in {crlfile} ({_detail(exc)})") from None
    context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF


def _detail(exc: ssl.SSLError) -> str:
    """OpenSSL's reason without the C source location."""
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", str(exc.args[-1]))


# tenant_certificate_field: the subject field as getpeercert() names it
SUBJECT_FIELDS = {"": "", "CN": "commonName", "O": "organizationName", "OU": "organizationalUnitName"}


def common_name(peercert: dict[str, Any], field: str = "commonName") -> str:
    """The subject CN (or another `field`) of a verified certificate (`getpeercert()`'s dict), "" when it has none."""
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == field:
                return value
    return ""


def unfit_username(cn: str) -> str | None:
    """Why a certificate's CN cannot be a user name (use_identity_as_username), None when it can: none;
    U+0000, which no MQTT string holds [MQTT-1.5.3-2] and which cuts the name short where C reads it;
    a wildcard, which no ACL pattern's %u matches. A `/` is not refused: a user name may hold one (a
    `user` rule names it; a pattern's %u does not match it, workers/auth/acl.py)."""
    if not cn:
        return "client certificate without a CN"
    if "\x00" in cn:
        return f"client certificate CN {cn!r} holds U+0000"
    if "+" in cn or "#" in cn:
        return f"client certificate CN {cn!r} holds a wildcard"
    return None
