"""Ring heap: allocation-time init values, capacity, exhaustion, peak statistics,
FIFO reuse across scopes (docs/dsl.md; runtime/heap.py)."""

import pytest
import torch

import pto
import pto.language as pl
from pto.errors import BindError, CapacityError, ConfigError, HeapExhaustedError
from pto.runtime.heap import RingHeap

ALIGN = 512


def _run(kernel, *args, heap=1 << 20, check=False):
    return kernel.run(*args, config=pto.RunConfig(heap_bytes=heap, check=check))


# ---- init values -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, value, expect", [
    (pl.FP32, 0, 0.0), (pl.FP32, -1, -1.0), (pl.FP32, 1.5, 1.5), (pl.INT32, 0, 0), (pl.INT32, -1, -1),
    (pl.INT8, -1, -1), (pl.BF16, 0, 0.0), (pl.INT64, 7, 7),
])
def test_init_value_fills_at_allocation(dtype, value, expect):
    @pl.jit
    def k(out: pl.Out[pl.Tensor[[4, 8], dtype]]):
        s = pl.create_tensor([4, 8], dtype, init_value=value)
        with pl.at(name_hint="copy"):
            out[:, :] = s[:, :]
        return out

    out = torch.full((4, 8), 99, dtype=dtype.torch)
    p = _run(k, out, check=True)
    assert (out == expect).all()
    assert p.stats.tasks == 1 and p.stats.edges == 0 and p.stats.init_bytes == 32 * dtype.itemsize


def test_init_value_overwrites_stale_heap_bytes():
    @pl.jit
    def dirty(x: pl.Tensor[[64], pl.FP32]):
        s = pl.create_tensor([64], pl.FP32)
        with pl.at(name_hint="dirty"):
            s[0:64] = x[0:64]

    @pl.jit
    def clean(out: pl.Out[pl.Tensor[[64], pl.FP32]]):
        s = pl.create_tensor([64], pl.FP32, init_value=0)
        with pl.at(name_hint="copy"):
            out[0:64] = s[0:64]
        return out

    _run(dirty, torch.full((64,), 5.0))
    out = torch.ones(64)
    _run(clean, out)
    assert (out == 0).all()


@pytest.mark.parametrize("dtype, value, match", [
    (pl.INT32, 1.5, "float init_value 1.5 on integer dtype"), (pl.INT32, 3.0, "float init_value 3.0 on integer"),
    (pl.INT8, 200, "out of range"),
    (pl.INT32, "0", "must be a number"), (pl.FP32, True, "must be a number"), (pl.BF16, 1.0, "non-zero"),
])
def test_bad_init_value_is_a_bind_error(dtype, value, match):
    @pl.jit
    def k(x: pl.Tensor[[4], pl.FP32]):
        s = pl.create_tensor([4, 4], dtype, init_value=value)

    with pytest.raises(BindError, match=match) as e:
        _run(k, torch.zeros(4))
    assert "'s'" in str(e.value)  # names the tensor (the assignment target)


# ---- capacity -----------------------------------------------------------------------------------------

def test_capacity_bounds_runtime_shapes_before_any_task_runs():
    T = pl.dynamic("T")
    ran = []

    @pl.jit
    def k(x: pl.Tensor[[T, 8], pl.FP32], y: pl.Out[pl.Tensor[[T, 8], pl.FP32]]):
        t = pl.tensor.dim(x, 0)
        scratch = pl.create_tensor([pl.max(t, 16), 8], pl.FP32, capacity=64)
        with pl.at(name_hint="copy"):
            ran.append(1)
            y[:, :] = x[:, :]
        return y

    _run(k, torch.zeros(64, 8), torch.zeros(64, 8))
    assert ran == [1]
    y = torch.full((65, 8), 3.0)
    with pytest.raises(CapacityError, match=r"'scratch'.*dim 0 = 65 exceeds its declared capacity 64"):
        _run(k, torch.ones(65, 8), y)
    assert ran == [1] and (y == 3).all()


def test_capacity_per_dim_list():
    @pl.jit
    def k(x: pl.Tensor[[4], pl.FP32], n: pl.Scalar[pl.INT32]):
        s = pl.create_tensor([4, n], pl.FP32, capacity=[None, 8])

    _run(k, torch.zeros(4), 8)
    with pytest.raises(CapacityError, match="dim 1 = 9"):
        _run(k, torch.zeros(4), 9)


# ---- exhaustion and statistics ------------------------------------------------------------------------------

def test_exhaustion_names_the_request_and_the_high_water_mark():
    @pl.jit
    def k(x: pl.Tensor[[4], pl.FP32]):
        a = pl.create_tensor([256], pl.FP32)   # 1024 bytes
        big = pl.create_tensor([512], pl.FP32)  # 2048 bytes: does not fit in 2048 - 1024

    with pytest.raises(HeapExhaustedError) as e:
        _run(k, torch.zeros(4), heap=2048)
    msg = str(e.value)
    assert "'big' [512] pl.FP32" in msg and "2048 bytes" in msg and "high-water mark 1024 bytes" in msg


