"""The C kernels (commlib._kernels through commlib.kernels) against numpy / ml_dtypes references.

Every check runs on both the SIMD loops and the portable ones (``portable=True``), and additionally
checks that the two paths agree bit for bit (conversions and scaling: NaN payloads included; reductions:
any NaN matches any NaN, since IEEE leaves open which payload NaN + NaN keeps). Sizes cover the SIMD
tails.
"""

import ml_dtypes
import numpy as np
import pytest

from commlib import kernels
from commlib.dtypes import UnsupportedDtypeError
from commlib.errors import CommlibError
from commlib.ops import ReduceOp

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
HALVES = (F16, BF16)
FLOATS = (F16, BF16, F32, F64)
INTS = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.int32, np.int64))
BOOL = np.dtype(np.bool_)
SIZES = (0, 1, 7, 8, 16, 31, 32, 1000, 65537)  # around the 8- and 16-element SIMD blocks
OPS = (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)
PATHS = pytest.mark.parametrize("portable", [False, True], ids=["simd", "portable"])
NP_OPS = {ReduceOp.SUM: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.PRODUCT: np.multiply}
# casting NaN between float types warns in some numpy/ml_dtypes versions; the NaNs are intended here
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(UINT[a.dtype.itemsize])


def isnan(a: np.ndarray) -> np.ndarray:
    return np.isnan(a.astype(np.float64)) if a.dtype.kind != "f" else np.isnan(a)


def assert_same(got: np.ndarray, ref: np.ndarray, what: str, zero_sign: bool = True) -> None:
    """Bit-identical except that any NaN matches any NaN; with ``zero_sign=False`` -0.0 matches +0.0
    (numpy itself is inconsistent about which zero np.maximum(-0.0, 0.0) returns)."""
    assert got.dtype == ref.dtype and got.shape == ref.shape, what
    if got.dtype.kind in "iub":
        bad = got != ref
    else:
        gn, rn = isnan(got), isnan(ref)
        bad = gn != rn
        both = ~gn & ~rn
        if zero_sign:
            bad |= both & (bits(got) != bits(ref))
        else:
            bad |= both & (got.astype(np.float64) != ref.astype(np.float64))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        pytest.fail(f"{what}: {int(bad.sum())} element(s) differ; first at [{i}]: got {got.flat[i]!r} "
                    f"(bits {bits(got).flat[i]:#x}), expected {ref.flat[i]!r} (bits {bits(ref).flat[i]:#x})")


def random_values(dtype: np.dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    """Ordinary values mixed with random bit patterns (which bring NaN payloads, infs, subnormals, -0.0)
    and a few chosen specials."""
    if dtype == BOOL:
        return rng.random(n) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=n, endpoint=True, dtype=dtype)
    plain = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 100.0], size=n)).astype(dtype)
    raw = rng.integers(0, 1 << (8 * dtype.itemsize), size=n, dtype=UINT[dtype.itemsize]).view(dtype)
    out = np.where(rng.random(n) < 0.7, plain, raw).astype(dtype)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0], dtype=np.float64).astype(dtype)
    k = min(n, len(specials))
    out[rng.choice(n, size=k, replace=False)] = specials[:k] if n else specials[:0]
    return out


def reference_reduce(a: np.ndarray, b: np.ndarray, op: ReduceOp) -> np.ndarray:
    """The documented rule: half types widen to float32, operate, round once; others as numpy."""
    with np.errstate(all="ignore"):
        if a.dtype in HALVES:
            return NP_OPS[op](a.astype(F32), b.astype(F32)).astype(a.dtype)
        return NP_OPS[op](a, b)


# ---------------------------------------------------------------------------------------------------- reduce_


@PATHS
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", FLOATS + INTS + (BOOL,), ids=str)
def test_reduce_matches_numpy(dtype, op, portable):
    rng = np.random.default_rng([dtype.num, int(op), 7])
    for n in SIZES:
        a, b = random_values(dtype, n, rng), random_values(dtype, n, rng)
        ref = reference_reduce(a, b, op)
        got = a.copy()
        kernels.reduce_(got, b, op, portable=portable)
        assert_same(got, ref, f"reduce_ {dtype} {op.name} n={n}", zero_sign=op in (ReduceOp.SUM, ReduceOp.PRODUCT))
        if not portable:
            other = a.copy()
            kernels.reduce_(other, b, op, portable=True)
            # identical bits, except which NaN comes out of NaN + NaN (IEEE leaves it open; compilers swap)
            assert_same(got, other, f"simd != portable: {dtype} {op.name} n={n}")


