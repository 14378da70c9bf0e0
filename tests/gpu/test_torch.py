"""PyTorch through the interposer: ``crane run -- python tests/gpu/scripts/torch_workload.py``
against the same script run natively. cuBLAS matrix products must match within float tolerance
(bit-identical is expected on the same GPU and is reported), a small MLP's training losses and
final weights within rtol 1e-4."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from crane.craned.launcher import DaemonProcess
from tests.gpu.conftest import SCRIPTS
from tests.gpu.harness import Target, close_mismatches, run_crane, run_native

#: the first test also waits for both runs of the script (the fixture)
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

SCRIPT = SCRIPTS / "torch_workload.py"
#: (rtol, atol) per product; half precision results are rounded to 8-11 bits of mantissa
TOLERANCE = {"fp16": (1e-2, 1e-2), "bf16": (2e-2, 2e-2)}
DEFAULT_TOL = (1e-4, 1e-5)
LOSS_RTOL = 1e-4


def _load(d: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    res = json.loads((d / "results.json").read_text())
    return res, {p.stem: np.load(p) for p in sorted(d.glob("*.npy"))}


@pytest.fixture(scope="module")
def torch_runs(target: Target, daemon_a: DaemonProcess, guest_lib: Path, tmp_path_factory):  # type: ignore[no-untyped-def]
    if target.simulated:
        pytest.skip("plumbing mode: PyTorch's kernels are machine code the simulator cannot run")
    if importlib.util.find_spec("torch") is None:
        pytest.skip(f"torch is not importable by {sys.executable}")
    d = tmp_path_factory.mktemp("torch")
    nat = run_native([sys.executable, SCRIPT, "--out", d / "native"], timeout=300)
    assert nat.returncode == 0, "the native run failed:\n" + nat.describe()
    got = run_crane(daemon_a.address, [sys.executable, SCRIPT, "--out", d / "crane"], timeout=300)
    assert got.returncode == 0, "the run through Crane failed:\n" + got.describe(4000)
    return _load(d / "native"), _load(d / "crane")


def test_device_identity_matches_native(torch_runs) -> None:  # type: ignore[no-untyped-def]
    (want, _), (got, _) = torch_runs
    for key in ("device", "capability", "total_memory", "multi_processor_count", "cuda"):
        assert got[key] == want[key], f"{key}: Crane {got[key]!r}, native {want[key]!r}"


def test_cublas_matmuls_match_native(torch_runs, record_property) -> None:  # type: ignore[no-untyped-def]
    (_, want), (_, got) = torch_runs
    products = sorted(k for k in want if k.startswith("mm_"))
    assert products and sorted(k for k in got if k.startswith("mm_")) == products
    problems, identical = [], []
    for k in products:
        rtol, atol = TOLERANCE.get(k.removeprefix("mm_"), DEFAULT_TOL)
        bad = close_mismatches(want[k], got[k], rtol, atol)
        if bad:
            problems.append(f"{k}: {bad}")
        if np.array_equal(want[k], got[k], equal_nan=True):
            identical.append(k)
    record_property("bit_identical_products", ",".join(identical))
    print(f"bit-identical to native: {len(identical)}/{len(products)} {identical}")
    assert not problems, "\n".join(problems)


def test_mlp_training_matches_native(torch_runs) -> None:  # type: ignore[no-untyped-def]
    (want, wa), (got, ga) = torch_runs
    w, g = np.array(want["losses"]), np.array(got["losses"])
    assert len(w) == len(g) > 1 and np.all(np.isfinite(w))
    bad = close_mismatches(w, g, LOSS_RTOL, 0.0)
    assert bad is None, f"losses: {bad}\nnative {w.tolist()}\nCrane  {g.tolist()}"
    bad = close_mismatches(wa["mlp_params"], ga["mlp_params"], LOSS_RTOL, 1e-6)
    assert bad is None, f"final weights: {bad}"
    assert w[-1] < w[0], "the model did not learn (native run): the check would be vacuous"
