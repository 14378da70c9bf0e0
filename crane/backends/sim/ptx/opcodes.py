"""The opcode table: every PTX mnemonic the interpreter accepts, its decoder and its class.

One table, as gpgpu-sim's ``opcodes.def``: a mnemonic not listed here is refused when the module
loads (``PtxUnsupported`` naming the instruction and line). Decoders live in small modules by
class — ``ops_int`` (integer ALU), ``ops_bits`` (bit manipulation), ``ops_float`` (float ALU),
``ops_move`` (mov/cvt/compare/select), ``ops_sfu`` (special functions), ``ops_mem`` (memory,
atomics), ``ops_mbarrier`` and ``ops_bulk`` (mbarrier, bulk asynchronous copies),
``ops_control`` (branches, calls, barriers), ``ops_cluster`` (cluster barriers, distributed
shared memory addressing), ``ops_warp`` (warp-level), ``ops_mma``, ``ops_wmma``,
``ops_ldmatrix`` (tensor-core matrix instructions), ``ops_tex`` (texture
instructions), ``ops_surf`` (surface instructions). Mnemonics
shared by integer and float forms (``add``, ``mul``, ``min`` ...) dispatch on the type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import ops_bits as bits
from . import ops_bulk as bulk
from . import ops_cluster as cluster
from . import ops_control as ctl
from . import ops_float as flt
from . import ops_int as alu
from . import ops_ldmatrix as ldm
from . import ops_mbarrier as mbar
from . import ops_mem as mem
from . import ops_mma as mma
from . import ops_move as mov
from . import ops_sfu as sfu
from . import ops_surf as surf
from . import ops_tex as tex
from . import ops_warp as warp
from . import ops_wmma as wmma
from .ops_common import Mods
from .ptxtypes import TYPES

__all__ = ["OPCODES", "OpSpec", "supported_mnemonics"]


@dataclass(frozen=True)
class OpSpec:
    name: str
    cls: str  # "alu", "float", "move", "sfu", "memory", "control", "warp"
    decode: Callable


_FLOAT_KINDS = ("f", "h", "bh", "h2", "bh2")


def _st(ctx, mods) -> None:
    """``st.async`` (a store completing on an mbarrier) to the cluster module, others to st."""
    if "async" in mods:
        return cluster.dec_st_async(ctx, mods)
    return mem.dec_st(ctx, mods)


def _red(ctx, mods) -> None:
    """``red.async`` (a reduction completing on an mbarrier) to the cluster module."""
    if "async" in mods:
        return cluster.dec_red_async(ctx, mods)
    return mem.dec_red(ctx, mods)


def _barrier(ctx, mods) -> None:
    """``barrier.cluster.*`` to the cluster barrier, every other ``barrier`` to bar's."""
    if "cluster" in mods:
        m = Mods(ctx, mods)
        m.take("cluster")
        return cluster.dec_barrier_cluster(ctx, m)
    return ctl.dec_bar(ctx, mods)


def _by_type(int_dec: Callable, float_dec: Callable) -> Callable:
    """Decoder that picks the integer or float form from the type modifier."""

    def dec(ctx, mods):
        ts = [TYPES[m] for m in mods if m in TYPES]
        if ts and ts[-1].kind in _FLOAT_KINDS:
            return float_dec(ctx, mods)
        return int_dec(ctx, mods)

    return dec


def _float_only(dec: Callable) -> Callable:
    def d(ctx, mods):
        ts = [TYPES[m] for m in mods if m in TYPES]
        if not ts or ts[-1].kind not in _FLOAT_KINDS:
            raise ctx.unsupported(f"`{ctx.pins.opcode}`")
        return dec(ctx, mods)

    return d


