/* Elementwise kernels of commlib: shared types, scalar conversions and the loop entry points.
 *
 * Two implementations of every loop exist: the portable C one (kernels_portable.c, any CPU) and the
 * x86-64 AVX2+F16C one (kernels_x86.c), chosen at run time by kernels.c. Both give bit-identical
 * results: the SIMD loops use the same operations in the same order, and hand their tails to the
 * portable loops. The scalar conversions below reproduce the F16C instructions bit for bit, including
 * how they quiet NaNs, so that the two paths also agree on NaN payloads.
 */
#ifndef COMMLIB_KERNELS_H
#define COMMLIB_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Element types: the one numbering. commlib._kernels exports each code as a module constant (FLOAT16, ...),
 * which commlib/dtypes.py reads into its dtype table; nothing else numbers dtypes. */
typedef enum {
    CK_FLOAT16 = 0,
    CK_BFLOAT16 = 1,
    CK_FLOAT32 = 2,
    CK_FLOAT64 = 3,
    CK_INT8 = 4,
    CK_UINT8 = 5,
    CK_INT32 = 6,
    CK_INT64 = 7,
    CK_INT16 = 8,
    CK_BOOL = 9, /* one byte, 0 or 1: Sum and Max are a logical or, Product and Min a logical and */
    CK_NUM_DTYPES = 10
} ck_dtype;

/* Name and size in bytes of each element type, by code (for messages and buffer checks). */
static const char *const ck_dtype_names[CK_NUM_DTYPES] = {
    "float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64", "int16", "bool",
};
static const size_t ck_itemsizes[CK_NUM_DTYPES] = {2, 2, 4, 8, 1, 1, 4, 8, 2, 1};

static inline int ck_is_floating(ck_dtype dt)
{
    return dt == CK_FLOAT16 || dt == CK_BFLOAT16 || dt == CK_FLOAT32 || dt == CK_FLOAT64;
}

/* Elementwise operations, numbered as commlib.ops.ReduceOp (Average arrives as Sum). */
typedef enum { CK_SUM = 0, CK_MIN = 2, CK_MAX = 3, CK_PRODUCT = 4 } ck_op;

static inline uint32_t ck_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float ck_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* float16 bits -> float32, exact; a NaN comes out quiet with its payload kept (as VCVTPH2PS). */
static inline float ck_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu) {
        return ck_bits_f32(sign | 0x7f800000u | (mant ? (0x400000u | (mant << 13)) : 0u));
    }
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in float32 */
        float v = (float)mant * 5.9604644775390625e-08f;
        return ck_bits_f32(sign | ck_f32_bits(v));
    }
    return ck_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* float32 -> float16 bits, round to nearest even; inf stays inf, a NaN stays a quiet NaN with the top
 * of its payload (as VCVTPS2PH). Finite values of magnitude >= 65520 become inf. */
static inline uint16_t ck_f32_to_f16(float f)
{
    uint32_t x = ck_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        if (a > 0x7f800000u) {
            return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
        }
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a >= 0x477ff000u) { /* >= 65520: rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a >= 0x38800000u) { /* a normal float16: rebias the exponent, round the 13 dropped bits */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) { /* below 2^-25 (half the smallest subnormal): zero */
        return sign;
    }
    /* a float16 subnormal: units of 2^-24, round to nearest even (a carry makes the smallest normal) */
    {
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14 .. 24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) {
            q++;
        }
        return (uint16_t)(sign | q);
    }
}

/* bfloat16 bits -> float32, exact. */
static inline float ck_bf16_to_f32(uint16_t h) { return ck_bits_f32((uint32_t)h << 16); }

/* float32 -> bfloat16 bits, round to nearest even; a NaN stays a quiet NaN with the top of its payload
 * (plain rounding could carry a NaN's payload into the exponent and make it inf). */
static inline uint16_t ck_f32_to_bf16(float f)
{
    uint32_t x = ck_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x40u);
    }
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* Finite float32 magnitudes (as bits, sign cleared) at or above these round to inf. */
#define CK_F16_OVERFLOW_BITS 0x477ff000u  /* 65520 = 65504 + half an ulp */
#define CK_BF16_OVERFLOW_BITS 0x7f7f8000u /* bfloat16 max + half an ulp */

/* Max/min as numpy's np.maximum/np.minimum: a NaN in either operand gives a NaN (the first one's if
 * both are NaN); when the operands compare equal (e.g. -0.0 and +0.0) the result is the second one. */
#define CK_MAXF(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define CK_MINF(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))

/* ---- Portable loops (kernels_portable.c). n counts elements; buffers do not overlap partially. ---- */
void ck_reduce_portable(ck_dtype dt, ck_op op, void *dst, const void *src, size_t n);
void ck_reduce_widened_portable(ck_dtype half, ck_op op, float *dst, const void *src, size_t n);
void ck_reduce_widened_scaled_portable(ck_dtype half, ck_op op, float *dst, const void *src, float dst_scale,
                                       size_t n);
