/* One attention task over bfloat16 storage on AVX512-BF16 (a span, a K/V head and
 * query heads g0 .. g0 + gn - 1 of its group): the vectorised form of
 * paged_attention.c's task for that dtype.
 *
 * Same arithmetic contract (float32 throughout, one rounding of the output):
 *   scores  16 keys at a time: each key's q.k as 16 VDPBF16PS partial sums
 *           (exact bf16 products, float32 accumulation), the 16 keys' partials
 *           then summed by one transpose-and-add tree, so a key's score is a fixed
 *           sum of its own partials whatever the other keys or rows;
 *   softmax the max, then exp(s - max) by a vector exp (range reduction by ln 2,
 *           a degree-7 polynomial, VSCALEFPS: within about an ulp of expf), summed
 *           in 16 lanes and the lanes in a fixed order, then one reciprocal;
 *   values  acc += p * v for the visible keys in order (fused multiply-add),
 *           a row at a time, its accumulators and the widened value rows in registers.
 * A row's result depends only on its own query and its visible keys (the
 * partition into 16-key blocks starts at key 0 for every row), so a decode and
 * the same position inside a verify span give the same bits, whatever slice of
 * the group a task takes. Key and value rows are found through one offset per
 * key, filled once per task by walking the block table (no division per key).
 *
 * A tree span's row (paged_attention.c's mask) takes the keys it sees, the
 * prefix and then its ancestors and itself in slot order, as one contiguous
 * list of key offsets: the 16-key blocks then hold the same keys in the same
 * lanes as the decode of the accepted path at that position, so a tree node
 * gives the decode's bits (a masked lane would move the later keys to other
 * lanes and change the sum's rounding).
 *
 * Returns 0, -1 when the scratch allocation failed, -2 where this task is not one
 * this path takes (head_dim over MAX_D): the caller runs the portable task.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define MAX_D 256
#define KEYS 16

#include <immintrin.h>
#define TARGET PATH_AVX512_BF16

/* lane u of the result = the sum of the 16 lanes of x[u] (a fixed tree per lane). */
TARGET static inline __m512 transpose_sum(const __m512 x[KEYS])
{
    __m512 c[4];
    for (int g = 0; g < 4; g++) {
        const __m512 *s = x + 4 * g;
        __m512 a = _mm512_add_ps(_mm512_unpacklo_ps(s[0], s[1]), _mm512_unpackhi_ps(s[0], s[1]));
        __m512 b = _mm512_add_ps(_mm512_unpacklo_ps(s[2], s[3]), _mm512_unpackhi_ps(s[2], s[3]));
        __m512d ad = _mm512_castps_pd(a), bd = _mm512_castps_pd(b);
        c[g] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ad, bd)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(ad, bd)));
    }
    /* c[g]: in each 128-bit quarter q, lane p holds a partial sum of key 4 g + p */
    __m512 f01 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    __m512 f23 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(f01, f23, 0x88), _mm512_shuffle_f32x4(f01, f23, 0xDD));
}

/* e^x for x <= 0 (lanes below -104 give 0, as expf does in float32). */
TARGET static inline __m512 exp_nonpositive(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);   /* x - n ln2, ln2 in two parts */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);                       /* sum_k r^k / k!, k <= 7 */
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

TARGET static inline __m512 widen16(const uint16_t *src, __mmask16 m)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src)), 16));
}

/* offsets[j] = the element offset of key j's row of head kv_head in a cache, for j < n */
static inline void key_offsets(int64_t *offsets, int64_t n, const int64_t *table, int64_t block_size, int64_t H_kv,
                               int64_t kv_head, int64_t D)
{
    for (int64_t j0 = 0, b = 0; j0 < n; j0 += block_size, b++) {
        const int64_t base = (table[b] * block_size * H_kv + kv_head) * D, end = n - j0 < block_size ? n - j0 : block_size;
        for (int64_t u = 0; u < end; u++)
            offsets[j0 + u] = base + u * H_kv * D;
    }
}

/* lane u: q.k_{j0 + u} for the 16 keys j0 .. j0 + 15 (past `visible`: the last visible key's), each
 * as `chunks` VDPBF16PS partial sums of 32 features then the transpose-and-add tree. */
