/* Rotary position embedding of bfloat16 query and key heads, CPU, bit for bit
 * what the fast decoder's torch form computes:
 *
 *     out = round(round(x * cos) + round(roll(x, D/2) * sin_signed))
 *
 * (round: float32 to bfloat16, nearest even; sin_signed is sin with its first
 * half negated, so roll(x, D/2) * sin_signed is rotate_half(x) * sin exactly).
 * One call replaces four torch operators per layer.
 *
 * Layouts: x [T, heads, D] with token stride ldx (elements; heads contiguous
 * inside a token, as in a slice of the fused q/k/v projection); cos, sin
 * [T, D] contiguous (the table rows of the tokens' positions); out
 * [T, heads, D] contiguous. D even.
 */
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"


/* round(round(x * c) + round(partner * s)) */
static inline __attribute__((always_inline)) uint16_t rotate_one(uint16_t x, uint16_t partner, uint16_t c, uint16_t s)
{
    return round_bf16(widen(round_bf16(widen(x) * widen(c))) + widen(round_bf16(widen(partner) * widen(s))));
}

static inline __attribute__((always_inline)) void rows_body(const uint16_t *x, int64_t t0, int64_t t1, int64_t ldx, int64_t heads, int64_t D,
                           const uint16_t *cos, const uint16_t *sin, uint16_t *out)
{
    int64_t half = D / 2;
    for (int64_t t = t0; t < t1; t++) {
        const uint16_t *c = cos + t * D, *s = sin + t * D;
        for (int64_t h = 0; h < heads; h++) {
            const uint16_t *row = x + t * ldx + h * D;
            uint16_t *o = out + (t * heads + h) * D;
            /* element d pairs with d + D/2 (first half) or d - D/2 (second half): two plain
             * loops the compiler vectorises, where an index modulo D would not be */
            for (int64_t d = 0; d < half; d++)
                o[d] = rotate_one(row[d], row[d + half], c[d], s[d]);
            for (int64_t d = half; d < D; d++)
                o[d] = rotate_one(row[d], row[d - half], c[d], s[d]);
        }
    }
}

#define ROWS_ARGS \
    (const uint16_t *x, int64_t t0, int64_t t1, int64_t ldx, int64_t heads, int64_t D, const uint16_t *cos, \
        const uint16_t *sin, uint16_t *out)
#define ROWS_CALL (x, t0, t1, ldx, heads, D, cos, sin, out)
/* scalar, AVX2 and AVX-512 clones of the same C (kernels.h): the same bits on every path */
SPECULANT_CLONED(speculant_rotary_rows, rows_body, ROWS_ARGS, ROWS_CALL)

void speculant_rotary_bf16(const uint16_t *x, int64_t T, int64_t ldx, int64_t heads, int64_t D,
                           const uint16_t *cos, const uint16_t *sin, uint16_t *out)
{
    speculant_rotary_rows(x, 0, T, ldx, heads, D, cos, sin, out);
}
