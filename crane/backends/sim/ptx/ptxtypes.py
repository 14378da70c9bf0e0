"""PTX fundamental types and how they map onto NumPy.

Register storage is by bit width only (8- and 16-bit registers share 16-bit storage; see
:mod:`.state`); an instruction's type selects the NumPy *view* of that storage, so ``mov.b32``
between an ``.f32`` and a ``.b32`` register is a bit copy, as in hardware. Packed half types
(``.f16x2``/``.bf16x2``) live in 32-bit registers and are unpacked by the instructions that
use them. ``.f16``/``.bf16`` values are kept as their raw 16-bit patterns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FLOAT", "SINT", "TYPES", "UINT", "PtxType", "ptx_type"]


@dataclass(frozen=True, slots=True)
class PtxType:
    name: str  # "u32", "f16x2", "pred" ...
    kind: str  # "u", "s", "b", "f", "h" (f16), "bh" (bf16), "pred"
    bits: int
    dtype: np.dtype  # the NumPy view used for values of this type

    @property
    def size(self) -> int:
        return max(self.bits // 8, 1)

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_signed(self) -> bool:
        return self.kind == "s"


UINT = {
    8: np.dtype(np.uint8),
    16: np.dtype(np.uint16),
    32: np.dtype(np.uint32),
    64: np.dtype(np.uint64),
}
SINT = {
    8: np.dtype(np.int8),
    16: np.dtype(np.int16),
    32: np.dtype(np.int32),
    64: np.dtype(np.int64),
}
FLOAT = {32: np.dtype(np.float32), 64: np.dtype(np.float64)}

TYPES: dict[str, PtxType] = {}
for _bits in (8, 16, 32, 64):
    TYPES[f"u{_bits}"] = PtxType(f"u{_bits}", "u", _bits, UINT[_bits])
    TYPES[f"s{_bits}"] = PtxType(f"s{_bits}", "s", _bits, SINT[_bits])
    TYPES[f"b{_bits}"] = PtxType(f"b{_bits}", "b", _bits, UINT[_bits])
TYPES["b128"] = PtxType("b128", "b", 128, UINT[64])
TYPES["f32"] = PtxType("f32", "f", 32, FLOAT[32])
TYPES["f64"] = PtxType("f64", "f", 64, FLOAT[64])
TYPES["f16"] = PtxType("f16", "h", 16, UINT[16])
TYPES["bf16"] = PtxType("bf16", "bh", 16, UINT[16])
TYPES["f16x2"] = PtxType("f16x2", "h2", 32, UINT[32])
TYPES["bf16x2"] = PtxType("bf16x2", "bh2", 32, UINT[32])
TYPES["pred"] = PtxType("pred", "pred", 1, np.dtype(np.bool_))


def ptx_type(name: str) -> PtxType | None:
    """The type named ``name`` (without the dot), or None."""
    return TYPES.get(name)