@PATHS
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_reduce_min_max_nan_and_zero_ties(dtype, portable):
    a = np.array([np.nan, 1.0, np.nan, -0.0, 0.0, 2.0, -np.inf, np.inf] * 5, dtype=np.float64).astype(dtype)
    b = np.array([1.0, np.nan, np.nan, 0.0, -0.0, -3.0, 5.0, 5.0] * 5, dtype=np.float64).astype(dtype)
    for op, fn in ((ReduceOp.MIN, np.fmin), (ReduceOp.MAX, np.fmax)):
        got = a.copy()
        kernels.reduce_(got, b, op, portable=portable)
        nan = np.isnan(a.astype(F64)) | np.isnan(b.astype(F64))
        np.testing.assert_array_equal(np.isnan(got.astype(F64)), nan, err_msg=f"{op.name} must propagate NaN")
        np.testing.assert_array_equal(got.astype(F64)[~nan], fn(a, b).astype(F64)[~nan])
        # equal operands (-0.0 vs +0.0): the result is src's, bit for bit
        ties = (a.astype(F64) == b.astype(F64)) & ~nan
        np.testing.assert_array_equal(bits(got)[ties], bits(b)[ties])


@PATHS
def test_reduce_half_accumulates_in_float32_and_rounds_once(portable):
    # 2048 + 1 in float16: exactly between 2048 and 2050 -> ties to even 2048; 2050 + 1 -> 2052
    a = np.array([2048, 2050, 65504, 65504, -65504] * 3, dtype=F16)
    b = np.array([1, 1, 8, 16, -16] * 3, dtype=F16)
    kernels.reduce_(a, b, ReduceOp.SUM, portable=portable)
    np.testing.assert_array_equal(a.astype(F32), np.array([2048, 2052, 65504, np.inf, -np.inf] * 3, F32))
    # bfloat16: 256 + 1 ties to 256, 258 + 1 ties to 260
    c = np.array([256, 258] * 9, dtype=BF16)
    kernels.reduce_(c, np.ones(18, BF16), ReduceOp.SUM, portable=portable)
    np.testing.assert_array_equal(c.astype(F32), np.array([256, 260] * 9, F32))


@PATHS
def test_reduce_integer_wraps(portable):
    for dtype in INTS:
        info = np.iinfo(dtype)
        a = np.full(33, info.max, dtype)
        kernels.reduce_(a, np.ones(33, dtype), ReduceOp.SUM, portable=portable)
        np.testing.assert_array_equal(a, np.full(33, info.min, dtype))
        b = np.full(33, info.max, dtype)
        kernels.reduce_(b, np.full(33, 2, dtype), ReduceOp.PRODUCT, portable=portable)
        np.testing.assert_array_equal(b, np.multiply(np.full(33, info.max, dtype), np.full(33, 2, dtype)))


def test_reduce_average_is_sum_and_accepts_names():
    a, b = np.arange(10, dtype=F32), np.ones(10, F32)
    kernels.reduce_(a, b, ReduceOp.AVERAGE)
    np.testing.assert_array_equal(a, np.arange(10, dtype=F32) + 1)
    kernels.reduce_(a, b, "max")
    np.testing.assert_array_equal(a, np.arange(10, dtype=F32) + 1)


@PATHS
def test_reduce_same_array_and_any_shape(portable):
    a = np.arange(24, dtype=F16).reshape(2, 3, 4)
    kernels.reduce_(a, a, ReduceOp.SUM, portable=portable)
    np.testing.assert_array_equal(a, (np.arange(24, dtype=F32) * 2).astype(F16).reshape(2, 3, 4))


# --------------------------------------------------------------------------------------- reduce_widened_


