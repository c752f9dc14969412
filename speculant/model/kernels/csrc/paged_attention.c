/* Paged attention for short query spans (decodes, verify runs), CPU; float32,
 * bfloat16 and (where the compiler has _Float16) float16 tensors.
 *
 * One call covers every selected span of a forward. A task is one (span, K/V
 * head) pair: it reads each visible key and value of that head exactly once
 * and uses it for all query rows of the span and all query heads of the group
 * (grouped-query attention without repeating K/V). Where those pairs are too
 * few to keep the threads busy (a decode of one sequence: as many tasks as K/V
 * heads), each pair is cut into slices of its group's query heads
 * (speculant_attend_slices); rows are independent, so the bits do not change.
 * Query token i of a span starting at position `start` sees keys 0 .. start + i
 * (bottom-right causal); a tree span (a token tree under verification) has a
 * mask [n_query, n_query] of bytes instead: token i sees the keys before
 * `start` and key start + c where mask[i * n_query + c] is set (its ancestors
 * and itself; c <= i always, parents precede their children).
 *
 * Arithmetic is float32 whatever the storage dtype: a bfloat16/float16 row is
 * widened when read (exactly), scores, softmax and the weighted sum of values
 * stay in float32, and the result is rounded to the storage dtype once, to
 * nearest even. So the output is exact attention over the stored inputs up to
 * float32 round-off plus one final rounding, and a row's result depends only
 * on its own query and its visible keys: a decode and the same position inside
 * a verify span give the same bits.
 *
 * bfloat16 on CPUs with AVX512-BF16 (chosen at run time from cpuid): the
 * task is attention_avx512_bf16.c's vectorised one (head sizes up to 256; scores of 16
 * keys at a time, a vector exp, values widened in registers), else the
 * query-key dot products below run on VDPBF16PS straight from the stored bfloat16
 * rows. Its products of two bfloat16 numbers are exact in float32 and it
 * accumulates in float32 (denormal inputs and results flushed to zero), so the
 * scores are the same float32 sums in another order; there softmax and the weighted
 * sum of values are the portable path's. A dispatch cap under AVX512_BF16
 * (speculant_isa_set, kernels.h) forces the portable path (tests walk every path).
 * On aarch64 the NEON path takes float32 and bfloat16 tasks (attention_neon.c).
 *
 * Layouts (all contiguous, row-major; elements of `dtype`):
 *   q, out          [T, H, D]
 *   k_cache/v_cache [num_blocks, block_size, H_kv, D]
 *   cu_query_lens   [B + 1]    starts [B]    block_tables [B, max_blocks]   (int64)
 *   span_ids        [n_spans]  which of the B spans this call computes
 *   mask_offsets    [B] or NULL: span b's tree mask at masks + mask_offsets[b], -1 = causal
 *   masks           uint8, every tree span's [n_query, n_query] mask back to back
 *   n_seqs: rows of block_tables; num_tokens: rows of q; num_blocks: blocks of each cache
 * Returns 0, -1 if a scratch allocation failed (out is then incomplete), -2
 * for a dtype this build does not support, or -3 (nothing read or written)
 * when a span would reach outside q or the pool: `bad` then describes it
 * (speculant_check_spans). Every block id and position is checked before use.
 */
#include <math.h>
#include <stdint.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_BF16_DOT_BUILD 1
#else
#define HAVE_BF16_DOT_BUILD 0
#endif
#include <stdlib.h>
#include <string.h>

#include "attention_softmax.h"
#include "bf16.h"
#include "kernels.h"

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };

#ifdef __FLT16_MAX__
#define HAVE_F16 1
#else
#define HAVE_F16 0
#endif

/* Bit i set: dtype code i is supported by this build. */
int speculant_kernel_dtypes(void)
{
    return (1 << DT_F32) | (1 << DT_BF16) | (HAVE_F16 << DT_F16);
}

#if HAVE_BF16_DOT_BUILD
/* sum_d a[d] * b[d] over bfloat16 rows of any length D, float32 accumulation: 32
 * elements per VDPBF16PS, the tail through a masked load (zeros add nothing). */
BF16_PATH_TARGET static float dot_bf16(const uint16_t *a, const uint16_t *b, int64_t D)
{
    __m512 acc = _mm512_setzero_ps();
    int64_t d = 0;
    for (; d + 32 <= D; d += 32) {
        const __m512i x = _mm512_loadu_si512((const void *)(a + d));
        const __m512i y = _mm512_loadu_si512((const void *)(b + d));
        acc = _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)y);
    }
    if (d < D) {
        const __mmask32 m = (__mmask32)((1ull << (D - d)) - 1);
        const __m512i x = _mm512_maskz_loadu_epi16(m, (const void *)(a + d));
        const __m512i y = _mm512_maskz_loadu_epi16(m, (const void *)(b + d));
        acc = _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)y);
    }
    return _mm512_reduce_add_ps(acc);
}
#endif

