"""VM live migration with GPU state vs the same VM's migration without a CUDA program, one run.

    python benchmarks/bench_vm_migrate.py [--rounds 3] [--json FILE]

Two libvirtd (started by hand in private namespaces, tests/vm/libvirt_lab.py) and two craned
(sim:a100-80gb, sim:h100-80gb) on this machine, the libvirt hook installed on both; a TCG guest
built by vm-images/ runs ``migrate_loop`` (a CUDA program: kernels following device pointers
stored in device memory, a module variable, a tick line every ~150 ms) under Crane's library
over ``vm://`` (QEMU's guest forward to its domain's socket). After its 6th tick
``crane migrate DOMAIN`` (:class:`crane.vm.migrate.VmMigration`, what the CLI runs) moves the
VM and its GPU state to the other host. The baseline is the same VM, same image, memory and
tick cadence, running a shell loop instead of the CUDA program (no Crane session): what libvirt
alone costs. Each round runs both, alternating which goes first, after one unmeasured warm-up
migration (the first migration to a libvirtd pays its capabilities probe, ~4 s).

Reported per run: total time of the migration (VmMigration from call to result: pre-flight,
GPU pre-copy, libvirt's migration, commit), the VM's downtime as libvirt measured it (its
completed job's ``downtime``), the GPU final round (stop to acknowledgement) and the program's
visible pause (the longest gap between two tick lines, stamped on the host as they reach the
serial log, minus the median gap), and whether the migrated program's output equals an
unmigrated run's. Ratios are CUDA VM / VM alone, each against the median of the same run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crane.vm.migrate import VmMigration
from tests.vm.image import ensure_image, missing_tools
from tests.vm.libvirt_lab import lab_missing
from tests.vm.vmlab import Guest, Lab, lab

MIGRATE_AT = r"^tick 5\b"


def _gaps(g: Guest) -> tuple[float, float]:
    """The longest gap between tick lines and the median one (seconds, host clock)."""
    t = [x for x, _ in g.ticks()]
    gaps = [b - a for a, b in itertools.pairwise(t)]
    return max(gaps), statistics.median(gaps)


def one(x: Lab, program: bool, reference: list[str] | None) -> dict[str, Any]:
    """Start a guest on host a, move it to host b mid-run, and measure."""
    g = x.start(x.a, program=program)
    g.wait_for(MIGRATE_AT, 180)
    mig = VmMigration(
        domain=g.name,
        source_uri=x.a.libvirt.uri,
        dest_uri=x.b.libvirt.uri,
        dest_daemon=x.b.daemon.address,
        migrate_uri="tcp://127.0.0.1",
        listen_address="127.0.0.1",
    )
    t0 = time.perf_counter()
    result = mig.run()
    total = time.perf_counter() - t0
    out = g.output()
    longest, typical = _gaps(g)
    sessions = result.get("sessions") or []
    return {
        "program": "cuda" if program else "none",
        "total_s": round(total, 3),
        "vm_downtime_ms": round((result.get("vm_downtime_s") or 0.0) * 1e3, 1),
        "gpu_final_round_ms": (round(sessions[0]["switchover_s"] * 1e3, 1) if sessions else None),
        "longest_gap_s": round(longest, 3),
        "median_gap_s": round(typical, 3),
        "visible_pause_s": round(longest - typical, 3),
        "output_identical": None if reference is None else out == reference,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "vm_migrate.json"))
    args = p.parse_args()
    why = ", ".join(missing_tools()) or lab_missing()
    if why:
        print(f"bench_vm_migrate: cannot run here: {why} (scripts/vm_deps.sh)", file=sys.stderr)
        return 2
    image = ensure_image()
    results: list[dict[str, Any]] = []
    tmp = tempfile.TemporaryDirectory(prefix="crane-bench-vm-", dir=os.environ.get("TMPDIR"))
    with tmp as d, lab(Path(d), image) as x:
        reference = x.start(x.a).output()  # the program's output in a VM that never moves
        one(x, False, None)  # warm-up: libvirt's first incoming migration probes
        for r in range(args.rounds):
            for program in (True, False) if r % 2 == 0 else (False, True):
                m = one(x, program, reference if program else None)
                m["round"] = r
                results.append(m)
                print(json.dumps(m), flush=True)
    ratios = {}
    for key in ("total_s", "vm_downtime_ms", "visible_pause_s"):
        cuda = statistics.median(m[key] for m in results if m["program"] == "cuda")
        none = statistics.median(m[key] for m in results if m["program"] == "none")
        ratios[key] = {"cuda": cuda, "none": none, "ratio": round(cuda / none, 2) if none else None}
    print(json.dumps({"medians": ratios}, indent=2))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"results": results, "medians": ratios}, indent=2))
    return 0 if all(m["output_identical"] is not False for m in results) else 1


if __name__ == "__main__":
    sys.exit(main())
