/* The quantized dot products on NEON with the dot-product extension (SDOT, armv8.2-a +dotprod;
 * quant_linear.c has the contract and the dispatch): one SDOT per group of 16 weights multiplies
 * signed 8-bit codes and adds each 4 products into a 32-bit lane. Codes up to 127 are signed
 * bytes as they are; where a format's codes reach 255 (Q8_0: u = q + 128) the codes go in as
 * u - 128 and 128 times the group's activation code sum is added back. Either way the scalar
 * path's integer group sums (exact), then its float arithmetic (quant.h): its bits. */
#include <arm_neon.h>
#include <stdint.h>

#include "kernels.h"
#include "quant.h"

PATH_NEON_DOTPROD void speculant_qdot_neon_dotprod(const qtile *t, const qact *a, float *acc)
{
    int32_t dots[QTILE / QGROUP];
    const uint8x16_t flip = vdupq_n_u8(t->wide ? 0x80 : 0);
    for (int g = 0; g < t->n / QGROUP; g++) {
        const int8x16_t u = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(t->u + g * QGROUP), flip));
        const int32x4_t p = vdotq_s32(vdupq_n_s32(0), u, vld1q_s8(a->q + g * QGROUP));
        dots[g] = vaddvq_s32(p) + (t->wide ? 128 * (int32_t)a->sum[g] : 0);
    }
    speculant_qacc_dots(t, a, dots, acc);
}
