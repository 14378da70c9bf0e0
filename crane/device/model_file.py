"""Device model files: a :class:`DeviceModel` as a small TOML document an operator can read.

Why a file: ``crane baseline`` computes the model every device of a pool can honour, and each
daemon of the pool must be able to present exactly that model (``--backend SPEC@FILE``), as
libvirt's CPU models are XML an operator can keep and review. TOML because craned's own
configuration is TOML and Python reads it without a dependency. The format::

    key = "pool-baseline"               # the model's name (crane ps, checkpoints, the UUID)
    name = "NVIDIA A100-SXM4-40GB"      # cuDeviceGetName's answer
    compute_capability = [8, 0]         # optional: the physical device's when left out
    total_mem = 42298834944             # bytes; a device presents min(this, its own)
    provenance = "crane baseline of ..."  # optional free text

    [attributes]                        # every CUdevice_attribute the model answers,
    MAX_THREADS_PER_BLOCK = 1024        # by its cuda.h name without CU_DEVICE_ATTRIBUTE_
    ...                                 # (the full name is accepted too)

A model must answer every attribute cudart 13 reads at start-up (:class:`DeviceModel` says
which are missing). The compute-capability attributes follow ``compute_capability``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.device.model import DeviceModel

__all__ = [
    "ModelFileError",
    "attribute_name",
    "model_from_dict",
    "model_to_dict",
    "model_to_toml",
    "read_model_file",
]

_PREFIX = "CU_DEVICE_ATTRIBUTE_"
_CC = (
    int(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
    int(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
)


class ModelFileError(ValueError):
    """A model file that cannot be read, or does not describe a complete device."""


def attribute_name(attribute: int) -> str:
    """The short cuda.h name of ``attribute`` (``MAX_THREADS_PER_BLOCK``)."""
    try:
        return A(int(attribute)).name.removeprefix(_PREFIX)
    except ValueError:
        return f"attribute {int(attribute)}"


def _attribute_value(name: str) -> int:
    full = name if name.startswith(_PREFIX) else _PREFIX + name
    try:
        return int(A[full.upper()])
    except KeyError:
        raise ModelFileError(f"unknown device attribute {name!r}") from None


def model_to_dict(model: DeviceModel) -> dict[str, Any]:
    """The model as plain data (the file's content; also how a worker is handed it)."""
    return {
        "key": model.key,
        "name": model.name,
        "compute_capability": list(model.compute_capability),
        "total_mem": int(model.total_mem),
        "provenance": model.provenance,
        "attributes": {
            attribute_name(a): int(v) for a, v in sorted(model.attributes.items()) if a not in _CC
        },
    }


def model_from_dict(
    data: Mapping[str, Any], source: str, default_cc: tuple[int, int] | None = None
) -> DeviceModel:
    """The model ``data`` describes (``source`` names it in errors). ``default_cc``: the
    compute capability of a model that states none (the physical device's)."""
    try:
        key = str(data["key"])
        name = str(data["name"])
        total_mem = int(data["total_mem"])
        raw = data.get("compute_capability")
        if raw is None:
            if default_cc is None:
                raise ModelFileError(f"{source}: compute_capability is missing")
            cc = default_cc
        else:
            major, minor = (int(x) for x in raw)
            cc = (major, minor)
        attrs_in = data.get("attributes") or {}
        if not isinstance(attrs_in, Mapping):
            raise ModelFileError(f"{source}: [attributes] must be a table of NAME = value")
        attributes = {_attribute_value(str(k)): int(v) for k, v in attrs_in.items()}
    except ModelFileError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"{source}: malformed device model: {e!r}") from None
    attributes[_CC[0]], attributes[_CC[1]] = cc
    try:
        return DeviceModel(key, name, cc, total_mem, attributes, str(data.get("provenance", "")))
    except ValueError as e:
        raise ModelFileError(f"{source}: {e}") from None


def model_to_toml(model: DeviceModel) -> str:
    """The model file's text (what ``crane baseline`` writes)."""
    d = model_to_dict(model)
    lines = [
        "# A Crane device model: craned --backend SPEC@THIS_FILE presents it to guests.",
        f"key = {_toml_str(d['key'])}",
        f"name = {_toml_str(d['name'])}",
        "compute_capability = [{}, {}]".format(*d["compute_capability"]),
        f"total_mem = {d['total_mem']}",
    ]
    if d["provenance"]:
        lines.append(f"provenance = {_toml_str(d['provenance'])}")
    lines += ["", "[attributes]"]
    lines += [f"{k} = {v}" for k, v in d["attributes"].items()]
    return "\n".join(lines) + "\n"


def _toml_str(s: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's for these characters)."""
    out = s.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in out) + '"'


def read_model_file(path: str | Path, default_cc: tuple[int, int] | None = None) -> DeviceModel:
    """The model in the TOML file ``path``; :class:`ModelFileError` says what is wrong."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise ModelFileError(f"device model file {path}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ModelFileError(f"device model file {path}: not TOML: {e}") from None
    return model_from_dict(data, f"device model file {path}", default_cc)
