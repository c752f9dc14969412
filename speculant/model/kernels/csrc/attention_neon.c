/* One attention task on NEON, float32 or bfloat16 storage (a span, a K/V head and query heads
 * g0 .. g0 + gn - 1 of its group): paged_attention.c's task with explicit intrinsics. Same
 * contract: float32 throughout, a row's result depends only on its own query and its visible
 * keys, the output rounded to the storage dtype once (nearest even).
 *
 *   rows    query, key and value rows are widened into float32 rows padded with zeros to a
 *           multiple of 4 features (zeros add nothing), so no loop has a tail;
 *   scores  q.k by fused multiply-adds into 4 accumulators (vector v into accumulator v % 4),
 *           merged as (a0 + a1) + (a2 + a3) and the 4 lanes summed: a fixed order per key, so
 *           a decode and the same position inside a verify span give the same bits;
 *   softmax the portable task's (max, expf, the sum in key order, one reciprocal);
 *   values  acc += p * v for the visible keys in order (fused multiply-add), each key's value
 *           row widened once for all rows of the task.
 * Against the portable (scalar) task, the scores are the same float32 sums in another order,
 * so results agree within float32 round-off before the output's one rounding
 * (tests/model/kernels/csrc/path_selftest.c states the bound it checks).
 *
 * Returns 0, -1 when the scratch allocation failed, -2 for a dtype this path does not take
 * (float16: the caller runs the portable task).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_softmax.h"
#include "bf16.h"
#include "simd_neon.h"

enum { DT_F32 = 0, DT_BF16 = 1 }; /* paged_attention.c's dtype codes */

/* row `offset` (elements) of `base` as float32 into dst[Dp], zeros past D */
PATH_NEON static void load_row(const void *base, int64_t offset, int dtype, int64_t D, int64_t Dp, float *dst)
{
    int64_t d = 0;
    if (dtype == DT_BF16) {
        const uint16_t *s = (const uint16_t *)base + offset;
        for (; d + 4 <= D; d += 4)
            vst1q_f32(dst + d, widen4(vld1_u16(s + d)));
        for (; d < D; d++)
            dst[d] = widen(s[d]);
    } else {
        const float *s = (const float *)base + offset;
        for (; d + 4 <= D; d += 4)
            vst1q_f32(dst + d, vld1q_f32(s + d));
        for (; d < D; d++)
            dst[d] = s[d];
    }
    for (; d < Dp; d++)
        dst[d] = 0.0f;
}

/* sum_d a[d] * b[d] over Dp (a multiple of 4) features, in the fixed order of the header */
PATH_NEON static inline float dot(const float *a, const float *b, int64_t Dp)
{
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int64_t v = 0; v < Dp / 4; v++)
        acc[v & 3] = vfmaq_f32(acc[v & 3], vld1q_f32(a + 4 * v), vld1q_f32(b + 4 * v));
    return vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
}

PATH_NEON static void store_row(void *base, int64_t offset, int dtype, const float *src, int64_t D)
{
    if (dtype == DT_F32) {
        memcpy((float *)base + offset, src, sizeof(float) * (size_t)D);
        return;
    }
    uint16_t *o = (uint16_t *)base + offset;
    int64_t d = 0;
    for (; d + 4 <= D; d += 4)
        vst1_u16(o + d, round4(vld1q_f32(src + d)));
    for (; d < D; d++)
        o[d] = round_bf16(src[d]);
}

PATH_NEON int speculant_attend_task_neon(const void *q, const void *k_cache, const void *v_cache, void *out,
                                         int dtype, int64_t row0, int64_t n_query, int64_t start,
                                         const int64_t *table, int64_t kv_head, int64_t g0, int64_t gn, int64_t H,
                                         int64_t H_kv, int64_t D, int64_t block_size, float scale)
{
    if (dtype != DT_F32 && dtype != DT_BF16)
        return -2;
    const int64_t G = H / H_kv;        /* query heads per K/V head */
    const int64_t R = n_query * gn;    /* rows r = i * gn + (g - g0) */
    const int64_t n = start + n_query; /* keys visible to the last query token */
    const int64_t Dp = (D + 3) / 4 * 4;
    /* scores [R, n] | acc [R, Dp] | queries [R, Dp] | one K/V row [Dp], all float32 */
    float *scores = malloc(sizeof(float) * (size_t)(R * n + 2 * R * Dp + Dp));
    if (!scores)
        return -1;
    float *acc = scores + R * n, *qf = acc + R * Dp, *kv = qf + R * Dp;
#define QHEAD(r) (kv_head * G + g0 + (r) % gn) /* the query head of row r */
#define KV_OFFSET(j) (((table[(j) / block_size] * block_size + (j) % block_size) * H_kv + kv_head) * D)
    for (int64_t r = 0; r < R; r++)
        load_row(q, ((row0 + r / gn) * H + QHEAD(r)) * D, dtype, D, Dp, qf + r * Dp);
    for (int64_t j = 0; j < n; j++) {
        load_row(k_cache, KV_OFFSET(j), dtype, D, Dp, kv);
        for (int64_t r = 0; r < R; r++)
            scores[r * n + j] = j > start + r / gn ? -INFINITY : dot(qf + r * Dp, kv, Dp) * scale;
    }
    attention_softmax(scores, R, n, start, gn); /* over the visible keys of each row */
    memset(acc, 0, sizeof(float) * (size_t)(R * Dp));
    for (int64_t j = 0; j < n; j++) {
        load_row(v_cache, KV_OFFSET(j), dtype, D, Dp, kv);
        for (int64_t r = 0; r < R; r++) {
            const float p = scores[r * n + j];
            if (p == 0.0f)
                continue;
            const float32x4_t pv = vdupq_n_f32(p);
            float *a = acc + r * Dp;
            for (int64_t d = 0; d < Dp; d += 4)
                vst1q_f32(a + d, vfmaq_f32(vld1q_f32(a + d), pv, vld1q_f32(kv + d)));
        }
    }
    for (int64_t r = 0; r < R; r++)
        store_row(out, ((row0 + r / gn) * H + QHEAD(r)) * D, dtype, acc + r * Dp, D);
#undef QHEAD
#undef KV_OFFSET
    free(scores);
    return 0;
}
