"""blas_threads: OpenBLAS held at one thread inside the block and restored after, also on errors."""

from __future__ import annotations

import pytest

from inception_engine.backends.blas_threads import openblas_threads, single_threaded_blas

control = openblas_threads()
pytestmark = pytest.mark.skipif(control is None, reason="NumPy's BLAS here is not an OpenBLAS we can control")


@pytest.fixture
def blas():
    get, set_ = control
    before = get()
    yield get, set_
    set_(before)


@pytest.mark.parametrize("outside", [1, 2, 3])
def test_one_thread_inside_and_restored_after(blas, outside):
    get, set_ = blas
    set_(outside)
    assert get() == outside
    with single_threaded_blas():
        assert get() == 1
    assert get() == outside


def test_restored_after_an_error(blas):
    get, set_ = blas
    set_(2)
    with pytest.raises(RuntimeError):
        with single_threaded_blas():
            raise RuntimeError("inside")
    assert get() == 2
