/* AVX2 + F16C loops for x86-64, compiled for those instruction sets with a target attribute and called
 * only after kernels.c has checked the CPU (__builtin_cpu_supports). Each loop works on float32 vectors of
 * 8 lanes, mostly two per step (16 elements), and hands the remaining elements to the portable loop,
 * whose scalar code computes exactly the same thing (see kernels.h), so results do not depend on the
 * path or on the buffer length. */
#include "kernels.h"

#if defined(CK_HAVE_X86)

#include <immintrin.h>

#define CK_TARGET __attribute__((target("avx2,f16c")))
#define CK_INLINE static inline __attribute__((always_inline)) CK_TARGET
/* Software prefetch distance (bytes of the float32 stream) for the codec loops that stream a float32 array
 * from or to memory in ring-segment-sized calls: the hardware prefetcher restarts at every call and
 * ramps up too slowly; prefetching 2 KiB ahead made encode/decode/finish 30-40% faster on 256 KiB-1 MiB
 * calls over arrays not in cache (1-4 KiB measured alike). Prefetching past the end is harmless. */
#define CK_PREFETCH 2048

/* ---- 8 elements of each type <-> 8 float32 lanes ---- */

CK_INLINE __m256 load_f32(const void *p) { return _mm256_loadu_ps((const float *)p); }
CK_INLINE void store_f32(void *p, __m256 v) { _mm256_storeu_ps((float *)p, v); }

CK_INLINE __m256 load_f16(const void *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
CK_INLINE void store_f16(void *p, __m256 v)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

CK_INLINE __m256 load_bf16(const void *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
/* float32 -> bfloat16 by integer arithmetic: round to nearest even by adding 0x7fff plus the lowest kept
 * bit. Lanes hold the bfloat16 bits in their low halves. Wrong for NaN (the payload can carry into the
 * exponent), so callers check for NaN first. */
CK_INLINE __m256i round_bf16_finite(__m256 v)
{
    __m256i x = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
}
/* The same with NaN handled: a NaN keeps its top bits, made quiet. */
CK_INLINE __m256i round_bf16(__m256 v)
{
    __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 16), _mm256_set1_epi32(0x40));
    __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(round_bf16_finite(v), quiet_nan, is_nan);
}
/* 16 values rounded and packed to 16-bit lanes (packus works within 128-bit lanes: the result holds
 * v0[0:4] v1[0:4] | v0[4:8] v1[4:8]). NaNs are rare, so one compare per 16 values decides whether the
 * NaN-proof rounding is needed. Every lane holds a value < 0x10000, so the saturating pack is exact. */
CK_INLINE __m256i pack_bf16(__m256 v0, __m256 v1)
{
    if (_mm256_movemask_ps(_mm256_cmp_ps(v0, v1, _CMP_UNORD_Q))) {
        return _mm256_packus_epi32(round_bf16(v0), round_bf16(v1));
    }
    return _mm256_packus_epi32(round_bf16_finite(v0), round_bf16_finite(v1));
}
CK_INLINE void store_bf16(void *p, __m256 v)
{
    __m256i r = round_bf16(v);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128((__m128i *)p, packed);
}

/* ---- 16 elements of each type <-> two vectors of 8 float32 lanes, in element order ---- */

CK_INLINE void load_f32_x2(const void *p, __m256 *v0, __m256 *v1)
{
    *v0 = load_f32(p);
    *v1 = load_f32((const char *)p + 32);
}
CK_INLINE void store_f32_x2(void *p, __m256 v0, __m256 v1)
{
    store_f32(p, v0);
    store_f32((char *)p + 32, v1);
}
CK_INLINE void load_f16_x2(const void *p, __m256 *v0, __m256 *v1)
{
    *v0 = load_f16(p);
    *v1 = load_f16((const char *)p + 16);
}
CK_INLINE void store_f16_x2(void *p, __m256 v0, __m256 v1)
{
    __m128i h0 = _mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m128i h1 = _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256((__m256i *)p, _mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1));
}
CK_INLINE void load_bf16_x2(const void *p, __m256 *v0, __m256 *v1)
{
    *v0 = load_bf16(p);
    *v1 = load_bf16((const char *)p + 16);
}
CK_INLINE void store_bf16_x2(void *p, __m256 v0, __m256 v1)
{
    _mm256_storeu_si256((__m256i *)p, _mm256_permute4x64_epi64(pack_bf16(v0, v1), 0xd8));
}