@PATHS
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("half", HALVES, ids=str)
def test_reduce_widened_matches_numpy(half, op, portable):
    rng = np.random.default_rng([half.num, int(op), 11])
    for n in SIZES:
        acc, src = random_values(F32, n, rng), random_values(half, n, rng)
        with np.errstate(all="ignore"):
            ref = NP_OPS[op](acc, src.astype(F32))
        got = acc.copy()
        kernels.reduce_widened_(got, src, op, portable=portable)
        assert_same(got, ref, f"reduce_widened_ {half} {op.name} n={n}", zero_sign=op in (ReduceOp.SUM, ReduceOp.PRODUCT))
        if not portable:
            other = acc.copy()
            kernels.reduce_widened_(other, src, op, portable=True)
            assert_same(got, other, f"simd != portable: {half} {op.name} n={n}")


@PATHS
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("half", HALVES, ids=str)
def test_reduce_widened_dst_scale_is_scale_then_reduce(half, op, portable):
    """dst_scale folds a scale_ pass into the reduction: bit for bit ``(dst * float32(s)) op float32(src)``
    with the product rounded first (no fused multiply-add)."""
    rng = np.random.default_rng([half.num, int(op), 12])
    for dst_scale in (0.5, 1 / 3, -7.0, 1.0):
        for n in SIZES:
            acc, src = random_values(F32, n, rng), random_values(half, n, rng)
            with np.errstate(all="ignore"):
                ref = NP_OPS[op](acc * np.float32(dst_scale), src.astype(F32))
            got = acc.copy()
            kernels.reduce_widened_(got, src, op, dst_scale=dst_scale, portable=portable)
            assert_same(got, ref, f"reduce_widened_ dst_scale={dst_scale} {half} {op.name} n={n}",
                        zero_sign=op in (ReduceOp.SUM, ReduceOp.PRODUCT))
            if not portable:
                other = acc.copy()
                kernels.reduce_widened_(other, src, op, dst_scale=dst_scale, portable=True)
                assert_same(got, other, f"simd != portable: dst_scale={dst_scale} {half} {op.name} n={n}")


# ----------------------------------------------------------------------------------------------- scale_


@PATHS
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_scale_matches_numpy(dtype, portable):
    rng = np.random.default_rng([dtype.num, 13])
    for factor in (1.0, 0.5, 1 / 3, -2.0, 1e-3, 0.0, 1e30):
        for n in SIZES:
            buf = random_values(dtype, n, rng)
            with np.errstate(all="ignore"):
                if dtype == F64:
                    ref = buf * factor
                else:  # float32 and halves: multiply by float32(factor) in float32, round once
                    ref = (buf.astype(F32) * np.float32(factor)).astype(dtype)
            got = buf.copy()
            kernels.scale_(got, factor, portable=portable)
            assert_same(got, ref, f"scale_ {dtype} by {factor} n={n}")
            if not portable:
                other = buf.copy()
                kernels.scale_(other, factor, portable=True)
                np.testing.assert_array_equal(bits(got), bits(other), err_msg=f"simd != portable: {dtype} {factor}")


@PATHS
@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_scale_integers_as_horovod(dtype, portable):
    """Horovod scales integers on the CPU as ``T(double(factor) * x)``: truncated toward zero."""
    info = np.iinfo(dtype)
    values = np.array([0, 1, -1, 3, -3, 7, -7, 100, -100, info.max, info.min, info.max - 1], np.int64)
    values = values[(values >= info.min) & (values <= info.max)].astype(dtype)
    for factor in (0.5, 1 / 3, 2.0, -0.75, 0.999999):
        got = values.copy()
        kernels.scale_(got, factor, portable=portable)
        products = np.float64(factor) * values.astype(np.float64)
        saturated = [min(max(int(np.trunc(p)), -2 ** 63), 2 ** 63 - 1) for p in products]  # at int64's range
        want = np.array(saturated, np.int64).astype(dtype)  # then wrapped, as numpy's astype
        np.testing.assert_array_equal(got, want, err_msg=f"{dtype} * {factor}")


def test_scale_rejects_bool():
    with pytest.raises(TypeError, match="dtype bool is not supported by scale_"):
        kernels.scale_(np.ones(4, np.bool_), 2.0)


