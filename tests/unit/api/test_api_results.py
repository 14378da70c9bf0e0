"""crane.api.results: names, descriptions and the CudaError exception."""

from __future__ import annotations

import pickle

import pytest

from crane.api.results import (
    CudaError,
    CUresult,
    error_name,
    error_string,
    raise_for_result,
    to_result,
)

KNOWN = [
    (1, "CUDA_ERROR_INVALID_VALUE", "not within an acceptable range of values"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY", "unable to allocate enough memory"),
    (400, "CUDA_ERROR_INVALID_HANDLE", "resource handle passed to the API call was not valid"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS", "load or store instruction on an invalid memory"),
    (710, "CUDA_ERROR_ASSERT", "device-side assert triggered"),
]


@pytest.mark.parametrize(("code", "name", "fragment"), KNOWN)
def test_error_name_and_string(code: int, name: str, fragment: str) -> None:
    assert error_name(code) == name
    assert fragment in error_string(code)
    assert error_name(CUresult(code)) == name


def test_success_and_unknown_codes() -> None:
    assert error_name(0) == "CUDA_SUCCESS"
    assert error_string(0).startswith("The API call returned with no errors")
    for lookup in (error_name, error_string, to_result):
        with pytest.raises(ValueError, match="12345"):
            lookup(12345)


def test_cuda_error_carries_code_and_message() -> None:
    err = CudaError(2)
    assert err.code is CUresult.CUDA_ERROR_OUT_OF_MEMORY
    assert err.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert err.message == error_string(2)
    assert str(err).startswith("CUDA_ERROR_OUT_OF_MEMORY (2): ")

    custom = CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "cuMemAlloc: size 0")
    assert custom.message == "cuMemAlloc: size 0"
    assert str(custom) == "CUDA_ERROR_INVALID_VALUE (1): cuMemAlloc: size 0"


def test_cuda_error_keeps_codes_unknown_to_the_header() -> None:
    err = CudaError(12345)
    assert err.code == 12345
    assert not isinstance(err.code, CUresult)
    assert err.name == "CUresult(12345)"


def test_cuda_error_pickles() -> None:
    err = pickle.loads(pickle.dumps(CudaError(700, "kernel crashed")))
    assert isinstance(err, CudaError)
    assert err.code is CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    assert err.message == "kernel crashed"


def test_check() -> None:
    raise_for_result(0)
    raise_for_result(CUresult.CUDA_SUCCESS)
    with pytest.raises(CudaError) as info:
        raise_for_result(400, "cuStreamSynchronize")
    assert info.value.code is CUresult.CUDA_ERROR_INVALID_HANDLE
