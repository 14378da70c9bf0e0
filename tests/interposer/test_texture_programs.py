"""CUDA arrays, 2D/3D copies, texture and surface objects: a CUDA program built by nvcc at test
time runs through the interposer on the simulated GPU and checks every section against a
host-side reference itself (programs/textures.cu)."""

from __future__ import annotations

import pytest


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
        "graph ok",
        "done cudaSuccess",
    ], r.stdout + r.stderr
    assert "not supported" not in r.stderr.lower(), r.stderr


@pytest.mark.parametrize("how", ["park-restore", "migrate"])
def test_array_and_texture_objects_survive_a_move(program, run_moved, how: str) -> None:
    """Written before the session is parked and restored elsewhere (or migrated live), an
    array and the texture and surface objects over it sample, store and copy correctly after
    the move (programs/texture_park.cu checks every value against the host)."""
    m = run_moved(program("texture_park.cu"), how)
    assert m.first == (
        "before array=cudaSuccess tex=cudaSuccess surf=cudaSuccess sync=cudaSuccess"
    ), m.first
    assert m.returncode == 0, m.stdout + m.stderr
    assert m.stdout.splitlines() == ["after copy=cudaSuccess ok=1"], m.stdout + m.stderr
    assert f"session {m.session}" in m.destination.log_text()  # the second half ran on b


def test_driver_api_arrays(program, run_guest, link_flags) -> None:
    """cuArrayCreate/cuArray3DCreate and descriptors, byte-offset and 2D copies with arrays,
    the documented refusals, texture descriptor queries (programs/arrays_driver.cpp)."""
    r = run_guest(program("arrays_driver.cpp", *link_flags))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "desc w=10 h=6 fmt=2 ch=2 depth=0 flags=0",
        "copies ok=1",
        "refused region=CUDA_ERROR_INVALID_VALUE lod=CUDA_ERROR_INVALID_VALUE "
        "span=CUDA_ERROR_INVALID_VALUE",
        "array3d cube=CUDA_ERROR_INVALID_VALUE channels=CUDA_ERROR_INVALID_VALUE size_ok=1",
        "mipmap size_ok=1 level4=1x1 past=CUDA_ERROR_INVALID_VALUE "
        "destroy_level=CUDA_ERROR_INVALID_HANDLE",
        "tex desc_ok=1 res_ok=1 view=CUDA_ERROR_NOT_SUPPORTED surf=CUDA_ERROR_INVALID_VALUE",
        "destroyed again tex=CUDA_ERROR_INVALID_HANDLE array=CUDA_ERROR_INVALID_HANDLE",
        "ok",
    ], r.stdout + r.stderr