# ------------------------------------------------------------------------------------ to_half/from_half


def f32_from_bits(values) -> np.ndarray:
    return np.array(values, dtype=np.uint32).view(F32)


@PATHS
@pytest.mark.parametrize("half", HALVES, ids=str)
def test_to_half_matches_astype(half, portable):
    rng = np.random.default_rng([half.num, 17])
    for scale in (1.0, 0.25, 1 / 3, -3.0, 1e-6, 1e4, 1e30):
        for n in SIZES:
            src = random_values(F32, n, rng)
            if n:  # values around both formats' overflow thresholds
                src[: min(n, 6)] = np.array([65504, 65519.99, 65520, -65520, 3.3895e38, 3.39e38], F32)[: min(n, 6)]
            with np.errstate(all="ignore"):
                y = src * np.float32(scale)
                ref = y.astype(half)
            dst = np.empty(n, half)
            count = kernels.to_half(src, dst, scale, portable=portable)
            assert_same(dst, ref, f"to_half {half} scale={scale} n={n}")
            expected = int(np.sum(np.isfinite(y) & np.isinf(ref.astype(F32))))
            assert count == expected, f"to_half {half} scale={scale} n={n}: overflow count {count}, expected {expected}"
            if not portable:
                other = np.empty(n, half)
                assert kernels.to_half(src, other, scale, portable=True) == count
                np.testing.assert_array_equal(bits(dst), bits(other), err_msg=f"simd != portable: {half} {scale}")


@PATHS
def test_to_float16_overflow_and_specials(portable):
    src = np.array([65504, 65519.99, 65520, 70000, -1e5, np.inf, -np.inf, np.nan, -0.0, 1e-8, 3e-8, 6e-8] * 3, F32)
    dst = np.empty(src.size, F16)
    assert kernels.to_half(src, dst, portable=portable) == 3 * 3  # 65520, 70000, -1e5; not the infs
    with np.errstate(over="ignore"):
        assert_same(dst, src.astype(F16), "to_half float16 specials")
    expected = [65504, 65504, np.inf, np.inf, -np.inf, np.inf, -np.inf, np.nan, -0.0, 0.0, 2.0**-24, 2.0**-24]
    np.testing.assert_array_equal(dst[:12].astype(F64), expected)
    assert np.signbit(dst[8]) and not np.signbit(dst[9])
    # a scale that pushes in-range values over the limit counts them; one that overflows float32 does not
    assert kernels.to_half(np.full(20, 1000, F32), np.empty(20, F16), 100.0, portable=portable) == 20
    assert kernels.to_half(np.full(20, 1e30, F32), np.empty(20, F16), 1e30, portable=portable) == 0


@PATHS
def test_to_bfloat16_ties_nan_and_overflow(portable):
    # low 16 bits exactly half an ulp: ties go to the even neighbour
    src = f32_from_bits([0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000, 0x3F808001, 0x3F807FFF] * 3)
    dst = np.empty(src.size, BF16)
    assert kernels.to_half(src, dst, portable=portable) == 0
    np.testing.assert_array_equal(bits(dst), np.array([0x3F80, 0x3F82, 0xBF80, 0xBF82, 0x3F81, 0x3F80] * 3, np.uint16))
    np.testing.assert_array_equal(bits(dst), bits(src.astype(BF16)))
    # NaNs whose payload would carry into the exponent with plain rounding (inf, or wrap to -0.0)
    nans = f32_from_bits([0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0x7F80FFFF] * 3)
    out = np.empty(nans.size, BF16)
    assert kernels.to_half(nans, out, portable=portable) == 0
    assert np.isnan(out.astype(F32)).all(), bits(out)
    # largest finite bfloat16 is 0x7F7F (3.3895e38); half an ulp above it ties to even -> inf
    big = f32_from_bits([0x7F7F7FFF, 0x7F7F8000, 0xFF7FFFFF, 0x7F800000] * 3)
    res = np.empty(big.size, BF16)
    assert kernels.to_half(big, res, portable=portable) == 2 * 3
    np.testing.assert_array_equal(bits(res), np.array([0x7F7F, 0x7F80, 0xFF80, 0x7F80] * 3, np.uint16))


