"""A crane client running as another user: ``python -m tests.integration.as_user UID ACTION``.

Imports everything it needs while still root (the interpreter lives where only root may read),
then drops to ``UID`` (its group the same number, no supplementary groups) before it connects,
so the daemon's ident socket sees that uid, as it would any other local user's process. Prints
one JSON line of results; ``open`` then holds its session until its stdin closes.

Actions (the daemon address is ``$CRANE_DAEMON``):

* ``open``: open a session, write and read back 1 MiB; prints ``id``, ``token``, the ``path``
  its calls took (direct or relay) and whether the memory read back ``ok``.
* ``probe SID TOKEN [DIRECT]``: what each operation on that session answers this user: ``ps``
  (the sessions it sees), ``devices``, ``resume``, ``checkpoint``, ``migrate``, and connecting
  to the worker's socket ``DIRECT``, each as ``[code, details]`` (``["OK", ...]``: allowed).
"""

from __future__ import annotations

import json
import os
import socket
import sys

import grpc

from crane.cli.control_client import ControlClient
from crane.cli.migrate import migrate
from crane.guest.session import GuestSession
from crane.v1 import guest_pb2, guest_pb2_grpc
from crane.wire.channel import open_channel
from crane.wire.fingerprint import fingerprint


def _outcome(fn) -> list[str]:  # type: ignore[no-untyped-def]
    try:
        return ["OK", str(fn())]
    except grpc.RpcError as e:
        return [e.code().name, e.details() or ""]
    except Exception as e:  # a CudaError from GuestSession: its message carries the reason
        return ["ERROR", str(e)]


def probe(address: str, sid: str, token: bytes, direct: str = "") -> dict[str, list[str]]:
    """Every operation on session ``sid`` as this process's identity (its uid on a unix socket,
    its ``$CRANE_TLS_*`` certificate on TCP): ``[code, details]`` each; ``direct``: the path of
    the session worker's socket, to try connecting there too."""
    out: dict[str, list[str]] = {}
    # the worker's gRPC socket, and its call ring's handshake socket beside it
    for key, path in (("direct", direct), ("ring", direct + ".ring")) if direct else ():
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(path)
            out[key] = ["OK", path]
        except OSError as e:
            out[key] = [type(e).__name__, str(e)]
    with ControlClient(address) as c:
        out["devices"] = _outcome(lambda: len(c.devices().devices))
        out["ps"] = _outcome(lambda: [(s.id, s.tenant) for s in c.sessions().sessions])
        out["checkpoint"] = _outcome(lambda: c.checkpoint(sid, f"/tmp/{sid}.ckpt", False))
        out["restore"] = _outcome(lambda: c.restore(f"/tmp/{sid}.ckpt"))
    out["migrate"] = _outcome(lambda: migrate(address, sid, address)[-1].phase)
    with open_channel(address) as ch:
        stub = guest_pb2_grpc.GuestStub(ch)
        req = guest_pb2.ResumeRequest(session_id=sid, resume_token=token, fingerprint=fingerprint())
        out["resume"] = _outcome(lambda: stub.Resume(req, timeout=10).session_id)
        req = guest_pb2.ResumeRequest(session_id=sid, fingerprint=fingerprint())
        out["resume_without_token"] = _outcome(lambda: stub.Resume(req, timeout=10).session_id)

    def open_and_close() -> str:
        with GuestSession(address, client="probe", direct=False) as s:
            return s.session_id

    out["open"] = _outcome(open_and_close)
    return out


def main() -> int:
    uid, action, *rest = sys.argv[1:]
    os.setgroups([])
    os.setgid(int(uid))
    os.setuid(int(uid))
    address = os.environ["CRANE_DAEMON"]
    if action == "open":
        s = GuestSession(address, client="as-user")
        p = s.mem_alloc(1 << 20)
        s.memset_d8(p, 3, 1 << 20)
        ok = s.memcpy_dtoh(p, 4) == b"\x03" * 4
        token = s._t.opened.resume_token.hex()
        print(json.dumps({"id": s.session_id, "token": token, "path": s._t.path, "ok": ok}))
        sys.stdout.flush()
        sys.stdin.read()
        s.close()
        return 0
    sid, token, *direct = rest
    print(json.dumps(probe(address, sid, bytes.fromhex(token), *direct)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
