"""Module images fuzzed through MODULE_LOAD on a live session: mutations (bit flips,
truncation, huge length words, insertions, deletions) of real PTX, fatbin, compressed fatbin and
cubin images built by nvcc, and random bytes. Each load is answered with a CUDA result in time
(an image that still loads is unloaded again), the session keeps serving, the daemon lives."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from crane.api.generated.cuda_enums import CUresult
from crane.guest.handles import HandleKind
from tests.fuzz.conftest import FuzzEnv, fuzz_settings
from tests.fuzz.harness import Fuzzer, op_call
from tests.fuzz.strategies import Mutation, mutate, mutations

KINDS = ["ptx", "fatbin", "fatbin-z", "cubin"]

image_case = st.one_of(
    st.tuples(st.sampled_from(KINDS), mutations, st.booleans()),
    st.tuples(st.sampled_from(KINDS), mutations, st.booleans()),
    st.tuples(st.sampled_from(KINDS), mutations, st.booleans()),
    st.tuples(st.just("random"), st.binary(max_size=4096), st.booleans()),
)


@fuzz_settings("images")
@given(case=image_case)
def test_mutated_and_random_module_images(
    fuzzer: Fuzzer, fuzz_env: FuzzEnv, case: tuple[str, list[Mutation] | bytes, bool]
) -> None:
    kind, how, right_digest = case
    assert fuzzer.pool is not None
    if kind == "random":
        assert isinstance(how, bytes)
        image = how
    else:
        assert isinstance(how, list)
        image = mutate(fuzz_env.images[kind], how)
    digest = hashlib.sha256(image if right_digest else image + b"x").digest()
    module = fuzzer.handle(HandleKind.MODULE)
    assert fuzzer.session is not None
    seq = fuzzer.session.seq + 1  # (run may rotate the session after the case)
    replies = fuzzer.run([op_call("MODULE_LOAD", fuzzer.pool.ctx, module, digest, data=image)])
    assert replies is not None
    load = replies[seq]
    if not right_digest and image:  # (no bytes: the digest alone, which the store lacks)
        assert load.result == CUresult.CUDA_ERROR_INVALID_VALUE, load
    if load.result == 0:
        fuzzer.run([op_call("MODULE_UNLOAD", module)])


def test_the_unmutated_images_load(fuzzer: Fuzzer, fuzz_env: FuzzEnv) -> None:
    """The bases are real, loadable images (so mutations start from something the loader takes
    apart fully); the cubin holds sm_80 code only, which the simulator refuses by name."""
    assert fuzzer.pool is not None
    for kind in KINDS:
        image = fuzz_env.images[kind]
        module = fuzzer.handle(HandleKind.MODULE)
        load = op_call("MODULE_LOAD", fuzzer.pool.ctx, module, hashlib.sha256(image).digest(),
                       data=image)  # fmt: skip
        assert fuzzer.session is not None
        seq = fuzzer.session.seq + 1
        replies = fuzzer.run([load])
        assert replies is not None
        result = replies[seq].result
        want = CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU if kind == "cubin" else 0
        assert result == want, (kind, replies[seq].detail)
        if result == 0:
            fuzzer.run([op_call("MODULE_UNLOAD", module)])
