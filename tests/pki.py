"""A throwaway PKI made with the openssl tool, for the TLS tests (tests/test_transports.py, the
bridges' in tests/test_bridges.py)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str  # CN device-42
    client_key: str
    nameless_cert: str  # no CN in its subject
    nameless_key: str
    ca_key: str

    def tls(self, *, client: bool = False) -> dict[str, str]:
        """paho's tls_set arguments."""
        found = {"ca_certs": self.ca}
        if client:
            found.update(certfile=self.client_cert, keyfile=self.client_key)
        return found


def openssl(where: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True, timeout=30)


def make_pki(where: Path) -> Pki:
    """A throwaway CA, and certificates it signed: the server's (localhost, 127.0.0.1), a client's (CN
    device-42) and one without a CN."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(where, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=plexmq test CA")
    leaves = {"server": ("/CN=localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
              "client": ("/CN=device-42", "extendedKeyUsage=clientAuth\n"),
              "nameless": ("/O=plexmq tests", "extendedKeyUsage=clientAuth\n")}
    for serial, (name, (subject, ext)) in enumerate(leaves.items(), 1):
        (where / f"{name}.ext").write_text("basicConstraints=CA:FALSE\nsubjectKeyIdentifier=hash\n"
                                           "authorityKeyIdentifier=keyid\n" + ext)
        openssl(where, "req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        openssl(where, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial",
                str(serial), "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt")
    return Pki(*(str(where / f) for f in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key",
                                         "nameless.crt", "nameless.key", "ca.key")))
