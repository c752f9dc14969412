/* The quantized dot products on NEON, aarch64 (quant_linear.c has the contract and the dispatch):
 * per group of 16 weights, codes u (0..255) and activation codes q (-127..127) widened to 16 bits
 * and multiplied in 16-bit lanes (|u q| <= 255 * 127 < 2^15, exact), the products pairwise added
 * into 32-bit lanes and summed: the scalar path's integer group sums, then its float arithmetic
 * (quant.h), so its bits. */
#include <arm_neon.h>
#include <stdint.h>

#include "kernels.h"
#include "quant.h"

PATH_NEON void speculant_qdot_neon(const qtile *t, const qact *a, float *acc)
{
    int32_t dots[QTILE / QGROUP];
    for (int g = 0; g < t->n / QGROUP; g++) {
        const uint8x16_t u = vld1q_u8(t->u + g * QGROUP);
        const int8x16_t q = vld1q_s8(a->q + g * QGROUP);
        const int16x8_t lo = vmulq_s16(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(u))), vmovl_s8(vget_low_s8(q)));
        const int16x8_t hi = vmulq_s16(vreinterpretq_s16_u16(vmovl_u8(vget_high_u8(u))), vmovl_s8(vget_high_s8(q)));
        dots[g] = vaddvq_s32(vpadalq_s16(vpaddlq_s16(lo), hi));
    }
    speculant_qacc_dots(t, a, dots, acc);
}
