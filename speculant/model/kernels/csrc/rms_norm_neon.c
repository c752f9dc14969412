/* RMSNorm rows on NEON (rms_norm.c has the contract, ATen's summation order and the scalar
 * path). A vector of `lanes` floats (4, 8 or 16) is 1, 2 or 4 NEON registers; every lane keeps
 * its own float32 accumulator through the same cascade of levels as the scalar path, so the
 * sum of squares takes the same additions in the same order (a square of a bfloat16 number
 * is exact in float32, so the fused multiply-add rounds exactly where the scalar add does),
 * and the two element-wise roundings are bf16.h's: the same bits. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "simd_neon.h"

#define ILP 4
#define LEVELS 4
#define MAX_REGS 4 /* 16 lanes */

/* acc[k][q] += squares of vector vec + k (its registers q), k = 0..ILP-1 */
PATH_NEON static inline __attribute__((always_inline)) void
add_squares(float32x4_t acc[ILP][MAX_REGS], const uint16_t *x, int64_t vec, int regs)
{
    for (int k = 0; k < ILP; k++)
        for (int q = 0; q < regs; q++) {
            const float32x4_t e = widen4(vld1_u16(x + ((vec + k) * regs + q) * 4));
            acc[k][q] = vfmaq_f32(acc[k][q], e, e);
        }
}

PATH_NEON static float sum_squares(const uint16_t *x, int64_t H, int lanes)
{
    const int regs = lanes / 4;
    const int64_t nvec = H / lanes, rows = nvec / ILP;
    float32x4_t acc[LEVELS][ILP][MAX_REGS];
    for (int j = 0; j < LEVELS; j++)
        for (int k = 0; k < ILP; k++)
            for (int q = 0; q < MAX_REGS; q++)
                acc[j][k][q] = vdupq_n_f32(0.0f);
    int log2_rows = 0;
    while (((int64_t)1 << log2_rows) < rows)
        log2_rows++;
    const int power = log2_rows / LEVELS < 4 ? 4 : log2_rows / LEVELS;
    const int64_t step = (int64_t)1 << power, mask = step - 1;
    int64_t i = 0;
    while (i + step <= rows) {
        for (int64_t j = 0; j < step; j++, i++)
            add_squares(acc[0], x, i * ILP, regs);
        for (int j = 1; j < LEVELS; j++) {
            for (int k = 0; k < ILP; k++)
                for (int q = 0; q < regs; q++) {
                    acc[j][k][q] = vaddq_f32(acc[j][k][q], acc[j - 1][k][q]);
                    acc[j - 1][k][q] = vdupq_n_f32(0.0f);
                }
            if ((i & (mask << (j * power))) != 0)
                break;
        }
    }
    for (; i < rows; i++)
        add_squares(acc[0], x, i * ILP, regs);
    for (int j = 1; j < LEVELS; j++)
        for (int k = 0; k < ILP; k++)
            for (int q = 0; q < regs; q++)
                acc[0][k][q] = vaddq_f32(acc[0][k][q], acc[j][k][q]);
    float32x4_t *part = acc[0][0];
    for (int64_t v = rows * ILP; v < nvec; v++) /* vectors left over after the groups of ILP */
        for (int q = 0; q < regs; q++) {
            const float32x4_t e = widen4(vld1_u16(x + (v * regs + q) * 4));
            part[q] = vfmaq_f32(part[q], e, e);
        }
    for (int k = 1; k < ILP; k++)
        for (int q = 0; q < regs; q++)
            part[q] = vaddq_f32(part[q], acc[0][k][q]);
    float total = 0.0f;
    for (int64_t e = nvec * lanes; e < H; e++) { /* scalar tail first, then the lanes in order */
        const float v = widen(x[e]);
        total += v * v;
    }
    float lane[4 * MAX_REGS];
    for (int q = 0; q < regs; q++)
        vst1q_f32(lane + 4 * q, part[q]);
    for (int l = 0; l < lanes; l++)
        total += lane[l];
    return total;
}

PATH_NEON void speculant_rms_norm_rows_neon(const uint16_t *x, int64_t t0, int64_t t1, int64_t ldx,
                                            const uint16_t *weight, int64_t H, float eps, int lanes, uint16_t *out,
                                            int64_t ldo)
{
    for (int64_t t = t0; t < t1; t++) {
        const uint16_t *row = x + t * ldx;
        const float mean = sum_squares(row, H, lanes) / (float)H;
        const float r = 1.0f / sqrtf(mean + eps);
        const float32x4_t rv = vdupq_n_f32(r);
        uint16_t *o = out + t * ldo;
        int64_t h = 0;
        for (; h + 4 <= H; h += 4) {
            const float32x4_t y = widen4(round4(vmulq_f32(widen4(vld1_u16(row + h)), rv)));
            vst1_u16(o + h, round4(vmulq_f32(widen4(vld1_u16(weight + h)), y)));
        }
        for (; h < H; h++)
            o[h] = round_bf16(widen(weight[h]) * widen(round_bf16(widen(row[h]) * r)));
    }
}
