"""CUDA arrays, 2D/3D copies, texture and surface objects: a CUDA program built by nvcc at test
time runs through the interposer on the simulated GPU and checks every section against a
host-side reference itself (programs/textures.cu)."""

from __future__ import annotations


def test_arrays_textures_surfaces(program, run_guest) -> None:
    r = run_guest(program("textures.cu"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "rotate ok",
        "array3d ok",
        "layered ok",
        "surface ok",
        "gather ok",
        "normalized ok",
        "linear ok",
        "mipmap ok",
        "done cudaSuccess",
    ], r.stdout + r.stderr