_TABLE: list[tuple[str, str, Callable]] = [
    # ---- integer / bit ALU (float forms dispatch by type) ----
    ("add", "alu", _by_type(alu.dec_add, flt.dec_fadd)),
    ("sub", "alu", _by_type(alu.dec_sub, flt.dec_fsub)),
    ("addc", "alu", alu.dec_addc),
    ("subc", "alu", alu.dec_subc),
    ("mul", "alu", _by_type(alu.dec_mul, flt.dec_fmul)),
    ("mad", "alu", _by_type(alu.dec_mad, flt.dec_ffma)),
    ("madc", "alu", alu.dec_madc),
    ("mul24", "alu", alu.dec_mul24),
    ("mad24", "alu", alu.dec_mad24),
    ("div", "alu", _by_type(alu.dec_div, flt.dec_fdiv)),
    ("rem", "alu", alu.dec_rem),
    ("abs", "alu", _by_type(alu.dec_abs, flt.dec_fabs)),
    ("neg", "alu", _by_type(alu.dec_neg, flt.dec_fneg)),
    ("min", "alu", _by_type(alu.dec_min, flt.dec_fmin)),
    ("max", "alu", _by_type(alu.dec_max, flt.dec_fmax)),
    ("and", "alu", alu.dec_logic("and")),
    ("or", "alu", alu.dec_logic("or")),
    ("xor", "alu", alu.dec_logic("xor")),
    ("not", "alu", alu.dec_not),
    ("cnot", "alu", alu.dec_cnot),
    ("shl", "alu", alu.dec_shl),
    ("shr", "alu", alu.dec_shr),
    ("popc", "alu", bits.dec_popc),
    ("clz", "alu", bits.dec_clz),
    ("brev", "alu", bits.dec_brev),
    ("bfind", "alu", bits.dec_bfind),
    ("bfe", "alu", bits.dec_bfe),
    ("bfi", "alu", bits.dec_bfi),
    ("prmt", "alu", bits.dec_prmt),
    ("sad", "alu", bits.dec_sad),
    ("dp4a", "alu", bits.dec_dp4a),
    ("dp2a", "alu", bits.dec_dp2a),
    ("shf", "alu", bits.dec_shf),
    ("lop3", "alu", bits.dec_lop3),
    ("bmsk", "alu", bits.dec_bmsk),
    ("szext", "alu", bits.dec_szext),
    # ---- float ALU ----
    ("fma", "float", _float_only(flt.dec_ffma)),
    ("copysign", "float", flt.dec_copysign),
    ("testp", "float", flt.dec_testp),
    # ---- special functions ----
    ("rcp", "sfu", sfu.dec_rcp),
    ("sqrt", "sfu", sfu.dec_sqrt),
    ("rsqrt", "sfu", sfu.dec_rsqrt),
    ("ex2", "sfu", sfu.dec_ex2),
    ("lg2", "sfu", sfu.dec_lg2),
    ("sin", "sfu", sfu.dec_sin),
    ("cos", "sfu", sfu.dec_cos),
    ("tanh", "sfu", sfu.dec_tanh),
    # ---- move / convert / compare / select ----
    ("mov", "move", mov.dec_mov),
    ("cvt", "move", mov.dec_cvt),
    ("setp", "move", mov.dec_setp),
    ("set", "move", mov.dec_set),
    ("selp", "move", mov.dec_selp),
    ("slct", "move", mov.dec_slct),
    # ---- memory ----
    ("ld", "memory", mem.dec_ld),
    ("ldu", "memory", mem.dec_ld),
    ("st", "memory", _st),
    ("cvta", "memory", mem.dec_cvta),
    ("isspacep", "memory", mem.dec_isspacep),
    ("atom", "memory", mem.dec_atom),
    ("red", "memory", _red),
    ("prefetch", "memory", mem.dec_prefetch),
    ("prefetchu", "memory", mem.dec_prefetch),
    ("cp", "memory", bulk.dec_cp),
    ("mbarrier", "memory", mbar.dec_mbarrier),
    ("mapa", "memory", cluster.dec_mapa),
    ("getctarank", "memory", cluster.dec_getctarank),
    # ---- control ----
    ("bra", "control", ctl.dec_bra),
    ("brx", "control", ctl.dec_brx),
    ("call", "control", ctl.dec_call),
    ("ret", "control", ctl.dec_ret),
    ("exit", "control", ctl.dec_exit),
    ("trap", "control", ctl.dec_trap),
    ("brkpt", "control", ctl.dec_trap),
    ("bar", "control", ctl.dec_bar),
    ("barrier", "control", _barrier),
    ("membar", "control", ctl.dec_nop),
    ("fence", "control", ctl.dec_nop),
    ("nanosleep", "control", ctl.dec_nop),
    ("pmevent", "control", ctl.dec_nop),
    ("griddepcontrol", "control", ctl.dec_nop),
    # ---- warp-level ----
    ("shfl", "warp", warp.dec_shfl),
    ("vote", "warp", warp.dec_vote),
    ("activemask", "warp", warp.dec_activemask),
    ("redux", "warp", warp.dec_redux),
    ("match", "warp", warp.dec_match),
    ("elect", "warp", warp.dec_elect),
    ("mma", "warp", mma.dec_mma),
    ("wmma", "warp", wmma.dec_wmma),
    ("ldmatrix", "warp", ldm.dec_ldmatrix),
    ("stmatrix", "warp", ldm.dec_stmatrix),
    ("movmatrix", "warp", ldm.dec_movmatrix),
    # ---- texture / surface (texture objects; descriptors in device memory) ----
    ("tex", "texture", tex.dec_tex),
    ("tld4", "texture", tex.dec_tld4),
    ("suld", "texture", surf.dec_suld),
    ("sust", "texture", surf.dec_sust),
    ("txq", "texture", tex.dec_txq),
    ("suq", "texture", surf.dec_suq),
]

OPCODES: dict[str, OpSpec] = {name: OpSpec(name, cls, dec) for name, cls, dec in _TABLE}


def supported_mnemonics() -> list[str]:
    return sorted(OPCODES)