TARGET __attribute__((always_inline)) static inline __m512
score_tile(const int chunks, const __m512bh *qv, const uint16_t *k_cache, const int64_t *offsets, int64_t j0,
           int64_t visible, __mmask32 tail32)
{
    __m512 part[KEYS];
    for (int u = 0; u < KEYS; u++) {
        const uint16_t *k = k_cache + offsets[j0 + u < visible ? j0 + u : visible - 1];
        __m512 a = _mm512_setzero_ps();
        for (int c = 0; c < chunks; c++)
            a = _mm512_dpbf16_ps(a, qv[c], (__m512bh)_mm512_maskz_loadu_epi16(
                                     c + 1 < chunks ? (__mmask32)0xFFFFFFFFu : tail32, k + 32 * c));
        part[u] = a;
    }
    return transpose_sum(part);
}

/* o [D] = sum over keys j < visible, in order, of p[j] * v_j (keys with p[j] == 0 left out),
 * accumulated in float32 by fused multiply-adds and rounded to bfloat16 once. */
TARGET __attribute__((always_inline)) static inline void
weighted_values(const int vecs, const float *p, int64_t visible, const uint16_t *v_cache, const int64_t *offsets,
                __mmask16 tail16, uint16_t *o)
{
    __m512 acc[MAX_D / 16];
    for (int c = 0; c < vecs; c++)
        acc[c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < visible; j++) {
        if (p[j] == 0.0f)
            continue;
        const __m512 pv = _mm512_set1_ps(p[j]);
        const uint16_t *v = v_cache + offsets[j];
        for (int c = 0; c < vecs; c++)
            acc[c] = _mm512_fmadd_ps(pv, widen16(v + 16 * c, c + 1 < vecs ? (__mmask16)0xFFFF : tail16), acc[c]);
    }
    for (int c = 0; c < vecs; c++)
        _mm256_mask_storeu_epi16(o + 16 * c, c + 1 < vecs ? (__mmask16)0xFFFF : tail16,
                                 (__m256i)_mm512_cvtneps_pbh(acc[c]));
}

/* the key offsets row r of query token i sees, in order, into `row_offsets`; returns their count: keys
 * 0 .. start + i for a causal span (`offsets` itself), else the prefix, then the tree keys its mask row
 * sets (its ancestors and itself, parents before children) */
static inline int64_t seen_keys(const int64_t *offsets, const uint8_t *mask, int64_t n_query, int64_t start,
                                int64_t i, int64_t *row_offsets, const int64_t **seen)
{
    if (!mask) {
        *seen = offsets;
        return start + i + 1;
    }
    memcpy(row_offsets, offsets, sizeof(int64_t) * (size_t)start);
    int64_t count = start;
    for (int64_t c = 0; c <= i; c++)
        if (mask[i * n_query + c])
            row_offsets[count++] = offsets[start + c];
    *seen = row_offsets;
    return count;
}

