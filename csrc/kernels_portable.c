/* Portable C loops: the reference for every kernel, the path on non-x86 CPUs, and the tails of the SIMD
 * loops. Integer arithmetic goes through unsigned types so that overflow wraps (as in numpy) instead of
 * being undefined behaviour. */
#include "kernels.h"

/* One reduction loop per (element type, operation): d[i] = d[i] op s[i]. */
#define CK_LOOP(T, EXPR)                                                                                 \
    do {                                                                                                 \
        T *d = (T *)dst;                                                                                 \
        const T *s = (const T *)src;                                                                     \
        for (size_t i = 0; i < n; i++) {                                                                 \
            T a = d[i], b = s[i];                                                                        \
            d[i] = (EXPR);                                                                               \
        }                                                                                                \
    } while (0)

#define CK_FLOAT_LOOPS(T)                                                                                \
    switch (op) {                                                                                        \
    case CK_SUM: CK_LOOP(T, a + b); return;                                                              \
    case CK_PRODUCT: CK_LOOP(T, a * b); return;                                                          \
    case CK_MIN: CK_LOOP(T, CK_MINF(a, b)); return;                                                      \
    case CK_MAX: CK_LOOP(T, CK_MAXF(a, b)); return;                                                      \
    }                                                                                                    \
    return

/* Signed integers wrap through the unsigned type U of the same width. */
#define CK_INT_LOOPS(T, U)                                                                               \
    switch (op) {                                                                                        \
    case CK_SUM: CK_LOOP(T, (T)(U)((U)a + (U)b)); return;                                                \
    case CK_PRODUCT: CK_LOOP(T, (T)(U)((U)a * (U)b)); return; /* uint8 promotes to int: no overflow */   \
    case CK_MIN: CK_LOOP(T, a < b ? a : b); return;                                                      \
    case CK_MAX: CK_LOOP(T, a > b ? a : b); return;                                                      \
    }                                                                                                    \
    return

/* Half types: widen both to float32, operate, round once. */
#define CK_HALF_LOOPS(TO_F32, FROM_F32)                                                                  \
    switch (op) {                                                                                        \
    case CK_SUM: CK_LOOP(uint16_t, FROM_F32(TO_F32(a) + TO_F32(b))); return;                             \
    case CK_PRODUCT: CK_LOOP(uint16_t, FROM_F32(TO_F32(a) * TO_F32(b))); return;                         \
    case CK_MIN: CK_LOOP(uint16_t, FROM_F32(CK_MINF(TO_F32(a), TO_F32(b)))); return;                     \
    case CK_MAX: CK_LOOP(uint16_t, FROM_F32(CK_MAXF(TO_F32(a), TO_F32(b)))); return;                     \
    }                                                                                                    \
    return

static void reduce_f16(ck_op op, void *dst, const void *src, size_t n) { CK_HALF_LOOPS(ck_f16_to_f32, ck_f32_to_f16); }
static void reduce_bf16(ck_op op, void *dst, const void *src, size_t n) { CK_HALF_LOOPS(ck_bf16_to_f32, ck_f32_to_bf16); }
static void reduce_f32(ck_op op, void *dst, const void *src, size_t n) { CK_FLOAT_LOOPS(float); }
static void reduce_f64(ck_op op, void *dst, const void *src, size_t n) { CK_FLOAT_LOOPS(double); }
static void reduce_i8(ck_op op, void *dst, const void *src, size_t n) { CK_INT_LOOPS(int8_t, uint8_t); }
static void reduce_u8(ck_op op, void *dst, const void *src, size_t n) { CK_INT_LOOPS(uint8_t, uint8_t); }
static void reduce_i32(ck_op op, void *dst, const void *src, size_t n) { CK_INT_LOOPS(int32_t, uint32_t); }
static void reduce_i64(ck_op op, void *dst, const void *src, size_t n) { CK_INT_LOOPS(int64_t, uint64_t); }
static void reduce_i16(ck_op op, void *dst, const void *src, size_t n) { CK_INT_LOOPS(int16_t, uint16_t); }

/* bool as numpy reduces it: Sum and Max are or, Product and Min are and; any nonzero byte counts as true. */
static void reduce_bool(ck_op op, void *dst, const void *src, size_t n)
{
    if (op == CK_SUM || op == CK_MAX) {
        CK_LOOP(uint8_t, (uint8_t)(a != 0 || b != 0));
    } else {
        CK_LOOP(uint8_t, (uint8_t)(a != 0 && b != 0));
    }
}