def test_heap_size_below_1024_is_a_config_error():
    with pytest.raises(ConfigError, match="1024"):
        pto.RunConfig(heap_bytes=512).validate()


def test_peak_statistics_count_live_aligned_bytes():
    @pl.jit
    def k(x: pl.Tensor[[4], pl.FP32]):
        a = pl.create_tensor([100], pl.FP32)       # 400 -> 512 bytes
        for i in pl.range(3):
            b = pl.create_tensor([300], pl.FP32)   # 1200 -> 1536 bytes, freed each iteration
        c = pl.create_tensor([128], pl.FP32)       # 512 bytes

    p = _run(k, torch.zeros(4))
    assert p.stats.heap_peak_bytes == 512 + 1536
    assert p.stats.scratch_tensors == 5 and p.stats.scratch_bytes == 400 + 3 * 1200 + 512


def test_scope_reuse_lets_a_loop_run_in_a_heap_that_holds_two_iterations():
    @pl.jit
    def k(x: pl.Tensor[[256], pl.FP32], y: pl.Out[pl.Tensor[[256], pl.FP32]]):
        keep = pl.create_tensor([256], pl.FP32, init_value=0)   # lives for the whole program
        for i in pl.range(50):
            tmp = pl.create_tensor([256], pl.FP32)              # freed at the end of each iteration
            with pl.at(name_hint="stage"):
                tmp[0:256] = x[0:256]
            with pl.at(name_hint="acc"):
                keep[0:256] = keep[0:256] + tmp[0:256]
        with pl.at(name_hint="out"):
            y[0:256] = keep[0:256]
        return y

    x = torch.randn(256)
    y = torch.zeros(256)
    p = _run(k, x, y, heap=4096, check=True)
    assert torch.allclose(y, 50 * x, rtol=1e-5, atol=1e-5)
    assert p.stats.heap_peak_bytes == 2048


def test_explicit_pl_scope_frees_its_tensors_and_use_after_free_raises():
    @pl.jit
    def k(x: pl.Tensor[[256], pl.FP32]):
        with pl.scope():
            a = pl.create_tensor([256], pl.FP32, init_value=0)
        with pl.scope():
            b = pl.create_tensor([256], pl.FP32, init_value=0)
        assert a.buf.offset == b.buf.offset == 0  # b reuses a's bytes
        with pl.at(name_hint="late"):
            t = a[0:4]

    with pytest.raises(pto.DslError, match="after its scope ended"):
        _run(k, torch.zeros(256))


# ---- the ring itself ---------------------------------------------------------------------------------

def test_ring_fifo_reclaim_and_wrap():
    h = RingHeap(4096)
    a = h.alloc(1024, "a")
    b = h.alloc(1024, "b")
    c = h.alloc(1024, "c")
    assert (a, b, c) == (0, 1024, 2048)
    h.free(b)                # out of order: b waits for a
    assert h.in_use == 2048
    with pytest.raises(HeapExhaustedError):
        h.alloc(2048, "d")   # 1024 free at the end, b not reclaimed yet
    h.free(a)                # a and b reclaimed
    d = h.alloc(2048, "d")   # 1024 left at the end is too small: wraps to 0
    assert d == 0 and h.peak == 3072


def test_ring_never_overlaps_live_allocations_after_a_wrap():
    h = RingHeap(1024)
    a = h.alloc(512, "a")
    b = h.alloc(512, "b")
    h.free(a)
    c = h.alloc(512, "c")    # wraps into a's bytes
    assert c == 0
    with pytest.raises(HeapExhaustedError):
        h.alloc(512, "d")    # b and c are live: the ring is full


def test_ring_reclaims_the_newest_allocation_first_too():
    h = RingHeap(4096)
    outer = h.alloc(512, "outer")
    for _ in range(100):     # an inner scope: allocate and free at the head
        t = h.alloc(2048, "inner")
        assert t == 512
        h.free(t)
    assert h.in_use == 512


def test_random_alloc_free_sequences_never_overlap():
    import random
    rng = random.Random(0)
    h = RingHeap(8192)
    live = {}
    for _ in range(2000):
        if live and rng.random() < 0.45:
            off = rng.choice(list(live))
            h.free(off)
            del live[off]
        else:
            n = rng.choice([100, 512, 1000, 2048, 3000])
            try:
                off = h.alloc(n, "x")
            except HeapExhaustedError:
                continue
            size = -(-n // ALIGN) * ALIGN
            assert off + size <= 8192
            for o, s in live.items():
                assert off + size <= o or o + s <= off, (off, size, o, s)
            live[off] = size
