"""serve/frontends.py's hand-off: the arena's first-fit blocks, and a job's data put in shared memory and read back
where it lies."""

from __future__ import annotations

import numpy as np

from inception_engine.serve.frontends import ALIGN, Arena, pack, unpack


def test_arena_first_fit_reuses_the_lowest_free_place_and_says_when_full():
    a = Arena(10 * ALIGN)
    first, second, third = a.alloc(1), a.alloc(3 * ALIGN), a.alloc(ALIGN + 1)
    assert (first, second, third) == (0, ALIGN, 4 * ALIGN)
    a.free(second)
    assert a.alloc(2 * ALIGN) == ALIGN  # the gap left by the freed block, not the end
    assert a.alloc(ALIGN) == 3 * ALIGN  # the rest of that gap
    assert a.alloc(5 * ALIGN) is None  # 4 blocks left at the end: too few
    assert a.alloc(4 * ALIGN) == 6 * ALIGN
    assert a.alloc(1) is None
    for at in (0, ALIGN, 3 * ALIGN, 4 * ALIGN, 6 * ALIGN):
        a.free(at)
    assert a.used == 0 and a.alloc(10 * ALIGN) == 0


def test_pack_and_unpack_give_the_same_images_and_arrays():
    buf = memoryview(bytearray(1 << 16))
    a = Arena(len(buf))
    images = [b"\xff\xd8jpeg", memoryview(b"x" * 1000)[10:500], b""]
    where, block = pack("encoded", images, a, buf)
    assert where[0] == "shm" and block == 0
    assert [bytes(v) for v in unpack(where, buf)] == [bytes(i) for i in images]
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    where, block = pack("tensor", x[:, ::-1], a, buf)  # not contiguous: copied as it reads
    assert block is not None and block > 0
    np.testing.assert_array_equal(unpack(where, buf), x[:, ::-1])


def test_a_job_larger_than_the_free_space_travels_in_the_message():
    buf = memoryview(bytearray(4 * ALIGN))
    a = Arena(len(buf))
    where, block = pack("encoded", [b"y" * (5 * ALIGN)], a, buf)
    assert where[0] == "inline" and block is None and unpack(where, buf) == [b"y" * (5 * ALIGN)]
    pixels = np.ones((1, 16, 16, 3), np.uint8)  # 768 bytes: more than the arena
    where, block = pack("pixels", pixels, a, buf)
    assert where[0] == "inline" and block is None
    np.testing.assert_array_equal(unpack(where, buf), pixels)
