/* The bfloat16 linear layer's AVX512-BF16 path (linear_bf16.c has the contract,
 * the blocked layout and the dispatch): VDPBF16PS multiplies 16 output rows by one
 * broadcast pair of input features and accumulates 16 outputs in float32: no
 * horizontal sums, and each weight byte is read once per pass of up to 12 input
 * rows.
 *
 * Arithmetic: VDPBF16PS adds both exact bfloat16 products to the float32
 * accumulator (the odd feature's first; denormal inputs and results are flushed
 * to zero); the accumulator runs over k in order, one sum per output, so a row's
 * result does not depend on the other rows of the call. The bias (float32) is
 * added last, and the sum rounds to bfloat16 once, to nearest even
 * (VCVTNEPS2BF16). Away from denormals these are the scalar path's bits
 * (tests/model/kernels/test_isa_paths.py checks it).
 */
#include <stdint.h>
#include <string.h>

#include "linear_blocks.h"
#include "simd_bf16.h"

#define BLOCK_ROWS 16 /* output rows per blocked vector */
#define ROW_GROUP 12  /* input rows per pass over the weight (2 x 12 accumulators + 3 fit 32 registers) */
#define TARGET PATH_AVX512_BF16

/* a + b for bfloat16 vectors: the float32 sum rounded to bfloat16 (nearest even). */
TARGET static inline __m256i add_bf16(__m256i a, __m256i b)
{
    return (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(widen16(a), widen16(b)));
}

/* Two blocks (32 outputs) for `rows` input rows; `rows` is a constant at each
 * call site, so the accumulators stay in registers. */
TARGET __attribute__((always_inline)) static inline void
two_blocks(const int rows, const uint16_t *x, int64_t ldx, const uint16_t *w0, const uint16_t *w1, int64_t k2,
           const float *bias, const uint16_t *res, int64_t ldr, uint16_t *y, int64_t ldy, __mmask16 m0,
           __mmask16 m1)
{
    __m512 a0[ROW_GROUP], a1[ROW_GROUP];
#pragma GCC unroll 12
    for (int t = 0; t < rows; t++) {
        a0[t] = _mm512_setzero_ps();
        a1[t] = _mm512_setzero_ps();
    }
    for (int64_t kk = 0; kk < k2; kk++) {
        __m512bh v0 = (__m512bh)_mm512_loadu_si512(w0 + kk * 2 * BLOCK_ROWS);
        __m512bh v1 = (__m512bh)_mm512_loadu_si512(w1 + kk * 2 * BLOCK_ROWS);
#pragma GCC unroll 12
        for (int t = 0; t < rows; t++) {
            int32_t pair;
            memcpy(&pair, x + t * ldx + 2 * kk, sizeof pair);
            __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
            a0[t] = _mm512_dpbf16_ps(a0[t], v0, xb);
            a1[t] = _mm512_dpbf16_ps(a1[t], v1, xb);
        }
    }
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (bias) {
        b0 = _mm512_maskz_loadu_ps(m0, bias);
        b1 = _mm512_maskz_loadu_ps(m1, bias + BLOCK_ROWS);
    }
#pragma GCC unroll 12
    for (int t = 0; t < rows; t++) {
        __m256i r0 = (__m256i)_mm512_cvtneps_pbh(bias ? _mm512_add_ps(a0[t], b0) : a0[t]);
        __m256i r1 = (__m256i)_mm512_cvtneps_pbh(bias ? _mm512_add_ps(a1[t], b1) : a1[t]);
        if (res) {
            r0 = add_bf16(r0, _mm256_maskz_loadu_epi16(m0, res + t * ldr));
            r1 = add_bf16(r1, _mm256_maskz_loadu_epi16(m1, res + t * ldr + BLOCK_ROWS));
        }
        _mm256_mask_storeu_epi16(y + t * ldy, m0, r0);
        if (m1)
            _mm256_mask_storeu_epi16(y + t * ldy + BLOCK_ROWS, m1, r1);
    }
}

TARGET void speculant_linear_bf16_pair_avx512_bf16(int64_t T, const uint16_t *x, int64_t ldx, const uint16_t *blocked,
                                                  int64_t nblk, int64_t k2, const float *bias, const uint16_t *res,
                                                  int64_t ldr, int64_t N, int64_t pair, uint16_t *y, int64_t ldy)
{
    FOR_EACH_ROW_GROUP_OF_TWO_BLOCKS(ROW_GROUP, ROWS_BELOW_12)
}
