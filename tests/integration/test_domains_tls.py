"""A VM's guest over TCP (virtio-net) with mutual TLS: a client certificate whose SAN URI is
``urn:crane:domain:NAME`` makes its sessions domain NAME's, exactly as the domain socket does."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.v1 import guest_pb2, guest_pb2_grpc
from crane.wire.channel import TlsFiles, open_channel
from crane.wire.fingerprint import fingerprint
from tests.integration.pki import Pki


def domain_cert(pki: Pki, cn: str, *uris: str) -> TlsFiles:
    """A client certificate signed by ``pki``'s CA naming ``uris`` as SAN URIs (trustme makes
    DNS, IP and e-mail names only)."""
    ca_key = serialization.load_pem_private_key(pki.ca.private_key_pem.bytes(), None)
    ca_cert = x509.load_pem_x509_certificate(pki.ca.cert_pem.bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    c, k = pki.root / f"{cn}.pem", pki.root / f"{cn}.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return TlsFiles(str(c), str(k), str(pki.ca_path))


@pytest.fixture
def tlsd(tmp_path: Path, pki: Pki) -> Iterator[DaemonProcess]:
    d = DaemonProcess(
        tmp_path / "run",
        ["sim:h100-80gb"],
        extra_listen=["tcp://127.0.0.1:0"],
        extra_args=[*pki.daemon_args("craned-a"), "--domain", "vm1=alice"],
    )
    try:
        yield d
    finally:
        d.stop()


def test_a_certificate_naming_a_domain_is_that_domains_guest(tlsd: DaemonProcess, pki: Pki) -> None:
    tcp = tlsd.tcp_address()
    vm1 = domain_cert(pki, "guest-1", "urn:crane:domain:vm1")
    vm2 = domain_cert(pki, "guest-2", "urn:crane:domain:vm2")
    s1 = GuestSession(tcp, tls=vm1)
    s2 = GuestSession(tcp, tls=vm2)
    try:
        d = s1.mem_alloc(256)
        s1.memcpy_htod(d, b"vm1!")
        assert s1.memcpy_dtoh(d, 4) == b"vm1!"
        with ControlClient(tlsd.address) as c:
            rows = {s.id: (s.domain, s.tenant) for s in c.sessions().sessions}
        assert rows == {s1.session_id: ("vm1", "alice"), s2.session_id: ("vm2", "domain:vm2")}
        with ControlClient(tcp, tls=vm2) as c:  # a guest sees its domain's sessions only
            assert [s.id for s in c.sessions().sessions] == [s2.session_id]
            with pytest.raises(grpc.RpcError) as e:
                c.attach_domain("vm2")  # and is never an operator
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # vm2's certificate with vm1's session id and valid token: refused, naming both
        with open_channel(tcp, vm2) as ch:
            req = guest_pb2.ResumeRequest(
                session_id=s1.session_id,
                resume_token=s1._t.opened.resume_token,
                fingerprint=fingerprint(),
            )
            with pytest.raises(grpc.RpcError) as e:
                guest_pb2_grpc.GuestStub(ch).Resume(req, timeout=10)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "domain vm1" in e.value.details() and "domain vm2" in e.value.details()
    finally:
        s1.close()
        s2.close()


def test_a_certificate_naming_two_domains_or_a_bad_one_is_refused(
    tlsd: DaemonProcess, pki: Pki
) -> None:
    tcp = tlsd.tcp_address()
    for cn, uris, why in (
        ("two", ("urn:crane:domain:vm1", "urn:crane:domain:vm2"), "several domains"),
        ("bad", ("urn:crane:domain:a/b",), "not accepted"),
    ):
        with ControlClient(tcp, tls=domain_cert(pki, cn, *uris)) as c:
            with pytest.raises(grpc.RpcError) as e:
                c.sessions()
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert why in e.value.details()
    assert "several domains" in tlsd.log_text()
