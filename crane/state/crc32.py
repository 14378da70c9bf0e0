"""CRC-32 (zlib's polynomial, the checkpoint format's checksum) at memory speed.

Why: every byte a checkpoint or a migration round moves is checksummed once when written and
once when read. zlib's own crc32 runs at ~4 GB/s here, which made the checksums the largest
single cost of a migration's stop-and-copy round (~16 ms per 64 MiB on each side); ISA-L's
(the ``isal`` package: SIMD carry-less multiplication) computes the same values at ~20 GB/s.
Without the package, zlib's is used: the values are identical, so either side may lack it.
"""

from __future__ import annotations

__all__ = ["FAST", "crc32"]

try:
    from isal.isal_zlib import crc32

    FAST = True
except ImportError:  # pragma: no cover - exercised where isal is not installed
    from zlib import crc32

    FAST = False
