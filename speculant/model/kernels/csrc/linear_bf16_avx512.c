/* The bfloat16 linear layer's AVX-512 path without AVX512-BF16 (linear_bf16.c has
 * the contract, the blocked layout and the dispatch): the AVX2 path's widening loop
 * (linear_bf16_widened.h) on 512-bit vectors, so
 * one 64-byte vector of the blocked weight is one load for 16 outputs. Both
 * blocks of the pair run together for groups of up to 8 input rows (16
 * accumulators, 4 weight vectors, 2 input vectors): each weight byte is read once
 * per group.
 */
#include <stdint.h>
#include <string.h>

#include "linear_blocks.h"
#include "simd_bf16.h"

#define BLOCK_ROWS 16
#define ROW_GROUP 8

#define WV __m512
#define WI __m512i
#define W_PATH PATH_AVX512
#define W_LOAD(p) _mm512_loadu_si512(p)
#define W_SET1(i) _mm512_set1_epi32(i)
#define W_ZERO() _mm512_setzero_ps()
#define W_SLL16(v) _mm512_slli_epi32(v, 16)
#define W_AND(v, m) _mm512_and_si512(v, m)
#define W_AS_FLOAT(v) _mm512_castsi512_ps(v)
#define W_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#include "linear_bf16_widened.h"

/* The two blocks of a pair (`m1` 0: the second is past N) for `rows` input rows, a constant at each call site. */
PATH_AVX512 __attribute__((always_inline)) static inline void
two_blocks(const int rows, const uint16_t *x, int64_t ldx, const uint16_t *w0, const uint16_t *w1, int64_t k2,
           const float *bias, const uint16_t *res, int64_t ldr, uint16_t *y, int64_t ldy, __mmask16 m0, __mmask16 m1)
{
    __m512 a0[ROW_GROUP], a1[ROW_GROUP];
    widened_accumulate(rows, x, ldx, w0, w1, k2, a0, a1);
    const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    const __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + BLOCK_ROWS) : _mm512_setzero_ps();
    for (int t = 0; t < rows; t++) {
        __m256i r0 = round16(bias ? _mm512_add_ps(a0[t], b0) : a0[t]);
        __m256i r1 = round16(bias ? _mm512_add_ps(a1[t], b1) : a1[t]);
        if (res) {
            r0 = round16(_mm512_add_ps(widen16(r0), widen16(_mm256_maskz_loadu_epi16(m0, res + t * ldr))));
            r1 = round16(_mm512_add_ps(widen16(r1), widen16(_mm256_maskz_loadu_epi16(m1, res + t * ldr + BLOCK_ROWS))));
        }
        _mm256_mask_storeu_epi16(y + t * ldy, m0, r0);
        if (m1)
            _mm256_mask_storeu_epi16(y + t * ldy + BLOCK_ROWS, m1, r1);
    }
}

PATH_AVX512 void speculant_linear_bf16_pair_avx512(int64_t T, const uint16_t *x, int64_t ldx, const uint16_t *blocked,
                                                   int64_t nblk, int64_t k2, const float *bias, const uint16_t *res,
                                                   int64_t ldr, int64_t N, int64_t pair, uint16_t *y, int64_t ldy)
{
    FOR_EACH_ROW_GROUP_OF_TWO_BLOCKS(ROW_GROUP, ROWS_BELOW_8)
}