/* bfloat16 in "lane order", for kernels whose operands are all bfloat16 (the order does not matter to
 * them as long as loads and stores agree): one 32-byte load, and interleaving with zeros puts each value
 * in the top half of a float32 lane (v0 = elements 0-3 and 8-11, v1 = 4-7 and 12-15), which is exactly
 * the order the pack restores, so neither side needs a shift or a permute. */
CK_INLINE void load_bf16_x2_lanes(const void *p, __m256 *v0, __m256 *v1)
{
    __m256i w = _mm256_loadu_si256((const __m256i *)p), zero = _mm256_setzero_si256();
    *v0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, w));
    *v1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, w));
}
CK_INLINE void store_bf16_x2_lanes(void *p, __m256 v0, __m256 v1)
{
    _mm256_storeu_si256((__m256i *)p, pack_bf16(v0, v1));
}

/* ---- the operations, matching CK_MAXF/CK_MINF: MAXPS returns its second operand unless the first is
 * strictly greater, so only a NaN in the first operand needs a blend ---- */

CK_INLINE __m256 op_sum(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
CK_INLINE __m256 op_product(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
CK_INLINE __m256 op_max(__m256 a, __m256 b)
{
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}
CK_INLINE __m256 op_min(__m256 a, __m256 b)
{
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

/* d[i] = d[i] op s[i]; returns how many elements it did (a multiple of 8), the caller finishes the tail
 * with the portable loop. Blocks of 16 (DLOAD2/DSTORE2/SLOAD2 must agree on the element order), software
 * pipelined: the next block is loaded before this one is stored, which keeps the loads from waiting on
 * the stores; then one block of 8 in element order. */
#define CK_DEFINE_REDUCE(NAME, DSIZE, SSIZE, DLOAD2, DSTORE2, SLOAD2, DLOAD, DSTORE, SLOAD, OP)           \
    static CK_TARGET size_t NAME(void *dst, const void *src, size_t n)                                  \
    {                                                                                                    \
        char *d = (char *)dst;                                                                           \
        const char *s = (const char *)src;                                                               \
        size_t i = 0;                                                                                    \
        if (n >= 16) {                                                                                   \
            __m256 a0, a1, b0, b1;                                                                       \
            DLOAD2(d, &a0, &a1);                                                                         \
            SLOAD2(s, &b0, &b1);                                                                         \
            for (; i + 32 <= n; i += 16) {                                                               \
                __m256 na0, na1, nb0, nb1;                                                               \
                DLOAD2(d + (i + 16) * DSIZE, &na0, &na1);                                                \
                SLOAD2(s + (i + 16) * SSIZE, &nb0, &nb1);                                                \
                DSTORE2(d + i * DSIZE, OP(a0, b0), OP(a1, b1));                                          \
                a0 = na0, a1 = na1, b0 = nb0, b1 = nb1;                                                  \
            }                                                                                            \
            DSTORE2(d + i * DSIZE, OP(a0, b0), OP(a1, b1));                                              \
            i += 16;                                                                                     \
        }                                                                                                \
        for (; i + 8 <= n; i += 8) {                                                                     \
            DSTORE(d + i * DSIZE, OP(DLOAD(d + i * DSIZE), SLOAD(s + i * SSIZE)));                       \
        }                                                                                                \
        return i;                                                                                        \
    }

#define CK_DEFINE_REDUCE_OPS(PREFIX, DSIZE, SSIZE, DLOAD2, DSTORE2, SLOAD2, DLOAD, DSTORE, SLOAD)        \
    CK_DEFINE_REDUCE(PREFIX##_sum, DSIZE, SSIZE, DLOAD2, DSTORE2, SLOAD2, DLOAD, DSTORE, SLOAD, op_sum)  \
    CK_DEFINE_REDUCE(PREFIX##_product, DSIZE, SSIZE, DLOAD2, DSTORE2, SLOAD2, DLOAD, DSTORE, SLOAD,      \
                     op_product)                                                                         \
    CK_DEFINE_REDUCE(PREFIX##_min, DSIZE, SSIZE, DLOAD2, DSTORE2, SLOAD2, DLOAD, DSTORE, SLOAD, op_min)  \
    CK_DEFINE_REDUCE(PREFIX##_max, DSIZE, SSIZE, DLOAD2, DSTORE2, SLOAD2, DLOAD, DSTORE, SLOAD, op_max)

CK_DEFINE_REDUCE_OPS(reduce_f32, 4, 4, load_f32_x2, store_f32_x2, load_f32_x2, load_f32, store_f32, load_f32)
CK_DEFINE_REDUCE_OPS(reduce_f16, 2, 2, load_f16_x2, store_f16_x2, load_f16_x2, load_f16, store_f16, load_f16)
CK_DEFINE_REDUCE_OPS(reduce_bf16, 2, 2, load_bf16_x2_lanes, store_bf16_x2_lanes, load_bf16_x2_lanes, load_bf16,
                     store_bf16, load_bf16)
CK_DEFINE_REDUCE_OPS(widen_f16, 4, 2, load_f32_x2, store_f32_x2, load_f16_x2, load_f32, store_f32, load_f16)
CK_DEFINE_REDUCE_OPS(widen_bf16, 4, 2, load_f32_x2, store_f32_x2, load_bf16_x2, load_f32, store_f32, load_bf16)

typedef size_t (*ck_simd_loop)(void *dst, const void *src, size_t n);

static ck_simd_loop pick(ck_op op, ck_simd_loop sum, ck_simd_loop product, ck_simd_loop min, ck_simd_loop max)
{
    switch (op) {
    case CK_SUM: return sum;
    case CK_PRODUCT: return product;
    case CK_MIN: return min;
    case CK_MAX: return max;
    }
    return NULL;
}

int ck_reduce_avx2(ck_dtype dt, ck_op op, void *dst, const void *src, size_t n)
{
    ck_simd_loop loop;
    size_t item;
    switch (dt) {
    case CK_FLOAT32:
        loop = pick(op, reduce_f32_sum, reduce_f32_product, reduce_f32_min, reduce_f32_max);
        item = 4;
        break;
    case CK_FLOAT16:
        loop = pick(op, reduce_f16_sum, reduce_f16_product, reduce_f16_min, reduce_f16_max);
        item = 2;
        break;
    case CK_BFLOAT16:
        loop = pick(op, reduce_bf16_sum, reduce_bf16_product, reduce_bf16_min, reduce_bf16_max);
        item = 2;
        break;
    default:
        return 0; /* float64 and integers: the portable loops, vectorised by the compiler */
    }
    if (loop == NULL) {
        return 0;
    }
    size_t done = loop(dst, src, n);
    ck_reduce_portable(dt, op, (char *)dst + done * item, (const char *)src + done * item, n - done);
    return 1;
}

int ck_reduce_widened_avx2(ck_dtype half, ck_op op, float *dst, const void *src, size_t n)
{
    ck_simd_loop loop = half == CK_FLOAT16
                            ? pick(op, widen_f16_sum, widen_f16_product, widen_f16_min, widen_f16_max)
                            : pick(op, widen_bf16_sum, widen_bf16_product, widen_bf16_min, widen_bf16_max);
    if (loop == NULL) {
        return 0;
    }
    size_t done = loop(dst, src, n);
    ck_reduce_widened_portable(half, op, dst + done, (const char *)src + done * 2, n - done);
    return 1;
}

/* d[i] = (d[i] * dst_scale) op float32(s[i]) for float32 d and half s: the widened reduction with the
 * destination scaled on the fly (what scale_ followed by reduce_widened_ computes, in one pass). Same
 * blocks and pipelining as CK_DEFINE_REDUCE. */
#define CK_DEFINE_WIDEN_SCALED(NAME, SLOAD2, SLOAD, OP)                                                  \
    static CK_TARGET size_t NAME(float *d, const void *src, float dst_scale, size_t n)                   \
    {                                                                                                    \
        const char *s = (const char *)src;                                                               \
        const __m256 f = _mm256_set1_ps(dst_scale);                                                      \
        size_t i = 0;                                                                                    \
        if (n >= 16) {                                                                                   \
            __m256 a0, a1, b0, b1;                                                                       \
            load_f32_x2(d, &a0, &a1);                                                                    \
            SLOAD2(s, &b0, &b1);                                                                         \
            for (; i + 32 <= n; i += 16) {                                                               \
                __m256 na0, na1, nb0, nb1;                                                               \
                _mm_prefetch((const char *)(d + i) + CK_PREFETCH, _MM_HINT_T0);                          \
                load_f32_x2(d + i + 16, &na0, &na1);                                                     \
                SLOAD2(s + (i + 16) * 2, &nb0, &nb1);                                                    \
                store_f32_x2(d + i, OP(_mm256_mul_ps(a0, f), b0), OP(_mm256_mul_ps(a1, f), b1));         \
                a0 = na0, a1 = na1, b0 = nb0, b1 = nb1;                                                  \
            }                                                                                            \
            store_f32_x2(d + i, OP(_mm256_mul_ps(a0, f), b0), OP(_mm256_mul_ps(a1, f), b1));             \
            i += 16;                                                                                     \
        }                                                                                                \
        for (; i + 8 <= n; i += 8) {                                                                     \
            store_f32(d + i, OP(_mm256_mul_ps(load_f32(d + i), f), SLOAD(s + i * 2)));                   \
        }                                                                                                \
        return i;                                                                                        \
    }

#define CK_DEFINE_WIDEN_SCALED_OPS(PREFIX, SLOAD2, SLOAD)                                                \
    CK_DEFINE_WIDEN_SCALED(PREFIX##_sum, SLOAD2, SLOAD, op_sum)                                          \
    CK_DEFINE_WIDEN_SCALED(PREFIX##_product, SLOAD2, SLOAD, op_product)                                  \
    CK_DEFINE_WIDEN_SCALED(PREFIX##_min, SLOAD2, SLOAD, op_min)                                          \
    CK_DEFINE_WIDEN_SCALED(PREFIX##_max, SLOAD2, SLOAD, op_max)

CK_DEFINE_WIDEN_SCALED_OPS(widen_scaled_f16, load_f16_x2, load_f16)
CK_DEFINE_WIDEN_SCALED_OPS(widen_scaled_bf16, load_bf16_x2, load_bf16)

typedef size_t (*ck_scaled_loop)(float *dst, const void *src, float dst_scale, size_t n);

int ck_reduce_widened_scaled_avx2(ck_dtype half, ck_op op, float *dst, const void *src, float dst_scale, size_t n)
{
    static const ck_scaled_loop f16[] = {[CK_SUM] = widen_scaled_f16_sum, [CK_PRODUCT] = widen_scaled_f16_product,
                                         [CK_MIN] = widen_scaled_f16_min, [CK_MAX] = widen_scaled_f16_max};
    static const ck_scaled_loop bf16[] = {[CK_SUM] = widen_scaled_bf16_sum,
                                          [CK_PRODUCT] = widen_scaled_bf16_product,
                                          [CK_MIN] = widen_scaled_bf16_min, [CK_MAX] = widen_scaled_bf16_max};
    ck_scaled_loop loop = half == CK_FLOAT16 ? f16[op] : bf16[op];
    if (loop == NULL) {
        return 0;
    }
    size_t done = loop(dst, src, dst_scale, n);
    ck_reduce_widened_scaled_portable(half, op, dst + done, (const char *)src + done * 2, dst_scale, n - done);
    return 1;
}

/* ---- scale: buf *= factor ---- */

#define CK_DEFINE_SCALE(NAME, SIZE, LOAD2, STORE2, LOAD, STORE)                                       \
    static CK_TARGET size_t NAME(void *buf, float factor, size_t n)                                      \
    {                                                                                                    \
        char *b = (char *)buf;                                                                           \
        __m256 f = _mm256_set1_ps(factor);                                                               \
        size_t i = 0;                                                                                    \
        for (; i + 16 <= n; i += 16) {                                                                   \
            __m256 y0, y1;                                                                               \
            LOAD2(b + i * SIZE, &y0, &y1);                                                               \
            STORE2(b + i * SIZE, _mm256_mul_ps(y0, f), _mm256_mul_ps(y1, f));                            \
        }                                                                                                \
        for (; i + 8 <= n; i += 8) {                                                                     \
            STORE(b + i * SIZE, _mm256_mul_ps(LOAD(b + i * SIZE), f));                                   \
        }                                                                                                \
        return i;                                                                                        \
    }

CK_DEFINE_SCALE(scale_f32, 4, load_f32_x2, store_f32_x2, load_f32, store_f32)
CK_DEFINE_SCALE(scale_f16, 2, load_f16_x2, store_f16_x2, load_f16, store_f16)
CK_DEFINE_SCALE(scale_bf16, 2, load_bf16_x2_lanes, store_bf16_x2_lanes, load_bf16, store_bf16)

static CK_TARGET size_t scale_f64(void *buf, double factor, size_t n)
{
    double *b = (double *)buf;
    __m256d f = _mm256_set1_pd(factor);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        _mm256_storeu_pd(b + i, _mm256_mul_pd(_mm256_loadu_pd(b + i), f));
    }
    return i;
}

int ck_scale_avx2(ck_dtype dt, void *buf, double factor, size_t n)
{
    size_t done, item;
    switch (dt) {
    case CK_FLOAT64: done = scale_f64(buf, factor, n); item = 8; break;
    case CK_FLOAT32: done = scale_f32(buf, (float)factor, n); item = 4; break;
    case CK_FLOAT16: done = scale_f16(buf, (float)factor, n); item = 2; break;
    case CK_BFLOAT16: done = scale_bf16(buf, (float)factor, n); item = 2; break;
    default: return 0;
    }
    ck_scale_portable(dt, (char *)buf + done * item, factor, n - done);
    return 1;
}

/* ---- conversions ---- */

/* dst = half(src * scale) for the first multiple of 16 elements, counting the finite products that
 * round to inf: |y| (as bits) in [limit, inf). The count is kept per lane (subtracting the all-ones
 * compare masks) and summed once per block, so that no lane can overflow. */
#define CK_DEFINE_TO_HALF(NAME, STORE, LIMIT, SCALED)                                                   \
    CK_INLINE __m256 NAME##_step(const float *p, __m256 sv, __m256i *count)                             \
    {                                                                                                    \
        __m256 y = _mm256_loadu_ps(p);                                                                   \
        if (SCALED) y = _mm256_mul_ps(y, sv);                                                            \
        __m256i a = _mm256_and_si256(_mm256_castps_si256(y), _mm256_set1_epi32(0x7fffffff));             \
        __m256i over = _mm256_and_si256(_mm256_cmpgt_epi32(a, _mm256_set1_epi32((int)((LIMIT) - 1u))),   \
                                        _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7f800000), a));           \
        *count = _mm256_sub_epi32(*count, over);                                                         \
        return y;                                                                                        \
    }                                                                                                    \
    static CK_TARGET size_t NAME(const float *src, void *dst, float scale, size_t n, size_t *overflow)   \
    {                                                                                                    \
        char *d = (char *)dst;                                                                           \
        const __m256 sv = _mm256_set1_ps(scale);                                                         \
        size_t total = 0, i = 0;                                                                         \
        while (i + 16 <= n) {                                                                            \
            size_t block_end = n - i > ((size_t)1 << 28) ? i + ((size_t)1 << 28) : n;                   \
            __m256i count = _mm256_setzero_si256();                                                      \
            for (; i + 16 <= block_end; i += 16) {                                                       \
                __m256 y0 = NAME##_step(src + i, sv, &count);                                            \
                __m256 y1 = NAME##_step(src + i + 8, sv, &count);                                        \
                _mm_prefetch((const char *)(src + i) + CK_PREFETCH, _MM_HINT_T0);                        \
                STORE##_x2(d + i * 2, y0, y1);                                                           \
            }                                                                                            \
            uint32_t lanes[8];                                                                           \
            _mm256_storeu_si256((__m256i *)lanes, count);                                                \
            for (int k = 0; k < 8; k++) total += lanes[k];                                               \
        }                                                                                                \
        *overflow = total;                                                                               \
        return i;                                                                                        \
    }

CK_DEFINE_TO_HALF(to_f16_unscaled, store_f16, CK_F16_OVERFLOW_BITS, 0)
CK_DEFINE_TO_HALF(to_f16_scaled, store_f16, CK_F16_OVERFLOW_BITS, 1)
CK_DEFINE_TO_HALF(to_bf16_unscaled, store_bf16, CK_BF16_OVERFLOW_BITS, 0)
CK_DEFINE_TO_HALF(to_bf16_scaled, store_bf16, CK_BF16_OVERFLOW_BITS, 1)

size_t ck_to_half_avx2(ck_dtype half, const float *src, void *dst, float scale, size_t n)
{
    size_t overflow, done;
    if (half == CK_FLOAT16) {
        done = scale == 1.0f ? to_f16_unscaled(src, dst, scale, n, &overflow)
                             : to_f16_scaled(src, dst, scale, n, &overflow);
    } else {
        done = scale == 1.0f ? to_bf16_unscaled(src, dst, scale, n, &overflow)
                             : to_bf16_scaled(src, dst, scale, n, &overflow);
    }
    return overflow + ck_to_half_portable(half, src + done, (char *)dst + done * 2, scale, n - done);
}

#define CK_DEFINE_FROM_HALF(NAME, LOAD, SCALED)                                                          \
    static CK_TARGET size_t NAME(const void *src, float *dst, float scale, size_t n)                     \
    {                                                                                                    \
        const char *s = (const char *)src;                                                               \
        const __m256 sv = _mm256_set1_ps(scale);                                                         \
        size_t i = 0;                                                                                    \
        for (; i + 16 <= n; i += 16) {                                                                   \
            _mm_prefetch((const char *)(dst + i) + CK_PREFETCH, _MM_HINT_T0);                            \
            __m256 y0 = LOAD(s + i * 2), y1 = LOAD(s + (i + 8) * 2);                                     \
            if (SCALED) {                                                                                \
                y0 = _mm256_mul_ps(y0, sv);                                                              \
                y1 = _mm256_mul_ps(y1, sv);                                                              \
            }                                                                                            \
            _mm256_storeu_ps(dst + i, y0);                                                               \
            _mm256_storeu_ps(dst + i + 8, y1);                                                           \
        }                                                                                                \
        for (; i + 8 <= n; i += 8) {                                                                     \
            __m256 y = LOAD(s + i * 2);                                                                  \
            if (SCALED) y = _mm256_mul_ps(y, sv);                                                        \
            _mm256_storeu_ps(dst + i, y);                                                                \
        }                                                                                                \
        return i;                                                                                        \
    }

CK_DEFINE_FROM_HALF(from_f16_unscaled, load_f16, 0)
CK_DEFINE_FROM_HALF(from_f16_scaled, load_f16, 1)
CK_DEFINE_FROM_HALF(from_bf16_unscaled, load_bf16, 0)
CK_DEFINE_FROM_HALF(from_bf16_scaled, load_bf16, 1)

void ck_from_half_avx2(ck_dtype half, const void *src, float *dst, float scale, size_t n)
{
    size_t done;
    if (half == CK_FLOAT16) {
        done = scale == 1.0f ? from_f16_unscaled(src, dst, scale, n) : from_f16_scaled(src, dst, scale, n);
    } else {
        done = scale == 1.0f ? from_bf16_unscaled(src, dst, scale, n) : from_bf16_scaled(src, dst, scale, n);
    }
    ck_from_half_portable(half, (const char *)src + done * 2, dst + done, scale, n - done);
}


/* wire = half(buf * scale); buf = float32(wire) * post, 16 elements per step: the conversion and overflow
 * count of CK_DEFINE_TO_HALF, then the 16 values just stored are read back (from L1) and widened. */
#define CK_DEFINE_ROUND_TRIP(NAME, STEP, STORE2, LOAD2, POSTED)                                          \
    static CK_TARGET size_t NAME(float *buf, void *wire, float scale, float post, size_t n,              \
                                 size_t *overflow)                                                       \
    {                                                                                                    \
        char *w = (char *)wire;                                                                          \
        const __m256 sv = _mm256_set1_ps(scale), pv = _mm256_set1_ps(post);                              \
        size_t total = 0, i = 0;                                                                         \
        while (i + 16 <= n) {                                                                            \
            size_t block_end = n - i > ((size_t)1 << 28) ? i + ((size_t)1 << 28) : n;                   \
            __m256i count = _mm256_setzero_si256();                                                      \
            for (; i + 16 <= block_end; i += 16) {                                                       \
                _mm_prefetch((const char *)(buf + i) + CK_PREFETCH, _MM_HINT_T0);                        \
                __m256 y0 = STEP(buf + i, sv, &count);                                                   \
                __m256 y1 = STEP(buf + i + 8, sv, &count);                                               \
                STORE2(w + i * 2, y0, y1);                                                               \
                LOAD2(w + i * 2, &y0, &y1);                                                              \
                if (POSTED) {                                                                            \
                    y0 = _mm256_mul_ps(y0, pv);                                                          \
                    y1 = _mm256_mul_ps(y1, pv);                                                          \
                }                                                                                        \
                store_f32_x2(buf + i, y0, y1);                                                           \
            }                                                                                            \
            uint32_t lanes[8];                                                                           \
            _mm256_storeu_si256((__m256i *)lanes, count);                                                \
            for (int k = 0; k < 8; k++) total += lanes[k];                                               \
        }                                                                                                \
        *overflow = total;                                                                               \
        return i;                                                                                        \
    }

CK_DEFINE_ROUND_TRIP(round_trip_f16, to_f16_scaled_step, store_f16_x2, load_f16_x2, 1)
CK_DEFINE_ROUND_TRIP(round_trip_f16_unscaled, to_f16_unscaled_step, store_f16_x2, load_f16_x2, 0)
CK_DEFINE_ROUND_TRIP(round_trip_bf16, to_bf16_scaled_step, store_bf16_x2, load_bf16_x2, 1)
CK_DEFINE_ROUND_TRIP(round_trip_bf16_unscaled, to_bf16_unscaled_step, store_bf16_x2, load_bf16_x2, 0)

size_t ck_round_trip_avx2(ck_dtype half, float *buf, void *wire, float scale, float post, size_t n)
{
    size_t overflow, done;
    int plain = scale == 1.0f && post == 1.0f; /* the common case: no multiplies at all */
    if (half == CK_FLOAT16) {
        done = plain ? round_trip_f16_unscaled(buf, wire, scale, post, n, &overflow)
                     : round_trip_f16(buf, wire, scale, post, n, &overflow);
    } else {
        done = plain ? round_trip_bf16_unscaled(buf, wire, scale, post, n, &overflow)
                     : round_trip_bf16(buf, wire, scale, post, n, &overflow);
    }
    return overflow + ck_round_trip_portable(half, buf + done, (char *)wire + done * 2, scale, post, n - done);
}

/* d = (d * dst_scale) op float32(s); wire = half(d); d = float32(wire) * post: a widened reduction whose
 * result goes straight through the wire round trip (what reduce_widened then round_trip compute, in one
 * pass). With `round_dst`, d * dst_scale first goes through the wire format too (a contribution rounded
 * as if it had been sent). Counts the finite values that round to inf, like CK_DEFINE_TO_HALF. `s` is
 * read before `wire` is written at the same place, so wire may be s. */
CK_INLINE void count_overflow(__m256 y, uint32_t limit, __m256i *count)
{
    __m256i a = _mm256_and_si256(_mm256_castps_si256(y), _mm256_set1_epi32(0x7fffffff));
    __m256i over = _mm256_and_si256(_mm256_cmpgt_epi32(a, _mm256_set1_epi32((int)(limit - 1u))),
                                    _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7f800000), a));
    *count = _mm256_sub_epi32(*count, over);
}

#define CK_DEFINE_REDUCE_ROUND_TRIP(NAME, LOAD2, STORE2, LIMIT, OP)                                      \
    static CK_TARGET size_t NAME(float *d, const void *src, void *wire, float dst_scale, float post,      \
                                 int round_dst, size_t n, size_t *overflow)                              \
    {                                                                                                    \
        const char *s = (const char *)src;                                                               \
        char *w = (char *)wire;                                                                          \
        const __m256 dv = _mm256_set1_ps(dst_scale), pv = _mm256_set1_ps(post);                          \
        const int scaled = dst_scale != 1.0f, posted = post != 1.0f;                                     \
        size_t total = 0, i = 0;                                                                         \
        while (i + 16 <= n) {                                                                            \
            size_t block_end = n - i > ((size_t)1 << 28) ? i + ((size_t)1 << 28) : n;                   \
            __m256i count = _mm256_setzero_si256();                                                      \
            for (; i + 16 <= block_end; i += 16) {                                                       \
                __m256 a0, a1, b0, b1;                                                                   \
                _mm_prefetch((const char *)(d + i) + CK_PREFETCH, _MM_HINT_T0);                          \
                load_f32_x2(d + i, &a0, &a1);                                                            \
                LOAD2(s + i * 2, &b0, &b1);                                                              \
                if (scaled) {                                                                            \
                    a0 = _mm256_mul_ps(a0, dv);                                                          \
                    a1 = _mm256_mul_ps(a1, dv);                                                          \
                }                                                                                        \
                if (round_dst) {                                                                         \
                    count_overflow(a0, LIMIT, &count);                                                   \
                    count_overflow(a1, LIMIT, &count);                                                   \
                    STORE2(w + i * 2, a0, a1);                                                           \
                    LOAD2(w + i * 2, &a0, &a1);                                                          \
                }                                                                                        \
                a0 = OP(a0, b0);                                                                         \
                a1 = OP(a1, b1);                                                                         \
                count_overflow(a0, LIMIT, &count);                                                       \
                count_overflow(a1, LIMIT, &count);                                                       \
                STORE2(w + i * 2, a0, a1);                                                               \
                LOAD2(w + i * 2, &a0, &a1);                                                              \
                if (posted) {                                                                            \
                    a0 = _mm256_mul_ps(a0, pv);                                                          \
                    a1 = _mm256_mul_ps(a1, pv);                                                          \
                }                                                                                        \
                store_f32_x2(d + i, a0, a1);                                                             \
            }                                                                                            \
            uint32_t lanes[8];                                                                           \
            _mm256_storeu_si256((__m256i *)lanes, count);                                                \
            for (int k = 0; k < 8; k++) total += lanes[k];                                               \
        }                                                                                                \
        *overflow = total;                                                                               \
        return i;                                                                                        \
    }

#define CK_DEFINE_REDUCE_ROUND_TRIP_OPS(PREFIX, LOAD2, STORE2, LIMIT)                                    \
    CK_DEFINE_REDUCE_ROUND_TRIP(PREFIX##_sum, LOAD2, STORE2, LIMIT, op_sum)                              \
    CK_DEFINE_REDUCE_ROUND_TRIP(PREFIX##_product, LOAD2, STORE2, LIMIT, op_product)                      \
    CK_DEFINE_REDUCE_ROUND_TRIP(PREFIX##_min, LOAD2, STORE2, LIMIT, op_min)                              \
    CK_DEFINE_REDUCE_ROUND_TRIP(PREFIX##_max, LOAD2, STORE2, LIMIT, op_max)

CK_DEFINE_REDUCE_ROUND_TRIP_OPS(reduce_round_trip_f16, load_f16_x2, store_f16_x2, CK_F16_OVERFLOW_BITS)
CK_DEFINE_REDUCE_ROUND_TRIP_OPS(reduce_round_trip_bf16, load_bf16_x2, store_bf16_x2, CK_BF16_OVERFLOW_BITS)

typedef size_t (*ck_reduce_round_trip_loop)(float *d, const void *src, void *wire, float dst_scale, float post,
                                            int round_dst, size_t n, size_t *overflow);

size_t ck_reduce_round_trip_avx2(ck_dtype half, ck_op op, float *dst, const void *src, void *wire,
                                 float dst_scale, float post, int round_dst, size_t n)
{
    static const ck_reduce_round_trip_loop f16[] = {
        [CK_SUM] = reduce_round_trip_f16_sum, [CK_PRODUCT] = reduce_round_trip_f16_product,
        [CK_MIN] = reduce_round_trip_f16_min, [CK_MAX] = reduce_round_trip_f16_max};
    static const ck_reduce_round_trip_loop bf16[] = {
        [CK_SUM] = reduce_round_trip_bf16_sum, [CK_PRODUCT] = reduce_round_trip_bf16_product,
        [CK_MIN] = reduce_round_trip_bf16_min, [CK_MAX] = reduce_round_trip_bf16_max};
    size_t overflow = 0;
    size_t done = (half == CK_FLOAT16 ? f16[op] : bf16[op])(dst, src, wire, dst_scale, post, round_dst, n,
                                                            &overflow);
    return overflow + ck_reduce_round_trip_portable(half, op, dst + done, (const char *)src + done * 2,
                                                    (char *)wire + done * 2, dst_scale, post, round_dst,
                                                    n - done);
}

#else
/* Not x86-64: this file compiles to nothing and kernels.c always takes the portable loops. ISO C wants
 * at least one declaration per translation unit. */
typedef int ck_x86_unused;
#endif