void ck_reduce_portable(ck_dtype dt, ck_op op, void *dst, const void *src, size_t n)
{
    switch (dt) {
    case CK_FLOAT16: reduce_f16(op, dst, src, n); return;
    case CK_BFLOAT16: reduce_bf16(op, dst, src, n); return;
    case CK_FLOAT32: reduce_f32(op, dst, src, n); return;
    case CK_FLOAT64: reduce_f64(op, dst, src, n); return;
    case CK_INT8: reduce_i8(op, dst, src, n); return;
    case CK_UINT8: reduce_u8(op, dst, src, n); return;
    case CK_INT32: reduce_i32(op, dst, src, n); return;
    case CK_INT64: reduce_i64(op, dst, src, n); return;
    case CK_INT16: reduce_i16(op, dst, src, n); return;
    case CK_BOOL: reduce_bool(op, dst, src, n); return;
    default: return; /* kernels.c validates dt */
    }
}

/* d[i] = d[i] op float32(s[i]) for float32 d and half s. */
#define CK_WIDENED_LOOPS(TO_F32)                                                                         \
    do {                                                                                                 \
        const uint16_t *s = (const uint16_t *)src;                                                       \
        switch (op) {                                                                                    \
        case CK_SUM: for (size_t i = 0; i < n; i++) dst[i] = dst[i] + TO_F32(s[i]); return;              \
        case CK_PRODUCT: for (size_t i = 0; i < n; i++) dst[i] = dst[i] * TO_F32(s[i]); return;          \
        case CK_MIN:                                                                                     \
            for (size_t i = 0; i < n; i++) { float b = TO_F32(s[i]); dst[i] = CK_MINF(dst[i], b); }      \
            return;                                                                                      \
        case CK_MAX:                                                                                     \
            for (size_t i = 0; i < n; i++) { float b = TO_F32(s[i]); dst[i] = CK_MAXF(dst[i], b); }      \
            return;                                                                                      \
        }                                                                                                \
    } while (0)

void ck_reduce_widened_portable(ck_dtype half, ck_op op, float *dst, const void *src, size_t n)
{
    if (half == CK_FLOAT16) {
        CK_WIDENED_LOOPS(ck_f16_to_f32);
    } else {
        CK_WIDENED_LOOPS(ck_bf16_to_f32);
    }
}

/* d[i] = (d[i] * dst_scale) op float32(s[i]): the product is rounded to float32 before the operation, two
 * IEEE operations exactly as scaling the buffer first and then reducing. (No fused multiply-add: setup.py
 * compiles with -std=c11, under which GCC does not contract, and x86-64's baseline has no FMA.) */
#define CK_WIDENED_SCALED_LOOPS(TO_F32)                                                                  \
    do {                                                                                                 \
        const uint16_t *s = (const uint16_t *)src;                                                       \
        for (size_t i = 0; i < n; i++) {                                                                 \
            float a = dst[i] * dst_scale, b = TO_F32(s[i]);                                              \
            switch (op) {                                                                                \
            case CK_SUM: dst[i] = a + b; break;                                                          \
            case CK_PRODUCT: dst[i] = a * b; break;                                                      \
            case CK_MIN: dst[i] = CK_MINF(a, b); break;                                                  \
            case CK_MAX: dst[i] = CK_MAXF(a, b); break;                                                  \
            }                                                                                            \
        }                                                                                                \
    } while (0)

void ck_reduce_widened_scaled_portable(ck_dtype half, ck_op op, float *dst, const void *src, float dst_scale,
                                       size_t n)
{
    if (half == CK_FLOAT16) {
        CK_WIDENED_SCALED_LOOPS(ck_f16_to_f32);
    } else {
        CK_WIDENED_SCALED_LOOPS(ck_bf16_to_f32);
    }
}

/* buf *= factor; float32 and the half types multiply by float32(factor) (halves round once). */
/* An integer times a factor as Horovod scales integers on the CPU: the product in float64, truncated
 * toward zero; beyond int64 it saturates (C leaves that conversion undefined), and narrower types then
 * wrap, as numpy's astype. */
static inline int64_t ck_scaled_int(double factor, double x)
{
    double v = factor * x;
    if (v != v) {
        return 0;
    }
    if (v >= 9223372036854775807.0) {
        return INT64_MAX;
    }
    if (v <= -9223372036854775808.0) {
        return INT64_MIN;
    }
    return (int64_t)v;
}

#define CK_SCALE_INT(T, U)                                                                               \
    do {                                                                                                 \
        T *b = (T *)buf;                                                                                 \
        for (size_t i = 0; i < n; i++) b[i] = (T)(U)(uint64_t)ck_scaled_int(factor, (double)b[i]);        \
    } while (0)

