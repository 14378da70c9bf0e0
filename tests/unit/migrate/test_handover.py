"""The same-host hand-over's socket, without daemons: a descriptor reaches only a peer that
proves it holds the one-time token (both ways), the same-host decision, and what a listener
that goes away leaves behind."""

from __future__ import annotations

import logging
import mmap
import os
import socket
from pathlib import Path

import pytest

from crane.migrate.handover import (
    _FD_HEAD,
    HandoverError,
    Link,
    Listener,
    boot_id,
    refusal,
)

TOKEN = b"t" * 32


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("handover-test", os.MFD_CLOEXEC)
    os.ftruncate(fd, 4096)
    os.pwrite(fd, data, 0)
    return fd


def test_the_descriptor_reaches_the_listener_and_maps_the_same_pages(tmp_path: Path) -> None:
    path = str(tmp_path / "s.handover")
    ls = Listener(path, TOKEN)
    assert os.stat(path).st_mode & 0o777 == 0o600
    fd = _memfd(b"session memory")
    try:
        link = Link(path, TOKEN)
        link.send(7, fd, 4096)
        got, size = ls.take(7)
        assert size == 4096
        with mmap.mmap(got, 4096) as m:
            m[:7] = b"SESSION"  # the same file, not a copy
        os.close(got)
        assert os.pread(fd, 14, 0) == b"SESSION memory"
        link.close()
    finally:
        os.close(fd)
        ls.close()
    assert not os.path.exists(path)


def test_a_listener_without_the_token_never_gets_the_descriptor(tmp_path: Path) -> None:
    """The source checks the destination's proof before passing anything."""
    path = str(tmp_path / "s.handover")
    ls = Listener(path, b"x" * 32)  # someone else's socket at the offered path
    try:
        with pytest.raises(HandoverError, match="does not hold the destination's token"):
            Link(path, TOKEN)
        assert not ls.fds
    finally:
        ls.close()


def test_a_source_without_the_token_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The destination takes a descriptor only after the source proved the token: a peer
    that answers with anything else is dropped, and its descriptor would never be taken."""
    path = str(tmp_path / "s.handover")
    ls = Listener(path, TOKEN)
    try:
        with (
            caplog.at_level(logging.WARNING, "crane.worker"),
            socket.socket(socket.AF_UNIX) as s,
        ):
            s.connect(path)
            s.sendall(b"CRHO" + os.urandom(32))
            assert len(s.recv(64)) == 64  # its proof and its nonce
            s.sendall(os.urandom(32))  # not the HMAC of that nonce under the token
            assert s.recv(1) == b""  # closed on us
        assert "wrong token" in caplog.text
        with pytest.raises(HandoverError, match=r"not handed over within 0\.2 s"):
            ls.take(0, timeout_s=0.2)
    finally:
        ls.close()


def test_a_message_without_a_descriptor_fails_the_hand_over(tmp_path: Path) -> None:
    path = str(tmp_path / "s.handover")
    ls = Listener(path, TOKEN)
    try:
        link = Link(path, TOKEN)
        link.sock.sendall(_FD_HEAD.pack(b"CRFD", 1, 4096))  # no SCM_RIGHTS
        with pytest.raises(HandoverError, match="without its descriptor"):
            ls.take(1)
        link.close()
    finally:
        ls.close()


def test_descriptors_not_taken_are_closed_with_the_listener(tmp_path: Path) -> None:
    path = str(tmp_path / "s.handover")
    ls = Listener(path, TOKEN)
    fd = _memfd(b"x")
    link = Link(path, TOKEN)
    link.send(3, fd, 1)
    ((held, _),) = ls.fds.values()
    ls.close()
    with pytest.raises(OSError):
        os.fstat(held)
    link.close()
    os.close(fd)


def test_same_host_needs_both_boot_ids_equal_and_a_socket() -> None:
    ours = boot_id()
    assert len(ours) == 36  # this kernel's
    assert refusal("/run/x.handover", ours, ours) == ""
    assert "another host" in refusal("/run/x.handover", "0" * 36, ours)
    assert "no hand-over socket" in refusal("", ours, ours)
    assert "unknown" in refusal("/run/x.handover", "", ours)