@PATHS
def test_to_half_subnormals(portable):
    # every float16 subnormal and its midpoints, as float32
    k = np.arange(0, 1025, dtype=np.float64)
    src = np.concatenate([k, k + 0.5, k + 0.25, -(k + 0.5)]).astype(F32) * np.float32(2.0**-24)
    for half in HALVES:
        dst = np.empty(src.size, half)
        kernels.to_half(src, dst, portable=portable)
        assert_same(dst, src.astype(half), f"to_half subnormals {half}")
    tiny = f32_from_bits([0x00000001, 0x80000001, 0x007FFFFF, 0x00400000])  # float32 subnormals
    out = np.empty(4, BF16)
    kernels.to_half(tiny, out, portable=portable)
    assert_same(out, tiny.astype(BF16), "to_half float32 subnormals -> bfloat16")


@PATHS
@pytest.mark.parametrize("half", HALVES, ids=str)
def test_from_half_matches_astype(half, portable):
    rng = np.random.default_rng([half.num, 19])
    everything = np.arange(1 << 16, dtype=np.uint16).view(half)  # every bit pattern
    for scale in (1.0, 0.5, 1 / 3, -4.0, 1e30):
        for src in [random_values(half, n, rng) for n in SIZES] + [everything]:
            with np.errstate(all="ignore"):
                ref = src.astype(F32) * np.float32(scale)
            dst = np.empty(src.size, F32)
            kernels.from_half(src, dst, scale, portable=portable)
            assert_same(dst, ref, f"from_half {half} scale={scale} n={src.size}")
            if not portable:
                other = np.empty(src.size, F32)
                kernels.from_half(src, other, scale, portable=True)
                np.testing.assert_array_equal(bits(dst), bits(other), err_msg=f"simd != portable: {half} {scale}")


@PATHS
def test_half_round_trip_is_exact(portable):
    for half in HALVES:
        every = np.arange(1 << 16, dtype=np.uint16).view(half)
        wide = np.empty(every.size, F32)
        kernels.from_half(every, wide, portable=portable)
        back = np.empty(every.size, half)
        assert kernels.to_half(wide, back, portable=portable) == 0
        nan = np.isnan(every.astype(F32))
        np.testing.assert_array_equal(bits(back)[~nan], bits(every)[~nan])
        assert np.isnan(back.astype(F32)[nan]).all()


