"""``crane baseline ADDR... [-o FILE] [--name NAME]``: the device model a pool can honour.

As ``virsh cpu-baseline`` does for CPUs: it asks each daemon for its devices (Control
ListDevices: every attribute each physical device reports) and writes the model every one
of them can present (:func:`crane.device.presented.baseline`), as a model file
(:mod:`crane.device.model_file`). Daemons started with ``--backend SPEC@FILE`` then tell
their guests the same limits, so those guests can move anywhere in the pool.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc

from crane.cli.control_client import ControlClient
from crane.cli.inventory import rpc_failure
from crane.device.model import DeviceModel
from crane.device.model_file import model_to_toml
from crane.device.presented import baseline

__all__ = ["add_parser", "cmd_baseline"]


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Registers ``crane baseline`` (main.py's one line)."""
    b = sub.add_parser(
        "baseline", help="write the device model every device of several daemons can present"
    )
    b.add_argument("addresses", nargs="+", metavar="ADDR", help="daemon addresses")
    b.add_argument("-o", "--output", help="model file to write (default: standard output)")
    b.add_argument(
        "--name", default="baseline", help="the model's key (crane ps, checkpoints; %(default)s)"
    )
    b.add_argument("--device-name", default="", help="the device name guests are told")
    b.set_defaults(func=cmd_baseline)


def _devices(address: str) -> list[DeviceModel]:
    """Each device of the daemon at ``address`` as it reports itself (physical)."""
    with ControlClient(address) as c:
        reply = c.devices()
    out = []
    for d in reply.devices:
        out.append(
            DeviceModel(
                key=f"{address}#{d.index}",
                name=d.name,
                compute_capability=(d.cc_major, d.cc_minor),
                total_mem=d.total_mem,
                attributes=dict(d.attributes),
            )
        )
    return out


def cmd_baseline(args: argparse.Namespace) -> int:
    models: list[DeviceModel] = []
    for address in args.addresses:
        try:
            found = _devices(address)
        except grpc.RpcError as e:
            print(f"crane: {rpc_failure(e, address)}", file=sys.stderr)
            return 1
        except ValueError as e:  # a device reporting an incomplete set of attributes
            print(f"crane: {address}: {e}", file=sys.stderr)
            return 1
        if not found:
            print(f"crane: the daemon at {address} serves no device", file=sys.stderr)
            return 1
        models += found
    try:
        model = baseline(models, args.name, args.device_name)
    except ValueError as e:
        print(f"crane: {e}", file=sys.stderr)
        return 1
    text = model_to_toml(model)
    if not args.output:
        sys.stdout.write(text)
        return 0
    tmp = f"{args.output}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, args.output)
    print(
        f"{args.output}: model {model.key} ({model.name}, compute capability "
        f"{model.compute_capability[0]}.{model.compute_capability[1]}, "
        f"{model.total_mem >> 20} MiB) from {len(models)} device(s)",
        file=sys.stderr,
    )
    return 0
