"""craned's readiness and health, end to end: the gRPC health service over real channels from
start to shutdown, and systemd's notification protocol on a datagram socket the test binds
(as systemd would) with the watchdog asked for."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from crane.craned.launcher import DaemonProcess
from crane.v1 import control_pb2, control_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICES = ("", "crane.v1.Guest", "crane.v1.Control", "crane.v1.Peer", "crane.v1.Migration")


def check(channel: grpc.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def wait_status(channel: grpc.Channel, service: str, want: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (got := check(channel, service)) != want:
        assert time.monotonic() < deadline, f"{service!r} stayed {got}, expected {want}"
        time.sleep(0.2)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory: unix socket paths are limited to 108 bytes."""
    with tempfile.TemporaryDirectory(prefix="crh", dir="/tmp") as d:
        yield Path(d)


def test_health_needs_no_identity_and_goes_not_serving_at_shutdown(short_dir: Path) -> None:
    d = DaemonProcess(short_dir / "run", ["sim:h100-80gb"], extra_args=["--domain", "vm1"])
    try:
        sock = d.address[len("unix://") :]
        # a plain channel: no ident credential, so no tenant; health answers all the same
        with grpc.insecure_channel(f"unix:{sock}") as ch:
            for service in SERVICES:
                assert check(ch, service) == SERVING, service
            with pytest.raises(grpc.RpcError) as e:
                check(ch, "no.such.Service")
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            # ... while the services that reveal something refuse that caller
            with pytest.raises(grpc.RpcError) as e:
                control_pb2_grpc.ControlStub(ch).ListDevices(
                    control_pb2.ListDevicesRequest(), timeout=5
                )
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # every listener serves it, a libvirt domain's socket too
        with grpc.insecure_channel(f"unix:{d.run_dir / 'domains' / 'vm1.sock'}") as ch:
            assert check(ch, "crane.v1.Guest") == SERVING

        with grpc.insecure_channel(f"unix:{sock}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            watch = stub.Watch(health_pb2.HealthCheckRequest(service="crane.v1.Guest"), timeout=30)
            assert next(watch).status == SERVING
            os.kill(d.proc.pid, signal.SIGTERM)
            seen = []
            try:
                for reply in watch:
                    seen.append(reply.status)
            except grpc.RpcError as err:  # the server going away ends the stream
                assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
            assert seen == [NOT_SERVING]
        assert d.proc.wait(15) == 0
        log = d.log_text()
        assert log.index("health: not serving") < log.index("stopped")
    finally:
        d.stop()


def test_dead_workers_make_guest_not_serving_while_control_serves(short_dir: Path) -> None:
    """An idle worker that dies before any session used it means workers cannot be relied on:
    new sessions' services go NOT_SERVING (Control stays up for the operator) until a fresh
    worker outlives its start."""
    d = DaemonProcess(short_dir / "run", ["sim:h100-80gb"], prespawn=1)
    try:
        with grpc.insecure_channel(f"unix:{d.address[len('unix://') :]}") as ch:
            wait_status(ch, "", SERVING, 10)
            deadline = time.monotonic() + 20
            while not (pids := [p.name for p in (d.run_dir / "workers").iterdir()]):
                assert time.monotonic() < deadline, "no idle worker was spawned"
                time.sleep(0.1)
            os.kill(int(pids[0]), signal.SIGKILL)
            wait_status(ch, "crane.v1.Guest", NOT_SERVING, 10)
            assert check(ch, "") == NOT_SERVING
            assert check(ch, "crane.v1.Control") == SERVING
            assert "exited with code -9 before it was used" in d.log_text()
            # the pool spawned a replacement; once it outlived its start, sessions are served
            wait_status(ch, "crane.v1.Guest", SERVING, 40)
            assert check(ch, "") == SERVING
    finally:
        d.stop()


def receive(sock: socket.socket, until: str, timeout: float) -> list[str]:
    """Datagrams (decoded) until one containing the line ``until``."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            raise AssertionError(f"no {until!r} within {timeout} s; got {got}") from None
        if until in got[-1].splitlines():
            return got


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_sd_notify_ready_status_watchdog_stopping(short_dir: Path, abstract: bool) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"crane-test-notify-{os.getpid()}"
        sock.bind("\0" + name)
        env_addr = "@" + name
    else:
        path = short_dir / "notify"
        sock.bind(str(path))
        env_addr = str(path)
    env = dict(os.environ, NOTIFY_SOCKET=env_addr, WATCHDOG_USEC="1000000")
    d = DaemonProcess(short_dir / "run", ["sim:h100-80gb"], env=env)
    try:
        got = receive(sock, "READY=1", 30)
        ready = got[-1].splitlines()
        assert f"MAINPID={d.proc.pid}" in ready
        status = [line for msg in got for line in msg.splitlines() if line.startswith("STATUS=")]
        assert status[0] == "STATUS=starting: resolving devices"
        assert f"STATUS=serving 1 device(s) on {d.address}" in status
        # pings at half of WATCHDOG_USEC (1 s): several within 2 s
        start = time.monotonic()
        pings = 0
        while time.monotonic() - start < 2.0:
            pings += receive(sock, "WATCHDOG=1", 2)[-1] == "WATCHDOG=1"
        assert pings >= 3
        os.kill(d.proc.pid, signal.SIGTERM)
        stopping = receive(sock, "STOPPING=1", 15)[-1].splitlines()
        assert "STATUS=stopping: ending 0 session(s)" in stopping
        assert d.proc.wait(15) == 0
    finally:
        d.stop()
        sock.close()


def test_watchdog_pid_of_another_process_gets_no_pings(short_dir: Path) -> None:
    """WATCHDOG_PID names the process systemd meant; inherited by another, it asks nothing."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(short_dir / "notify"))
    env = dict(
        os.environ,
        NOTIFY_SOCKET=str(short_dir / "notify"),
        WATCHDOG_USEC="200000",
        WATCHDOG_PID=str(os.getpid()),  # this test's pid, not the daemon's
    )
    d = DaemonProcess(short_dir / "run", ["sim:h100-80gb"], env=env)
    try:
        receive(sock, "READY=1", 30)
        sock.settimeout(1.0)
        msgs = []
        try:
            while True:
                msgs.append(sock.recv(4096).decode())
        except TimeoutError:
            pass
        assert not [m for m in msgs if "WATCHDOG=1" in m.splitlines()]
    finally:
        d.stop()
        sock.close()
