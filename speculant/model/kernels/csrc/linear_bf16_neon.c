/* The bfloat16 linear layer's NEON path, aarch64 (linear_bf16.c has the contract, the
 * blocked layout and the dispatch): the AVX2 path's plan on 128-bit registers. Per block
 * of 16 outputs and group of up to 4 input rows, VLD2 splits each half of a 64-byte
 * weight vector into its even and odd features (8 rows each), a shift left by 16 widens
 * them to float32 (exact), and fused multiply-adds add the odd then the even product to
 * 4 x 4 float32 accumulators per row: the scalar path's sums in its order (the products
 * are exact), so the same bits. Each weight byte is read once per group of 4 rows.
 */
#include <stdint.h>
#include <string.h>

#include "linear_blocks.h"
#include "simd_neon.h"

#define BLOCK_ROWS 16
#define ROW_GROUP 4

/* One block (16 outputs, `valid` below N) for `rows` input rows, a constant at each call site. */
PATH_NEON static inline __attribute__((always_inline)) void
one_block(const int rows, const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t k2, const float *bias,
          const uint16_t *res, int64_t ldr, uint16_t *y, int64_t ldy, int64_t valid)
{
    float32x4_t a[ROW_GROUP][4];
    for (int t = 0; t < rows; t++)
        for (int q = 0; q < 4; q++)
            a[t][q] = vdupq_n_f32(0.0f);
    for (int64_t kk = 0; kk < k2; kk++) {
        const uint16x8x2_t v0 = vld2q_u16(w + kk * 2 * BLOCK_ROWS);              /* rows 0..7 */
        const uint16x8x2_t v1 = vld2q_u16(w + kk * 2 * BLOCK_ROWS + BLOCK_ROWS); /* rows 8..15 */
        const float32x4_t even[4] = {widen4(vget_low_u16(v0.val[0])), widen4(vget_high_u16(v0.val[0])),
                                     widen4(vget_low_u16(v1.val[0])), widen4(vget_high_u16(v1.val[0]))};
        const float32x4_t odd[4] = {widen4(vget_low_u16(v0.val[1])), widen4(vget_high_u16(v0.val[1])),
                                    widen4(vget_low_u16(v1.val[1])), widen4(vget_high_u16(v1.val[1]))};
        for (int t = 0; t < rows; t++) {
            const float32x4_t x0 = vdupq_n_f32(vgetq_lane_f32(widen4(vdup_n_u16(x[t * ldx + 2 * kk])), 0));
            const float32x4_t x1 = vdupq_n_f32(vgetq_lane_f32(widen4(vdup_n_u16(x[t * ldx + 2 * kk + 1])), 0));
            for (int q = 0; q < 4; q++)
                a[t][q] = vfmaq_f32(vfmaq_f32(a[t][q], odd[q], x1), even[q], x0);
        }
    }
    for (int t = 0; t < rows; t++) {
        uint16_t out[BLOCK_ROWS];
        for (int q = 0; q < 4; q++) {
            float b[4] = {0, 0, 0, 0};
            uint16_t r[4] = {0, 0, 0, 0};
            const int64_t n = valid - 4 * q < 4 ? valid - 4 * q : 4;
            if (n <= 0)
                break;
            if (bias)
                memcpy(b, bias + 4 * q, sizeof(float) * (size_t)n);
            uint16x4_t o = round4(bias ? vaddq_f32(a[t][q], vld1q_f32(b)) : a[t][q]);
            if (res) {
                memcpy(r, res + t * ldr + 4 * q, sizeof(uint16_t) * (size_t)n);
                o = round4(vaddq_f32(widen4(o), widen4(vld1_u16(r))));
            }
            vst1_u16(out + 4 * q, o);
        }
        memcpy(y + t * ldy, out, sizeof(uint16_t) * (size_t)valid);
    }
}

PATH_NEON void speculant_linear_bf16_pair_neon(int64_t T, const uint16_t *x, int64_t ldx, const uint16_t *blocked, int64_t nblk,
                                     int64_t k2, const float *bias, const uint16_t *res, int64_t ldr, int64_t N,
                                     int64_t pair, uint16_t *y, int64_t ldy)
{
    FOR_EACH_BLOCK_OF_PAIR(one_block)
}