/* Row `offset` (in elements) of `base` as float32: a pointer into `base` for
 * float32 storage, else widened into `scratch` [D]. */
static inline __attribute__((always_inline)) const float *row_f32(const void *base, int64_t offset, int dtype, int64_t D, float *scratch)
{
    if (dtype == DT_F32)
        return (const float *)base + offset;
    if (dtype == DT_BF16) {
        const uint16_t *s = (const uint16_t *)base + offset;
#pragma omp simd
        for (int64_t d = 0; d < D; d++) {
            const uint32_t u = (uint32_t)s[d] << 16;
            float f;
            memcpy(&f, &u, sizeof f);
            scratch[d] = f;
        }
        return scratch;
    }
#if HAVE_F16
    const _Float16 *s = (const _Float16 *)base + offset;
#pragma omp simd
    for (int64_t d = 0; d < D; d++)
        scratch[d] = (float)s[d];
#endif
    return scratch;
}

/* Write float32 `src` [D] as row `offset` of `base`, rounded to the dtype. */
static inline __attribute__((always_inline)) void store_row(void *base, int64_t offset, int dtype, const float *src, int64_t D)
{
    if (dtype == DT_F32) {
        memcpy((float *)base + offset, src, sizeof(float) * (size_t)D);
    } else if (dtype == DT_BF16) {
        uint16_t *d16 = (uint16_t *)base + offset;
        for (int64_t d = 0; d < D; d++)
            d16[d] = round_bf16(src[d]);
    } else {
#if HAVE_F16
        _Float16 *h = (_Float16 *)base + offset;
        for (int64_t d = 0; d < D; d++)
            h[d] = (_Float16)src[d];
#endif
    }
}

int speculant_attend_slices(int64_t tasks, int64_t G, int threads)
{
    int64_t slices = 1;
    while (slices < G && tasks * slices < 4 * (int64_t)threads)
        slices++;
    return (int)slices;
}

#define TASK_ARGS                                                                                          \
    (const void *q, const void *k_cache, const void *v_cache, void *out, int dtype, int64_t row0, int64_t n_query, \
     int64_t start, const int64_t *table, int64_t kv_head, int64_t g0, int64_t gn, int64_t H, int64_t H_kv,        \
     int64_t D, int64_t block_size, float scale, const uint8_t *mask)
#define TASK_CALL (q, k_cache, v_cache, out, dtype, row0, n_query, start, table, kv_head, g0, gn, H, H_kv, D, \
                   block_size, scale, mask)

/* The portable task; compiled per path below (the compiler vectorises its simd loops for each path's
 * registers: the float32 sums of a score then take another order per path, within float32 round-off,
 * and a row's result still depends only on its own query and keys). */
static inline __attribute__((always_inline)) int task_body TASK_ARGS
{
    const int64_t G = H / H_kv;             /* query heads per K/V head */
    const int64_t R = n_query * gn;         /* rows r = i * gn + (g - g0) */
    const int64_t n = start + n_query;      /* keys visible to the last query token */
    /* scores [R, n] | acc [R, D] | queries [R, D] as float32 | one widened K/V row [D] */
    float *scores = malloc(sizeof(float) * (size_t)(R * n + 2 * R * D + D));
    if (!scores)
        return -1;
    float *acc = scores + R * n;
    float *qf = acc + R * D;
    float *kv_row = qf + R * D;
#define QHEAD(r) (kv_head * G + g0 + (r) % gn)  /* the query head of row r */
/* whether query token i sees key j (causal, or the tree mask past the prefix) */
#define SEES(i, j) ((j) <= start + (i) && (!mask || (j) < start || mask[(i) * n_query + (j) - start]))

    for (int64_t r = 0; r < R; r++) {
        const float *src = row_f32(q, ((row0 + r / gn) * H + QHEAD(r)) * D, dtype, D, qf + r * D);
        if (src != qf + r * D)
            memcpy(qf + r * D, src, sizeof(float) * (size_t)D);
    }
#if HAVE_BF16_DOT_BUILD
    if (dtype == DT_BF16 && speculant_isa_active() == ISA_AVX512_BF16) {
        const uint16_t *q16 = (const uint16_t *)q, *k16 = (const uint16_t *)k_cache;
        for (int64_t j = 0; j < n; j++) {
            const uint16_t *k = k16 + ((table[j / block_size] * block_size + j % block_size) * H_kv + kv_head) * D;
            for (int64_t r = 0; r < R; r++)
                scores[r * n + j] = !SEES(r / gn, j) ? -INFINITY
                    : dot_bf16(q16 + ((row0 + r / gn) * H + QHEAD(r)) * D, k, D) * scale;
        }
    } else
#endif
    for (int64_t j = 0; j < n; j++) {
        const float *k = row_f32(k_cache, ((table[j / block_size] * block_size + j % block_size) * H_kv + kv_head) * D,
                                 dtype, D, kv_row);
        for (int64_t r = 0; r < R; r++) {
            if (!SEES(r / gn, j)) {
                scores[r * n + j] = -INFINITY;
                continue;
            }
            const float *qr = qf + r * D;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t d = 0; d < D; d++)
                s += qr[d] * k[d];
            scores[r * n + j] = s * scale;
        }
    }
    attention_softmax(scores, R, n, start, gn); /* over the visible keys of each row */
    memset(acc, 0, sizeof(float) * (size_t)(R * D));
    for (int64_t j = 0; j < n; j++) {
        const float *v = row_f32(v_cache, ((table[j / block_size] * block_size + j % block_size) * H_kv + kv_head) * D,
                                 dtype, D, kv_row);
        for (int64_t r = 0; r < R; r++) {
            const float p = scores[r * n + j];
            if (p == 0.0f)
                continue;
            float *a = acc + r * D;
#pragma omp simd
            for (int64_t d = 0; d < D; d++)
                a[d] += p * v[d];
        }
    }
    for (int64_t r = 0; r < R; r++)
        store_row(out, ((row0 + r / gn) * H + QHEAD(r)) * D, dtype, acc + r * D, D);
