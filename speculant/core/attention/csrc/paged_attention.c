/* Paged attention for short query spans (decodes, verify runs), float32, CPU.
 *
 * One call covers every selected span of a forward. A task is one (span, K/V
 * head) pair: it reads each visible key and value of that head exactly once
 * and uses it for all query rows of the span and all query heads of the group
 * (grouped-query attention without repeating K/V). Query token i of a span
 * starting at position `start` sees keys 0 .. start + i (bottom-right causal).
 *
 * Layouts (all contiguous, row-major):
 *   q, out          [T, H, D]
 *   k_cache/v_cache [num_blocks, block_size, H_kv, D]
 *   cu_query_lens   [B + 1]    starts [B]    block_tables [B, max_blocks]
 *   span_ids        [n_spans]  which of the B spans this call computes
 * Returns 0, or -1 if a scratch allocation failed (out is then incomplete).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int attend(const float *q, const float *k_cache, const float *v_cache, float *out,
                  int64_t row0, int64_t n_query, int64_t start, const int64_t *table,
                  int64_t kv_head, int64_t H, int64_t H_kv, int64_t D, int64_t block_size, float scale)
{
    const int64_t G = H / H_kv;            /* query heads per K/V head */
    const int64_t R = n_query * G;          /* rows r = i * G + g */
    const int64_t n = start + n_query;      /* keys visible to the last query token */
    float *scores = malloc(sizeof(float) * (size_t)(R * n + R * D));
    if (!scores)
        return -1;
    float *acc = scores + R * n;

    for (int64_t j = 0; j < n; j++) {
        const float *k = k_cache + ((table[j / block_size] * block_size + j % block_size) * H_kv + kv_head) * D;
        for (int64_t i = 0; i < n_query; i++) {
            for (int64_t g = 0; g < G; g++) {
                const int64_t r = i * G + g;
                if (j > start + i) {
                    scores[r * n + j] = -INFINITY;
                    continue;
                }
                const float *qr = q + ((row0 + i) * H + kv_head * G + g) * D;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < D; d++)
                    s += qr[d] * k[d];
                scores[r * n + j] = s * scale;
            }
        }
    }
    for (int64_t r = 0; r < R; r++) {       /* softmax over the visible keys of each row */
        float *row = scores + r * n;
        const int64_t visible = start + r / G + 1;
        float m = row[0];
        for (int64_t j = 1; j < visible; j++)
            m = row[j] > m ? row[j] : m;
        float sum = 0.0f;
        for (int64_t j = 0; j < visible; j++) {
            row[j] = expf(row[j] - m);
            sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < visible; j++)
            row[j] *= inv;
        for (int64_t j = visible; j < n; j++)
            row[j] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)(R * D));
    for (int64_t j = 0; j < n; j++) {
        const float *v = v_cache + ((table[j / block_size] * block_size + j % block_size) * H_kv + kv_head) * D;
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
    for (int64_t i = 0; i < n_query; i++)
        for (int64_t g = 0; g < G; g++)
            memcpy(out + ((row0 + i) * H + kv_head * G + g) * D, acc + (i * G + g) * D, sizeof(float) * (size_t)D);
    free(scores);
    return 0;
}

int speculant_paged_attention(const float *q, const float *k_cache, const float *v_cache, float *out,
                              const int64_t *cu_query_lens, const int64_t *starts, const int64_t *block_tables,
                              int64_t max_blocks, const int64_t *span_ids, int64_t n_spans,
                              int64_t H, int64_t H_kv, int64_t D, int64_t block_size, float scale, int threads)
{
    int status = 0;
    const int64_t tasks = n_spans * H_kv;
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (tasks > 1)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t b = span_ids[t / H_kv];
        const int64_t row0 = cu_query_lens[b];
        if (attend(q, k_cache, v_cache, out, row0, cu_query_lens[b + 1] - row0, starts[b],
                   block_tables + b * max_blocks, t % H_kv, H, H_kv, D, block_size, scale) != 0) {
#pragma omp atomic write
            status = -1;
        }
    }
    return status;
}
