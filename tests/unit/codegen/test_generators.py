"""``--check`` of the driver prototype generator: the checked-in table is what it makes now.

Every generator has a ``--check`` mode that regenerates in memory and fails on any difference,
and each runs in the tests: ``gen_cuda_enums`` in tests/unit/api/test_cuda_enums_codegen.py,
``gen_interposer`` in tests/interposer/test_library.py, ``gen_driver_protos`` here. A header
update, a spec edit or a generator change not followed by a regeneration fails, never drifts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crane.codegen import gen_driver_protos

CUDA_INCLUDE = Path("/usr/local/cuda/include")


@pytest.mark.skipif(
    not (CUDA_INCLUDE / "cudaTypedefs.h").exists(), reason=f"no CUDA headers in {CUDA_INCLUDE}"
)
def test_driver_prototypes_are_current() -> None:
    assert gen_driver_protos.main(["--check", "--cuda-include", str(CUDA_INCLUDE)]) == 0, (
        "run: python -m crane.codegen.gen_driver_protos"
    )