void ck_scale_portable(ck_dtype dt, void *buf, double factor, size_t n)
{
    float f = (float)factor;
    switch (dt) {
    case CK_INT8: CK_SCALE_INT(int8_t, uint8_t); return;
    case CK_UINT8: CK_SCALE_INT(uint8_t, uint8_t); return;
    case CK_INT16: CK_SCALE_INT(int16_t, uint16_t); return;
    case CK_INT32: CK_SCALE_INT(int32_t, uint32_t); return;
    case CK_INT64: CK_SCALE_INT(int64_t, uint64_t); return;
    default: break;
    }
    if (dt == CK_FLOAT64) {
        double *b = (double *)buf;
        for (size_t i = 0; i < n; i++) b[i] *= factor;
    } else if (dt == CK_FLOAT32) {
        float *b = (float *)buf;
        for (size_t i = 0; i < n; i++) b[i] *= f;
    } else if (dt == CK_FLOAT16) {
        uint16_t *b = (uint16_t *)buf;
        for (size_t i = 0; i < n; i++) b[i] = ck_f32_to_f16(ck_f16_to_f32(b[i]) * f);
    } else if (dt == CK_BFLOAT16) {
        uint16_t *b = (uint16_t *)buf;
        for (size_t i = 0; i < n; i++) b[i] = ck_f32_to_bf16(ck_bf16_to_f32(b[i]) * f);
    }
}

/* dst = half(src * scale); returns how many finite products became inf. scale == 1 skips the multiply
 * (x * 1 == x). */
size_t ck_to_half_portable(ck_dtype half, const float *src, void *dst, float scale, size_t n)
{
    uint16_t *d = (uint16_t *)dst;
    uint32_t limit = half == CK_FLOAT16 ? CK_F16_OVERFLOW_BITS : CK_BF16_OVERFLOW_BITS;
    size_t overflow = 0;
    for (size_t i = 0; i < n; i++) {
        float y = scale == 1.0f ? src[i] : src[i] * scale;
        uint32_t a = ck_f32_bits(y) & 0x7fffffffu;
        overflow += (a >= limit) & (a < 0x7f800000u);
        d[i] = half == CK_FLOAT16 ? ck_f32_to_f16(y) : ck_f32_to_bf16(y);
    }
    return overflow;
}

/* dst = float32(src) * scale. */
void ck_from_half_portable(ck_dtype half, const void *src, float *dst, float scale, size_t n)
{
    const uint16_t *s = (const uint16_t *)src;
    if (half == CK_FLOAT16) {
        if (scale == 1.0f) {
            for (size_t i = 0; i < n; i++) dst[i] = ck_f16_to_f32(s[i]);
        } else {
            for (size_t i = 0; i < n; i++) dst[i] = ck_f16_to_f32(s[i]) * scale;
        }
    } else {
        if (scale == 1.0f) {
            for (size_t i = 0; i < n; i++) dst[i] = ck_bf16_to_f32(s[i]);
        } else {
            for (size_t i = 0; i < n; i++) dst[i] = ck_bf16_to_f32(s[i]) * scale;
        }
    }
}

/* wire = half(buf * scale); buf = float32(wire) * post: the wire round trip in one pass. Returns how many
 * finite products became inf. scale == 1 and post == 1 skip their multiplies, as in the loops above. */
size_t ck_round_trip_portable(ck_dtype half, float *buf, void *wire, float scale, float post, size_t n)
{
    uint16_t *w = (uint16_t *)wire;
    uint32_t limit = half == CK_FLOAT16 ? CK_F16_OVERFLOW_BITS : CK_BF16_OVERFLOW_BITS;
    size_t overflow = 0;
    for (size_t i = 0; i < n; i++) {
        float y = scale == 1.0f ? buf[i] : buf[i] * scale;
        uint32_t a = ck_f32_bits(y) & 0x7fffffffu;
        overflow += (a >= limit) & (a < 0x7f800000u);
        uint16_t h = half == CK_FLOAT16 ? ck_f32_to_f16(y) : ck_f32_to_bf16(y);
        float back = half == CK_FLOAT16 ? ck_f16_to_f32(h) : ck_bf16_to_f32(h);
        w[i] = h;
        buf[i] = post == 1.0f ? back : back * post;
    }
    return overflow;
}

/* d = (d * dst_scale) op float32(s); wire = half(d); d = float32(wire) * post, element by element: the two
 * loops above (reduce_widened, then round_trip with scale 1) in one pass; with `round_dst`, d * dst_scale
 * is first rounded through the wire format too. s[i] is read before wire[i] is written, so wire may be
 * src. Returns the overflow count. */
size_t ck_reduce_round_trip_portable(ck_dtype half, ck_op op, float *dst, const void *src, void *wire,
                                     float dst_scale, float post, int round_dst, size_t n)
{
    size_t overflow = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t s = ((const uint16_t *)src)[i];
        if (round_dst) {
            overflow += ck_round_trip_portable(half, dst + i, (uint16_t *)wire + i, dst_scale, 1.0f, 1);
            ck_reduce_widened_portable(half, op, dst + i, &s, 1);
        } else if (dst_scale == 1.0f) {
            ck_reduce_widened_portable(half, op, dst + i, &s, 1);
        } else {
            ck_reduce_widened_scaled_portable(half, op, dst + i, &s, dst_scale, 1);
        }
        overflow += ck_round_trip_portable(half, dst + i, (uint16_t *)wire + i, 1.0f, post, 1);
    }
    return overflow;
}
