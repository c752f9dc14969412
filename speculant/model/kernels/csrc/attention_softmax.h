/* The softmax of an attention task's score rows, shared by the portable task (paged_attention.c)
 * and the NEON one (attention_neon.c), so both take the same float32 steps: per row, the max over
 * its visible keys, expf(s - max), their sum in key order, one reciprocal; keys past the visible
 * ones get 0 (rows r = i * gn + (g - g0) of query token i see keys 0 .. start + i). */
#ifndef SPECULANT_ATTENTION_SOFTMAX_H
#define SPECULANT_ATTENTION_SOFTMAX_H
#include <math.h>
#include <stdint.h>

/* scores [R, n] in place */
static inline void attention_softmax(float *scores, int64_t R, int64_t n, int64_t start, int64_t gn)
{
    for (int64_t r = 0; r < R; r++) {
        float *row = scores + r * n;
        const int64_t visible = start + r / gn + 1;
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
}
#endif