#undef SEES
#undef QHEAD
    free(scores);
    return 0;
}

static int task_scalar TASK_ARGS { return task_body TASK_CALL; }
#if HAVE_BF16_DOT_BUILD
PATH_AVX2 static int task_avx2 TASK_ARGS { return task_body TASK_CALL; }
#endif /* no AVX-512 clone: GCC 12 warns (falsely) on its 64-byte simd widening; the AVX-512 paths take AVX2's */

int speculant_attend_task TASK_ARGS
{
    typedef int (*task_fn) TASK_ARGS;
    static const task_fn TABLE[ISA_COUNT] = {
        [ISA_SCALAR] = task_scalar,
#if HAVE_BF16_DOT_BUILD
        [ISA_AVX2] = task_avx2,
#endif
    };
#if HAVE_BF16_DOT_BUILD
    if (dtype == DT_BF16 && speculant_isa_active() == ISA_AVX512_BF16 && speculant_attend_task_bf16) {
        /* attention_avx512_bf16.c: the vectorised task */
        const int status = speculant_attend_task_bf16(q, k_cache, v_cache, out, row0, n_query, start, table,
                                                      kv_head, g0, gn, H, H_kv, D, block_size, scale, mask);
        if (status != -2)
            return status;
    }
#endif
    const int isa = speculant_isa_active();
    if ((isa == ISA_NEON || isa == ISA_NEON_DOTPROD) && speculant_attend_task_neon && !mask) {
        /* attention_neon.c: the task with NEON intrinsics (float32 and bfloat16; causal spans only:
         * a tree span's mask takes the portable task below) */
        const int status = speculant_attend_task_neon(q, k_cache, v_cache, out, dtype, row0, n_query, start, table,
                                                      kv_head, g0, gn, H, H_kv, D, block_size, scale);
        if (status != -2)
            return status;
    }
    task_fn f;
    SPECULANT_PICK(TABLE, f);
    return f TASK_CALL;
}

int speculant_paged_attention(int dtype, const void *q, const void *k_cache, const void *v_cache, void *out,
                              const int64_t *cu_query_lens, const int64_t *starts, const int64_t *block_tables,
                              int64_t n_seqs, int64_t max_blocks, const int64_t *span_ids, int64_t n_spans,
                              int64_t num_tokens, int64_t num_blocks, int64_t H, int64_t H_kv, int64_t D,
                              int64_t block_size, float scale, const int64_t *mask_offsets, const uint8_t *masks,
                              int threads, int64_t *bad)
{
    if (dtype < 0 || dtype > DT_F16 || !(speculant_kernel_dtypes() & (1 << dtype)))
        return -2;
    if (speculant_check_spans(cu_query_lens, starts, block_tables, n_seqs, max_blocks, span_ids, n_spans, num_tokens,
                              num_blocks, block_size, bad) != 0)
        return -3;
    int status = 0;
    const int64_t G = H / H_kv, slices = speculant_attend_slices(n_spans * H_kv, G, threads);
    const int64_t per = (G + slices - 1) / slices, tasks = n_spans * H_kv * slices;
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (tasks > 1)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t b = span_ids[t / (H_kv * slices)], kv_head = t / slices % H_kv, g0 = t % slices * per;
        const int64_t row0 = cu_query_lens[b];
        if (g0 < G && speculant_attend_task(q, k_cache, v_cache, out, dtype, row0, cu_query_lens[b + 1] - row0,
                                            starts[b], block_tables + b * max_blocks, kv_head, g0,
                                            G - g0 < per ? G - g0 : per, H, H_kv, D, block_size, scale,
                                            speculant_span_mask(mask_offsets, masks, b)) != 0) {
#pragma omp atomic write
            status = -1;
        }
    }
    return status;
}
