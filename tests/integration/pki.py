"""Certificates made at test time (trustme): a CA, daemons' and clients' certificates as PEM
files, so that mutual TLS runs as it does in production and nothing secret is committed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import trustme

from crane.wire.channel import TlsFiles

__all__ = ["Pki"]


class Pki:
    """A CA writing certificates into ``root``; :meth:`issue` names each by its CN."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA()
        self.ca_path = root / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_path))

    def issue(self, cn: str, *sans: str) -> TlsFiles:
        """A certificate for ``cn`` (also a SAN, with ``sans``); a daemon's gets 127.0.0.1 and
        localhost too, the names its clients dial."""
        cert = self.ca.issue_cert(cn, *sans, common_name=cn)
        c, k = self.root / f"{cn}.pem", self.root / f"{cn}.key"
        cert.cert_chain_pems[0].write_to_path(str(c))
        cert.private_key_pem.write_to_path(str(k))
        return TlsFiles(str(c), str(k), str(self.ca_path))

    def daemon_args(self, cn: str, peers: Sequence[str] = ()) -> list[str]:
        """craned flags serving ``cn``'s certificate and trusting this CA's clients."""
        files = self.issue(cn, "127.0.0.1", "localhost")
        args = ["--tls-cert", files.cert, "--tls-key", files.key, "--client-ca", files.ca]
        for p in peers:
            args += ["--peer", p]
        return args
