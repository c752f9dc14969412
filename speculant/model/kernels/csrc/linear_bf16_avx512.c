/* The bfloat16 linear layer's AVX-512 path without AVX512-BF16 (linear_bf16.c has
 * the contract, the blocked layout and the dispatch): the AVX2 path's widening
 * (a shift for the even feature, a mask for the odd one) on 512-bit vectors, so
 * one 64-byte vector of the blocked weight is one load for 16 outputs. Both
 * blocks of the pair run together for groups of up to 8 input rows (16
 * accumulators, 4 weight vectors, 2 input vectors): each weight byte is read once
 * per group.
 */
#include <stdint.h>
#include <string.h>

#include "simd_bf16.h"

#define BLOCK_ROWS 16
#define ROW_GROUP 8

static __mmask16 row_mask(int64_t remaining)
{
    return remaining >= BLOCK_ROWS ? (__mmask16)0xFFFF : remaining <= 0 ? 0 : (__mmask16)((1u << remaining) - 1);
}

/* The two blocks of a pair (`m1` 0: the second is past N) for `rows` input rows, a constant at each call site. */
PATH_AVX512 __attribute__((always_inline)) static inline void
two_blocks(const int rows, const uint16_t *x, int64_t ldx, const uint16_t *w0, const uint16_t *w1, int64_t k2,
           const float *bias, const uint16_t *res, int64_t ldr, uint16_t *y, int64_t ldy, __mmask16 m0, __mmask16 m1)
{
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    __m512 a0[ROW_GROUP], a1[ROW_GROUP];
    for (int t = 0; t < rows; t++)
        a0[t] = a1[t] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k2; kk++) {
        const __m512i v0 = _mm512_loadu_si512(w0 + kk * 2 * BLOCK_ROWS);
        const __m512i v1 = _mm512_loadu_si512(w1 + kk * 2 * BLOCK_ROWS);
        const __m512 even0 = _mm512_castsi512_ps(_mm512_slli_epi32(v0, 16));
        const __m512 odd0 = _mm512_castsi512_ps(_mm512_and_si512(v0, high));
        const __m512 even1 = _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16));
        const __m512 odd1 = _mm512_castsi512_ps(_mm512_and_si512(v1, high));
        for (int t = 0; t < rows; t++) {
            int32_t pair;
            memcpy(&pair, x + t * ldx + 2 * kk, sizeof pair);
            const __m512i p = _mm512_set1_epi32(pair);
            const __m512 x0 = _mm512_castsi512_ps(_mm512_slli_epi32(p, 16));
            const __m512 x1 = _mm512_castsi512_ps(_mm512_and_si512(p, high));
            a0[t] = _mm512_fmadd_ps(even0, x0, _mm512_fmadd_ps(odd0, x1, a0[t]));
            a1[t] = _mm512_fmadd_ps(even1, x0, _mm512_fmadd_ps(odd1, x1, a1[t]));
        }
    }
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
    const int64_t b = 2 * pair, n0 = b * BLOCK_ROWS;
    const uint16_t *w0 = blocked + b * k2 * 2 * BLOCK_ROWS;
    /* an odd last block pairs with itself; its second half is masked off */
    const uint16_t *w1 = b + 1 < nblk ? w0 + k2 * 2 * BLOCK_ROWS : w0;
    const __mmask16 m0 = row_mask(N - n0), m1 = b + 1 < nblk ? row_mask(N - n0 - BLOCK_ROWS) : 0;
    const float *bb = bias ? bias + n0 : NULL;
    for (int64_t t0 = 0; t0 < T; t0 += ROW_GROUP) {
        const int64_t n = T - t0 < ROW_GROUP ? T - t0 : ROW_GROUP;
        const uint16_t *xt = x + t0 * ldx, *rt = res ? res + t0 * ldr + n0 : NULL;
        uint16_t *yt = y + t0 * ldy + n0;
        switch (n) {
        case 1: two_blocks(1, xt, ldx, w0, w1, k2, bb, rt, ldr, yt, ldy, m0, m1); break;
        case 2: two_blocks(2, xt, ldx, w0, w1, k2, bb, rt, ldr, yt, ldy, m0, m1); break;
        case 3: two_blocks(3, xt, ldx, w0, w1, k2, bb, rt, ldr, yt, ldy, m0, m1); break;
        case 4: two_blocks(4, xt, ldx, w0, w1, k2, bb, rt, ldr, yt, ldy, m0, m1); break;
        case 5: two_blocks(5, xt, ldx, w0, w1, k2, bb, rt, ldr, yt, ldy, m0, m1); break;
        case 6: two_blocks(6, xt, ldx, w0, w1, k2, bb, rt, ldr, yt, ldy, m0, m1); break;
        case 7: two_blocks(7, xt, ldx, w0, w1, k2, bb, rt, ldr, yt, ldy, m0, m1); break;
        default: two_blocks(8, xt, ldx, w0, w1, k2, bb, rt, ldr, yt, ldy, m0, m1); break;
        }
    }
}
