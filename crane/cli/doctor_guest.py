"""``crane doctor --guest``: can CUDA programs on this machine reach a daemon through Crane?

Checks: the guest library (``libcuda.so.1``) exists for this interpreter and loads (in a child
process, as an application would load it); the client TLS files where the daemon is ``tcp://``;
the daemon answers the standard health check (and whether it serves new sessions); and the
daemon was built from the same wire definition as this guest (the protocol fingerprint that
``OpenSession`` checks), asked with a ``Resume`` of no session, so nothing is opened: the daemon
compares fingerprints before it looks the session up.
"""

from __future__ import annotations

import subprocess
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from crane.cli.doctor_certs import check_tls_files
from crane.cli.doctor_findings import FAIL, OK, WARN, Finding
from crane.interposer import library_path
from crane.v1 import guest_pb2, guest_pb2_grpc
from crane.wire.address import default_address, is_vm
from crane.wire.channel import TlsFiles, open_channel
from crane.wire.fingerprint import fingerprint

__all__ = ["guest_findings"]

_LOAD = "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); lib.cuInit; lib.cuGetProcAddress"


def _library() -> Finding:
    lib = library_path()
    build = "crane guest-lib --build (needs a C compiler and a shared libpython)"
    if not lib.exists():
        return Finding("guest library", FAIL, f"{lib} is not built for {sys.executable}", build)
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, str(lib)], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Finding("guest library", FAIL, f"{lib} does not load: {why}", build)
    return Finding("guest library", OK, f"{lib} loads in {sys.executable}")


def _health(channel: grpc.Channel, address: str) -> Finding:
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        status = stub.Check(health_pb2.HealthCheckRequest(service="crane.v1.Guest"), timeout=10)
    except grpc.RpcError as e:
        fix = (
            "is craned running? `systemctl status craned` on the host; check the address "
            "(--daemon or $CRANE_DAEMON)"
        )
        if is_vm(address):
            fix = "in a VM: the forwarded port (crane vsock-bridge), the domain's host socket"
        elif e.code() == grpc.StatusCode.UNIMPLEMENTED:
            fix = "upgrade craned on the host: this one predates its health service"
        return Finding(
            "daemon",
            FAIL,
            f"{address} does not answer: {e.code().name} {e.details() or ''}".strip(),
            fix,
        )
    if status.status == health_pb2.HealthCheckResponse.SERVING:
        return Finding("daemon", OK, f"{address} is serving sessions")
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(status.status)
    return Finding(
        "daemon",
        FAIL,
        f"{address} answers but is {name} for new sessions",
        "on the host: `journalctl -u craned` names why (a worker cannot start, the GPU is "
        "lost, or it is stopping)",
    )


def _fingerprint(channel: grpc.Channel, address: str) -> Finding:
    ours = fingerprint()
    stub = guest_pb2_grpc.GuestStub(channel)
    try:
        stub.Resume(guest_pb2.ResumeRequest(fingerprint=ours, session_id=""), timeout=10)
    except grpc.RpcError as e:
        details = e.details() or ""
        if "fingerprint" in details:
            return Finding(
                "fingerprint",
                FAIL,
                details,
                "install the same Crane release on the guest and the host (`pip install "
                "crane==VERSION`, VERSION from `craned --version`)",
            )
        if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return Finding(
                "fingerprint",
                WARN,
                f"not checked: the daemon refuses this caller ({details})",
                "ask the operator to add this user (or certificate) to a tenant in craned.toml",
            )
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            return Finding(
                "fingerprint",
                FAIL,
                f"not checked: {address} is unavailable",
                "see the daemon finding",
            )
        # the fingerprints matched: the daemon went on to look the (empty) session up
        return Finding(
            "fingerprint", OK, f"{ours}: the guest library and craned speak the same protocol"
        )
    return Finding(
        "fingerprint", OK, f"{ours}: the guest library and craned speak the same protocol"
    )


def guest_findings(address: str | None) -> list[Finding]:
    address = address or default_address()
    out = [_library()]
    tls = TlsFiles.from_env()
    if address.startswith("tcp://") and tls.cert:
        out += check_tls_files(tls.cert, tls.key, tls.ca, "guest client")
    try:
        channel = open_channel(address, tls)
    except (OSError, ValueError) as e:
        return [
            *out,
            Finding(
                "daemon", FAIL, f"cannot open {address}: {e}", "check the address and the TLS files"
            ),
        ]
    with channel:
        found = _health(channel, address)
        out.append(found)
        if found.status == OK or "answers but" in found.message:
            out.append(_fingerprint(channel, address))
    return out
