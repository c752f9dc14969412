/* Rotary embedding rows on NEON (rotary.c has the contract and the scalar path): the same
 * element-wise float32 steps, 4 features a vector, so the same bits:
 * out = round(round(x * cos) + round(partner * sin_signed)). */
#include <stdint.h>

#include "bf16.h"
#include "simd_neon.h"

/* o[d] for d in [0, n): x[d] with partner p[d], table rows c, s */
PATH_NEON static void rotate_span(const uint16_t *x, const uint16_t *p, const uint16_t *c, const uint16_t *s,
                                  int64_t n, uint16_t *o)
{
    int64_t d = 0;
    for (; d + 4 <= n; d += 4) {
        const float32x4_t a = widen4(round4(vmulq_f32(widen4(vld1_u16(x + d)), widen4(vld1_u16(c + d)))));
        const float32x4_t b = widen4(round4(vmulq_f32(widen4(vld1_u16(p + d)), widen4(vld1_u16(s + d)))));
        vst1_u16(o + d, round4(vaddq_f32(a, b)));
    }
    for (; d < n; d++)
        o[d] = round_bf16(widen(round_bf16(widen(x[d]) * widen(c[d]))) + widen(round_bf16(widen(p[d]) * widen(s[d]))));
}

PATH_NEON void speculant_rotary_rows_neon(const uint16_t *x, int64_t t0, int64_t t1, int64_t ldx, int64_t heads,
                                          int64_t D, const uint16_t *cos, const uint16_t *sin, uint16_t *out)
{
    const int64_t half = D / 2;
    for (int64_t t = t0; t < t1; t++) {
        const uint16_t *c = cos + t * D, *s = sin + t * D;
        for (int64_t h = 0; h < heads; h++) {
            const uint16_t *row = x + t * ldx + h * D;
            uint16_t *o = out + (t * heads + h) * D;
            rotate_span(row, row + half, c, s, half, o);                          /* partner d + D/2 */
            rotate_span(row + half, row, c + half, s + half, D - half, o + half); /* partner d - D/2 */
        }
    }
}