@PATHS
@pytest.mark.parametrize("half", HALVES, ids=str)
def test_round_trip_is_encode_then_decode(half, portable):
    """round_trip_ = to_half then from_half in one pass: same wire bits, same float32 bits, same count."""
    rng = np.random.default_rng([half.num, 23])
    for scale, post in ((1.0, 1.0), (0.5, 1.0), (1.0, 3.0), (1 / 3, 3.0), (100.0, 0.25)):
        for n in SIZES:
            with np.errstate(all="ignore"):
                src = random_values(F32, n, rng) * np.float32(rng.choice([1.0, 1e4]))
            src[: n // 10] = 70000.0  # some overflow float16 (and, times 100, still not bfloat16)
            wire_ref = np.empty(n, half)
            count_ref = kernels.to_half(src, wire_ref, scale)
            ref = np.empty(n, F32)
            kernels.from_half(wire_ref, ref, post)
            buf, wire = src.copy(), np.empty(n, half)
            count = kernels.round_trip_(buf, wire, scale, post, portable=portable)
            what = f"round_trip_ {half} scale={scale} post={post} n={n}"
            np.testing.assert_array_equal(bits(wire), bits(wire_ref), err_msg=what)
            np.testing.assert_array_equal(bits(buf), bits(ref), err_msg=what)
            assert count == count_ref, f"{what}: overflow count {count}, expected {count_ref}"


@PATHS
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("half", HALVES, ids=str)
@pytest.mark.parametrize("round_dst", [False, True], ids=["dst_as_is", "dst_rounded"])
def test_reduce_round_trip_is_reduce_then_round_trip(half, op, portable, round_dst):
    """reduce_round_trip_ = reduce_widened_ (with dst_scale) then round_trip_ (scale 1, postscale), in one
    pass; with round_dst, round_trip_ (dst_scale) first and an unscaled reduce; src and wire may be the same
    array."""
    rng = np.random.default_rng([half.num, int(op), 29])
    for dst_scale, post in ((1.0, 1.0), (0.5, 1.0), (1.0, 4.0), (1 / 3, 3.0)):
        for n in SIZES:
            with np.errstate(all="ignore"):
                acc = random_values(F32, n, rng) * np.float32(rng.choice([1.0, 1e4]))
            src = random_values(half, n, rng)
            ref = acc.copy()
            wire_ref = np.empty(n, half)
            count_ref = 0
            if round_dst:
                count_ref += kernels.round_trip_(ref, wire_ref, dst_scale, 1.0)
                kernels.reduce_widened_(ref, src, op)
            else:
                kernels.reduce_widened_(ref, src, op, dst_scale=dst_scale)
            count_ref += kernels.round_trip_(ref, wire_ref, 1.0, post)
            what = f"reduce_round_trip_ {half} {op.name} dst_scale={dst_scale} post={post} n={n} {round_dst=}"
            for same in (False, True):
                got, wire = acc.copy(), (src.copy() if same else np.empty(n, half))
                count = kernels.reduce_round_trip_(got, wire if same else src, wire, op, dst_scale=dst_scale,
                                                   postscale=post, round_dst=round_dst, portable=portable)
                assert_same(got, ref, what)
                assert_same(wire, wire_ref, what)
                assert count == count_ref, f"{what}: overflow count {count}, expected {count_ref}"


# ----------------------------------------------------------------------------------------------- errors


def test_errors_name_the_problem():
    f32, f16 = np.ones(8, F32), np.ones(8, F16)
    with pytest.raises(TypeError, match="dst is float32 but src is float64"):
        kernels.reduce_(f32, np.ones(8, F64), ReduceOp.SUM)
    with pytest.raises(ValueError, match="dst has 8 elements .* but src has 9"):
        kernels.reduce_(f32, np.ones(9, F32), ReduceOp.SUM)
    with pytest.raises(CommlibError, match="src: buffer is not contiguous"):
        kernels.reduce_(f32, np.ones(16, F32)[::2], ReduceOp.SUM)
    with pytest.raises(CommlibError, match="dst: buffer is not contiguous"):
        kernels.to_half(np.ones(8, F32), np.ones(16, F16)[::2])
    ro = np.ones(8, F32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="dst: array is read-only"):
        kernels.reduce_(ro, f32, ReduceOp.SUM)
    with pytest.raises(ValueError, match="buf: array is read-only"):
        kernels.scale_(ro, 2.0)
    for bad in (np.ones(8, np.complex64), np.ones(8, np.uint32), np.ones(8, np.uint16)):
        with pytest.raises(UnsupportedDtypeError, match=f"dtype {bad.dtype} is not supported by reduce_"):
            kernels.reduce_(bad, bad.copy(), ReduceOp.SUM)
    with pytest.raises(UnsupportedDtypeError, match="dtype complex64 is not supported by scale_"):
        kernels.scale_(np.ones(8, np.complex64), 2.0)
    with pytest.raises(UnsupportedDtypeError, match="src: to_half needs a float32 array, got float64"):
        kernels.to_half(np.ones(8, F64), f16)
    with pytest.raises(UnsupportedDtypeError, match="dst: dtype int8 is not supported by to_half"):
        kernels.to_half(f32, np.ones(8, np.int8))
    with pytest.raises(UnsupportedDtypeError, match="src: dtype float32 is not supported by from_half"):
        kernels.from_half(f32, f32.copy())
    with pytest.raises(UnsupportedDtypeError, match="dst: from_half needs a float32 array, got float16"):
        kernels.from_half(f16, f16.copy())
    with pytest.raises(UnsupportedDtypeError, match="wire: dtype float32 is not supported by round_trip_"):
        kernels.round_trip_(f32, f32.copy())
    with pytest.raises(ValueError, match="buf: array is read-only"):
        kernels.round_trip_(np.frombuffer(np.ones(8, F32).tobytes(), F32), f16)
    with pytest.raises(ValueError, match="buf has 8 elements"):
        kernels.round_trip_(f32, np.ones(4, F16))
    with pytest.raises(TypeError, match="src is float16 but wire is bfloat16"):
        kernels.reduce_round_trip_(f32, f16, np.ones(8, BF16), ReduceOp.SUM)
    with pytest.raises(ValueError, match="dst has 8 elements .* but wire has 4"):
        kernels.reduce_round_trip_(f32, f16, np.ones(4, F16), ReduceOp.SUM)
    with pytest.raises(UnsupportedDtypeError, match="dst: reduce_widened_ needs a float32 array"):
        kernels.reduce_widened_(np.ones(8, F64), f16, ReduceOp.SUM)
    with pytest.raises(ValueError, match="dst has 8 elements .* but src has 4"):
        kernels.from_half(np.ones(4, F16), f32)
    with pytest.raises(TypeError, match="expected a numpy array, got list"):
        kernels.reduce_([1.0], f32, ReduceOp.SUM)
    with pytest.raises(ValueError, match="unknown reduction op"):
        kernels.reduce_(f32, f32.copy(), "bogus")


def test_c_layer_checks_memory_safety():
    """The extension re-checks what memory safety depends on, whatever the Python layer passed."""
    from commlib import _kernels

    whole = np.arange(16, dtype=F32)
    with pytest.raises(ValueError, match="overlap partially"):
        kernels.reduce_(whole[:8], whole[4:12], ReduceOp.SUM)
    raw = np.zeros(33, np.uint8)
    unaligned = raw[1:].view(F32)  # 8 float32 at an odd address
    with pytest.raises(ValueError, match="not made of aligned 4-byte elements"):
        kernels.reduce_(unaligned, np.ones(8, F32), ReduceOp.SUM)
    with pytest.raises(ValueError, match="dst has 4 elements but src has 8"):
        _kernels.reduce(np.ones(4, F32), np.ones(4, F64), _kernels.FLOAT32, 0, False)  # wrong dtype code
    with pytest.raises(ValueError, match="buf: need a writable C-contiguous buffer"):
        _kernels.scale(bytes(8), _kernels.FLOAT32, 2.0, False)
    with pytest.raises(TypeError, match="expected a float16 or bfloat16 buffer, got float32"):
        _kernels.to_half(np.ones(4, F32), np.ones(4, F32), _kernels.FLOAT32, 1.0, False)
    with pytest.raises(ValueError, match="unknown kernel op 1"):
        _kernels.reduce(np.ones(4, F32), np.ones(4, F32), _kernels.FLOAT32, 1, False)


def test_cpu_features():
    features = kernels.cpu_features()
    assert set(features) == {"f16c", "avx2", "avx512f", "simd"}
    assert all(isinstance(v, bool) for v in features.values())
    assert features["simd"] == (features["f16c"] and features["avx2"])


def test_gil_is_released_while_looping():
    """Another Python thread runs while a kernel call is inside its C loop.

    With a switch interval of 100 s CPython never takes the GIL from a thread that runs Python code, so
    this thread can take a time stamp between the kernel thread's two clock reads around the call only if
    the kernel released the GIL: nothing here depends on how fast the machine is. A loaded machine may not
    run this thread during one call, so up to 20 calls are tried."""
    import sys
    import threading
    import time

    src = np.ones(1 << 23, F32)
    dst = np.empty(src.size, F16)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        for _ in range(20):
            window, stamps, done = [], [], threading.Event()

            def convert():
                begin = time.perf_counter()
                kernels.to_half(src, dst, portable=True)  # scalar loop: tens of ms for 8M elements
                window.extend((begin, time.perf_counter()))
                done.set()

            worker = threading.Thread(target=convert)
            worker.start()
            while not done.is_set():
                stamps.append(time.perf_counter())
                done.wait(1e-4)  # gives up the GIL: the kernel thread can start, and finish
            worker.join()
            begin, end = window
            if any(begin < t < end for t in stamps):
                return
    finally:
        sys.setswitchinterval(switch)
    raise AssertionError("this thread never ran while the kernel converted: the kernel holds the GIL")
