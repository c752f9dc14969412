/* The bfloat16 linear layer's AVX2+FMA path (linear_bf16.c has the contract, the
 * blocked layout and the dispatch).
 *
 * Per block of 16 outputs and group of up to 4 input rows: each 64-byte vector of
 * the blocked weight (16 rows x 2 features) is loaded as two 256-bit halves and
 * widened by a shift (even feature) and a mask (odd feature), and each input row's
 * feature pair is broadcast and widened the same way; two FMAs per half add the
 * odd then the even product to 8 float32 accumulators. 8 accumulators, 4 weight
 * vectors and 2 input vectors fit the 16 registers, and each weight byte is read
 * once per group of 4 rows.
 */
#include <stdint.h>
#include <string.h>

#include "linear_blocks.h"
#include "simd_bf16.h"

#define BLOCK_ROWS 16
#define ROW_GROUP 4

/* One block (16 outputs, `valid` of them below N) for `rows` input rows; `rows` is a constant at each
 * call site, so the accumulators stay in registers. */
PATH_AVX2 __attribute__((always_inline)) static inline void
one_block(const int rows, const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t k2, const float *bias,
          const uint16_t *res, int64_t ldr, uint16_t *y, int64_t ldy, int64_t valid)
{
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
    __m256 a[ROW_GROUP][2];
    for (int t = 0; t < rows; t++)
        a[t][0] = a[t][1] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < k2; kk++) {
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(w + kk * 2 * BLOCK_ROWS));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(w + kk * 2 * BLOCK_ROWS + BLOCK_ROWS));
        const __m256 even0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
        const __m256 odd0 = _mm256_castsi256_ps(_mm256_and_si256(v0, high));
        const __m256 even1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
        const __m256 odd1 = _mm256_castsi256_ps(_mm256_and_si256(v1, high));
        for (int t = 0; t < rows; t++) {
            int32_t pair;
            memcpy(&pair, x + t * ldx + 2 * kk, sizeof pair);
            const __m256i p = _mm256_set1_epi32(pair);
            const __m256 x0 = _mm256_castsi256_ps(_mm256_slli_epi32(p, 16));
            const __m256 x1 = _mm256_castsi256_ps(_mm256_and_si256(p, high));
            a[t][0] = _mm256_fmadd_ps(odd0, x1, a[t][0]);
            a[t][0] = _mm256_fmadd_ps(even0, x0, a[t][0]);
            a[t][1] = _mm256_fmadd_ps(odd1, x1, a[t][1]);
            a[t][1] = _mm256_fmadd_ps(even1, x0, a[t][1]);
        }
    }
    for (int t = 0; t < rows; t++) {
        for (int h = 0; h < 2; h++) {
            const int64_t n = valid - 8 * h < 8 ? valid - 8 * h : 8; /* outputs of this half below N */
            if (n <= 0)
                break;
            __m256 acc = a[t][h];
            if (bias) {
                float b[8] = {0};
                memcpy(b, bias + 8 * h, sizeof(float) * (size_t)n);
                acc = _mm256_add_ps(acc, _mm256_loadu_ps(b));
            }
            __m128i out = round8(acc);
            if (res) {
                uint16_t r[8] = {0};
                memcpy(r, res + t * ldr + 8 * h, sizeof(uint16_t) * (size_t)n);
                out = round8(_mm256_add_ps(widen8(out), widen8(_mm_loadu_si128((const __m128i *)r))));
            }
            if (n == 8) {
                _mm_storeu_si128((__m128i *)(y + t * ldy + 8 * h), out);
            } else {
                uint16_t o[8];
                _mm_storeu_si128((__m128i *)o, out);
                memcpy(y + t * ldy + 8 * h, o, sizeof(uint16_t) * (size_t)n);
            }
        }
    }
}

PATH_AVX2 void speculant_linear_bf16_pair_avx2(int64_t T, const uint16_t *x, int64_t ldx, const uint16_t *blocked,
                                               int64_t nblk, int64_t k2, const float *bias, const uint16_t *res,
                                               int64_t ldr, int64_t N, int64_t pair, uint16_t *y, int64_t ldy)
{
    FOR_EACH_BLOCK_OF_PAIR(one_block)
}