TARGET int speculant_attend_task_bf16(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                      uint16_t *out, int64_t row0, int64_t n_query, int64_t start,
                                      const int64_t *table, int64_t kv_head, int64_t g0, int64_t gn, int64_t H,
                                      int64_t H_kv, int64_t D, int64_t block_size, float scale,
                                      const uint8_t *mask)
{
    if (D > MAX_D)
        return -2;
    /* rows r = i * gn + (g - g0) for query token i and query head kv_head * G + g */
    const int64_t G = H / H_kv, R = n_query * gn, n = start + n_query;
    const int64_t n_pad = (n + KEYS - 1) / KEYS * KEYS, chunks = (D + 31) / 32, vecs = (D + 15) / 16;
    /* scores [R, n_pad] (floats) | the task's query rows [R, D] (read before out is written) | key row
     * offsets [n] | a tree row's own key offsets [n] */
    float *scores = aligned_alloc(64, sizeof(float) * (size_t)(R * n_pad) + 64);
    uint16_t *qrows = malloc(sizeof(uint16_t) * (size_t)(R * D) + sizeof(int64_t) * (size_t)(2 * n) + 8);
    if (!scores || !qrows) {
        free(scores);
        free(qrows);
        return -1;
    }
    int64_t *offsets = (int64_t *)(void *)(qrows + (R * D + 3) / 4 * 4), *row_offsets = offsets + n;
    key_offsets(offsets, n, table, block_size, H_kv, kv_head, D);
    for (int64_t i = 0; i < n_query; i++)
        memcpy(qrows + i * gn * D, q + ((row0 + i) * H + kv_head * G + g0) * D, sizeof(uint16_t) * (size_t)(gn * D));
    __mmask32 tail32 = (D % 32) ? (__mmask32)((1ull << (D % 32)) - 1) : (__mmask32)0xFFFFFFFFu;
    const __m512 vscale = _mm512_set1_ps(scale);

    for (int64_t r = 0; r < R; r++) {
        const uint16_t *qr = qrows + r * D;
        const int64_t *seen;                            /* the row's keys, in order */
        const int64_t visible = seen_keys(offsets, mask, n_query, start, r / gn, row_offsets, &seen);
        float *row = scores + r * n_pad;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        __m512bh qv[MAX_D / 32];
        for (int64_t c = 0; c < chunks; c++)
            qv[c] = (__m512bh)_mm512_maskz_loadu_epi16(c + 1 < chunks ? (__mmask32)0xFFFFFFFFu : tail32, qr + 32 * c);
        for (int64_t j0 = 0; j0 < visible; j0 += KEYS) {
            __m512 dots;
            switch (chunks) {   /* a constant count keeps the query in registers */
            case 2: dots = score_tile(2, qv, k_cache, seen, j0, visible, tail32); break;
            case 4: dots = score_tile(4, qv, k_cache, seen, j0, visible, tail32); break;
            default: dots = score_tile((int)chunks, qv, k_cache, seen, j0, visible, tail32); break;
            }
            const int64_t valid = visible - j0 < KEYS ? visible - j0 : KEYS;
            const __mmask16 vm = (__mmask16)((1u << valid) - 1);
            __m512 s = _mm512_mul_ps(dots, vscale);
            _mm512_store_ps(row + j0, s);
            mx = _mm512_mask_max_ps(mx, vm, mx, s);
        }
        const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j0 = 0; j0 < visible; j0 += KEYS) {
            const int64_t valid = visible - j0 < KEYS ? visible - j0 : KEYS;
            const __mmask16 vm = (__mmask16)((1u << valid) - 1);
            __m512 e = _mm512_maskz_mov_ps(vm, exp_nonpositive(_mm512_sub_ps(_mm512_load_ps(row + j0), m)));
            _mm512_store_ps(row + j0, e);
            sum = _mm512_add_ps(sum, e);
        }
        float lanes[16], total = 0.0f;
        _mm512_storeu_ps(lanes, sum);
        for (int l = 0; l < 16; l++)
            total += lanes[l];
        const __m512 inv = _mm512_set1_ps(1.0f / total);
        for (int64_t j0 = 0; j0 < visible; j0 += KEYS)
            _mm512_store_ps(row + j0, _mm512_mul_ps(_mm512_load_ps(row + j0), inv));
    }

    const __mmask16 tail16 = (D % 16) ? (__mmask16)((1u << (D % 16)) - 1) : (__mmask16)0xFFFF;
    for (int64_t r = 0; r < R; r++) {
        const int64_t i = r / gn, g = g0 + r % gn;
        uint16_t *o = out + ((row0 + i) * H + kv_head * G + g) * D;
        const float *p = scores + r * n_pad;
        const int64_t *seen;
        const int64_t visible = seen_keys(offsets, mask, n_query, start, i, row_offsets, &seen);
        switch (vecs) {     /* a constant count keeps the accumulators in registers */
        case 4: weighted_values(4, p, visible, v_cache, seen, tail16, o); break;
        case 8: weighted_values(8, p, visible, v_cache, seen, tail16, o); break;
        default: weighted_values((int)vecs, p, visible, v_cache, seen, tail16, o); break;
        }
    }
    free(scores);
    free(qrows);
    return 0;
}
