"""``crane restore`` runs a migration destination's pre-flight checks, with every reason at once,
before any memory moves: limits lower than the guest was told, no usable code for the device's
architecture, too little free device memory. The identity the guest was told travels in the
checkpoint (format 2), so a restored session keeps answering with it and a second checkpoint
carries it on; format 1 files still restore, their source device standing in for it."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import grpc
import pytest

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.backends.sim.profiles import get_profile
from crane.cli.control_client import ControlClient
from crane.cli.main import main as crane_main
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.state.checkpoint import MAGIC, CheckpointReader, Kind, read_meta
from crane.v1 import guest_pb2, guest_pb2_grpc
from crane.wire.channel import open_channel
from crane.wire.fingerprint import fingerprint

SMEM_OPTIN = int(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
A100_OPTIN, H100_OPTIN = 166912, 232448


def _refused(address: str, path: Path) -> str:
    with ControlClient(address, timeout=None) as c, pytest.raises(grpc.RpcError) as e:
        c.restore(str(path))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
    with ControlClient(address) as c:
        assert list(c.sessions().sessions) == []  # nothing left behind
        assert all(d.used_mem == 0 for d in c.devices().devices)
    return e.value.details()


def _checkpoint(address: str, sid: str, path: Path, release: bool = False) -> None:
    with ControlClient(address, timeout=None) as c:
        c.checkpoint(sid, str(path), release=release)


def test_every_reason_at_once_and_the_cli_says_it(
    daemons: tuple[DaemonProcess, DaemonProcess],
    image_sm90_only: bytes,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    h100, a100 = daemons
    ckpt = tmp_path / "h.ckpt"
    with GuestSession(h100.address) as s:
        s.module_load(image_sm90_only)
        s.mem_alloc(1 << 20)
        _checkpoint(h100.address, s.session_id, ckpt)
    why = _refused(a100.address, ckpt)
    assert (
        "device 0 (a100-80gb, sm_80) offers less than the guest was told: "
        f"max shared memory per block (opt-in) (told {H100_OPTIN}, offered {A100_OPTIN})"
    ) in why
    assert "no usable code for device 0 (a100-80gb, sm_80)" in why
    assert "CUDA_ERROR_NO_BINARY_FOR_GPU" in why
    assert crane_main(["restore", str(ckpt), "--daemon", a100.address]) == 1
    err = capsys.readouterr().err
    assert "restore of" in err and "max shared memory per block (opt-in)" in err
    assert "Restore refused" in a100.log_text()


def test_too_little_free_memory(
    daemons: tuple[DaemonProcess, DaemonProcess], tmp_path: Path
) -> None:
    h100, a100 = daemons
    ckpt = tmp_path / "m.ckpt"
    with GuestSession(a100.address) as s:
        s.mem_alloc(64 << 20)
        _checkpoint(a100.address, s.session_id, ckpt)
    total = get_profile("h100-80gb").total_mem
    with GuestSession(h100.address, client="hog") as hog:
        hog.mem_alloc(total - (32 << 20))  # committed (mapped), never touched: costs nothing
        hog.synchronize()
        with ControlClient(h100.address, timeout=None) as c:
            free = total - c.devices().devices[0].used_mem
            with pytest.raises(grpc.RpcError) as e:
                c.restore(str(ckpt))
            assert [x.client for x in c.sessions().sessions] == ["hog"]
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        f"too little free device memory: the session holds 64 MiB, device 0 (h100-80gb, sm_90) "
        f"has {free >> 20} MiB free"
    ) in e.value.details()


def _resume_reply(address: str, sid: str, token: bytes) -> guest_pb2.OpenSessionReply:
    with open_channel(address) as ch:
        req = guest_pb2.ResumeRequest(session_id=sid, resume_token=token, fingerprint=fingerprint())
        return guest_pb2_grpc.GuestStub(ch).Resume(req, timeout=10)


def test_a_restored_session_keeps_what_its_guest_was_told(
    daemons: tuple[DaemonProcess, DaemonProcess], tmp_path: Path
) -> None:
    """A100 -> file -> H100 -> file -> A100: the second file still says what the A100 told the
    guest, so the way back is allowed (it would be refused were the H100's limits recorded)."""
    h100, a100 = daemons
    first, second = tmp_path / "1.ckpt", tmp_path / "2.ckpt"
    with GuestSession(a100.address, client="round trip", alternates=[h100.address]) as s:
        told = s.device
        assert told.attributes[SMEM_OPTIN] == A100_OPTIN
        p = s.mem_alloc(1 << 20)
        s.memset_d32(p, 0x1234, 1 << 18)
        s.synchronize()
        _checkpoint(a100.address, s.session_id, first, release=True)
        meta = read_meta(first.open("rb"))
        assert meta["session"]["told"][str(SMEM_OPTIN)] == A100_OPTIN
        assert meta["session"]["device"]["name"] == told.name == "NVIDIA A100-SXM4-80GB"
        assert meta["mem_needed"] >= 1 << 20
        with ControlClient(h100.address, timeout=None) as c:
            c.restore(str(first))
        reply = _resume_reply(h100.address, s.session_id, s._t.opened.resume_token)
        assert reply.device.name == told.name and reply.device.uuid == told.uuid
        assert reply.device.attributes[SMEM_OPTIN] == A100_OPTIN  # not the H100's 232448
        assert s.memcpy_dtoh(p, 4) == struct.pack("<I", 0x1234)  # resumed on the H100
        assert s._t.address == h100.address
        _checkpoint(h100.address, s.session_id, second, release=True)
        meta = read_meta(second.open("rb"))
        assert meta["session"]["told"][str(SMEM_OPTIN)] == A100_OPTIN
        assert meta["session"]["device"]["name"] == told.name
        assert meta["source"]["profile"] == "h100-80gb"
        with ControlClient(a100.address, timeout=None) as c:
            c.restore(str(second))  # back where it started: what it was told is offered
        assert s.memcpy_dtoh(p, 4) == struct.pack("<I", 0x1234)
        assert s._t.address == a100.address


def _as_format_1(src: Path, dst: Path) -> None:
    """Rewrite a checkpoint as a build before format 2 wrote it: version 1 in the header, META
    without what the guest was told or the memory it needs (the layout is the same)."""
    out = bytearray(struct.pack("<8sHH", MAGIC, 1, 16))
    out += struct.pack("<I", zlib.crc32(bytes(out)))
    with src.open("rb") as f:
        r = CheckpointReader(f)
        while True:
            s = r.next()
            payload = s.payload
            if s.kind == Kind.META:
                meta = json.loads(payload)
                del meta["mem_needed"], meta["session"]["told"], meta["session"]["device"]
                payload = json.dumps(meta).encode()
            crc = zlib.crc32(payload, zlib.crc32(struct.pack("<HHQ", s.kind, 0, len(payload))))
            out += struct.pack("<HHIQ", s.kind, 0, crc, len(payload)) + payload
            if s.kind == Kind.END:
                break
    dst.write_bytes(bytes(out))


def test_format_1_files_restore_with_their_source_device_standing_in(
    daemons: tuple[DaemonProcess, DaemonProcess], tmp_path: Path
) -> None:
    h100, a100 = daemons
    for daemon, name in ((a100, "a"), (h100, "h")):
        with GuestSession(daemon.address) as s:
            p = s.mem_alloc(3 << 20)
            s.memset_d8(p, 5, 3 << 20)
            _checkpoint(daemon.address, s.session_id, tmp_path / f"{name}2.ckpt")
        _as_format_1(tmp_path / f"{name}2.ckpt", tmp_path / f"{name}1.ckpt")
    assert CheckpointReader((tmp_path / "a1.ckpt").open("rb")).version == 1
    with ControlClient(h100.address, timeout=None) as c:
        c.restore(str(tmp_path / "a1.ckpt"))  # A100 -> H100: allowed
        assert len(c.sessions().sessions) == 1
        assert c.devices().devices[0].used_mem >= 3 << 20
    assert "a1.ckpt is a format 1 checkpoint" in h100.log_text()
    assert "those of its source device (a100-80gb)" in h100.log_text()
    why = _refused(a100.address, tmp_path / "h1.ckpt")  # H100 -> A100: the H100 told more
    assert f"(told {H100_OPTIN}, offered {A100_OPTIN})" in why