void ck_scale_portable(ck_dtype dt, void *buf, double factor, size_t n);
size_t ck_to_half_portable(ck_dtype half, const float *src, void *dst, float scale, size_t n);
void ck_from_half_portable(ck_dtype half, const void *src, float *dst, float scale, size_t n);
size_t ck_round_trip_portable(ck_dtype half, float *buf, void *wire, float scale, float post, size_t n);
size_t ck_reduce_round_trip_portable(ck_dtype half, ck_op op, float *dst, const void *src, void *wire,
                                     float dst_scale, float post, int round_dst, size_t n);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CK_HAVE_X86 1
/* ---- AVX2+F16C loops (kernels_x86.c); call only when the CPU has both. Each returns 0 when it has no
 * SIMD loop for (dtype, op) and did nothing, so the caller falls back to the portable loop. ---- */
int ck_reduce_avx2(ck_dtype dt, ck_op op, void *dst, const void *src, size_t n);
int ck_reduce_widened_avx2(ck_dtype half, ck_op op, float *dst, const void *src, size_t n);
int ck_reduce_widened_scaled_avx2(ck_dtype half, ck_op op, float *dst, const void *src, float dst_scale, size_t n);
int ck_scale_avx2(ck_dtype dt, void *buf, double factor, size_t n);
size_t ck_to_half_avx2(ck_dtype half, const float *src, void *dst, float scale, size_t n);
void ck_from_half_avx2(ck_dtype half, const void *src, float *dst, float scale, size_t n);
size_t ck_round_trip_avx2(ck_dtype half, float *buf, void *wire, float scale, float post, size_t n);
size_t ck_reduce_round_trip_avx2(ck_dtype half, ck_op op, float *dst, const void *src, void *wire,
                                 float dst_scale, float post, int round_dst, size_t n);
#endif

/* ---- Dispatch: the AVX2+F16C loop when `simd` is set (the CPU has both and the caller did not ask for
 * the portable loops) and one exists for the case, else the portable loop. Shared by commlib._kernels and
 * commlib._peer_memory. ---- */
static inline void ck_reduce(int simd, ck_dtype dt, ck_op op, void *dst, const void *src, size_t n)
{
#if defined(CK_HAVE_X86)
    if (simd && ck_reduce_avx2(dt, op, dst, src, n)) {
        return;
    }
#endif
    (void)simd;
    ck_reduce_portable(dt, op, dst, src, n);
}

/* dst_scale 1 takes the plain loops (x * 1 == x), which are a multiply cheaper */
static inline void ck_reduce_widened(int simd, ck_dtype half, ck_op op, float *dst, const void *src,
                                     float dst_scale, size_t n)
{
#if defined(CK_HAVE_X86)
    if (simd && (dst_scale == 1.0f ? ck_reduce_widened_avx2(half, op, dst, src, n)
                                   : ck_reduce_widened_scaled_avx2(half, op, dst, src, dst_scale, n))) {
        return;
    }
#endif
    (void)simd;
    if (dst_scale == 1.0f) {
        ck_reduce_widened_portable(half, op, dst, src, n);
    } else {
        ck_reduce_widened_scaled_portable(half, op, dst, src, dst_scale, n);
    }
}

static inline void ck_scale(int simd, ck_dtype dt, void *buf, double factor, size_t n)
{
#if defined(CK_HAVE_X86)
    if (simd && ck_scale_avx2(dt, buf, factor, n)) {
        return;
    }
#endif
    (void)simd;
    ck_scale_portable(dt, buf, factor, n);
}

static inline size_t ck_to_half(int simd, ck_dtype half, const float *src, void *dst, float scale, size_t n)
{
#if defined(CK_HAVE_X86)
    if (simd) {
        return ck_to_half_avx2(half, src, dst, scale, n);
    }
#endif
    (void)simd;
    return ck_to_half_portable(half, src, dst, scale, n);
}

static inline void ck_from_half(int simd, ck_dtype half, const void *src, float *dst, float scale, size_t n)
{
#if defined(CK_HAVE_X86)
    if (simd) {
        ck_from_half_avx2(half, src, dst, scale, n);
        return;
    }
#endif
    (void)simd;
    ck_from_half_portable(half, src, dst, scale, n);
}

static inline size_t ck_round_trip(int simd, ck_dtype half, float *buf, void *wire, float scale, float post,
                                   size_t n)
{
#if defined(CK_HAVE_X86)
    if (simd) {
        return ck_round_trip_avx2(half, buf, wire, scale, post, n);
    }
#endif
    (void)simd;
    return ck_round_trip_portable(half, buf, wire, scale, post, n);
}

static inline size_t ck_reduce_round_trip(int simd, ck_dtype half, ck_op op, float *dst, const void *src,
                                          void *wire, float dst_scale, float post, int round_dst, size_t n)
{
#if defined(CK_HAVE_X86)
    if (simd) {
        return ck_reduce_round_trip_avx2(half, op, dst, src, wire, dst_scale, post, round_dst, n);
    }
#endif
    (void)simd;
    return ck_reduce_round_trip_portable(half, op, dst, src, wire, dst_scale, post, round_dst, n);
}

#endif /* COMMLIB_KERNELS_H */
