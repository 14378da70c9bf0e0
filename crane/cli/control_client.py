"""A small client for the daemon's Control service (used by the CLI and tests)."""

from __future__ import annotations

from crane.v1 import control_pb2, control_pb2_grpc
from crane.wire.address import default_address
from crane.wire.channel import TlsFiles, open_channel

__all__ = ["ControlClient"]


class ControlClient:
    """Identified as :func:`~crane.wire.channel.open_channel` does (``tls`` None: TLS files
    from ``$CRANE_TLS_*`` for a tcp:// daemon)."""

    def __init__(
        self,
        address: str | None = None,
        timeout: float | None = 10.0,
        tls: TlsFiles | None = None,
    ) -> None:
        self.address = address or default_address()
        self.timeout = timeout
        self._channel = open_channel(self.address, tls)
        self._stub = control_pb2_grpc.ControlStub(self._channel)

    def devices(self) -> control_pb2.ListDevicesReply:
        return self._stub.ListDevices(control_pb2.ListDevicesRequest(), timeout=self.timeout)

    def sessions(self, domain: str = "") -> control_pb2.ListSessionsReply:
        """Sessions the caller may see; ``domain``: only that libvirt domain's."""
        req = control_pb2.ListSessionsRequest(domain=domain)
        return self._stub.ListSessions(req, timeout=self.timeout)

    def attach_domain(self, domain: str, tenant: str = "") -> control_pb2.AttachDomainReply:
        """Have the daemon serve ``domain``'s socket (idempotent); its path in the reply."""
        req = control_pb2.AttachDomainRequest(domain=domain, tenant=tenant)
        return self._stub.AttachDomain(req, timeout=self.timeout)

    def detach_domain(self, domain: str) -> control_pb2.DetachDomainReply:
        req = control_pb2.DetachDomainRequest(domain=domain)
        return self._stub.DetachDomain(req, timeout=self.timeout)

    def checkpoint(self, session: str, path: str, release: bool) -> control_pb2.CheckpointReply:
        req = control_pb2.CheckpointRequest(session_id=session, path=path, release=release)
        return self._stub.Checkpoint(req, timeout=self.timeout)

    def restore(
        self, path: str, device: int = -1, accept_lower_limits: bool = False
    ) -> control_pb2.RestoreReply:
        req = control_pb2.RestoreRequest(
            path=path, device=device, accept_lower_limits=accept_lower_limits
        )
        return self._stub.Restore(req, timeout=self.timeout)

    def profiles(self, session: str = "", top: int = 0) -> control_pb2.ProfileReply:
        """Profiles of ``session`` ("": every session the caller may see), ``top`` kernels
        each (0: all the daemon keeps)."""
        req = control_pb2.ProfileRequest(session_id=session, top=top)
        return self._stub.GetProfile(req, timeout=self.timeout)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
