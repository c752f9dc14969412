/* silu(gate) * up on NEON (silu_mul.c has the contract and the scalar path): the silu table is
 * read per element (NEON has no gather), 4 at a time into a vector, then one exact product
 * of two bfloat16 numbers in float32 and one rounding per element, as the scalar path. */
#include <stdint.h>

#include "bf16.h"
#include "simd_neon.h"

PATH_NEON void speculant_silu_mul_cols_neon(const uint16_t *gate_up, int64_t t, int64_t ld, int64_t I, int64_t i0,
                                            int64_t i1, const uint16_t *table, uint16_t *out)
{
    const uint16_t *g = gate_up + t * ld, *u = g + I;
    uint16_t *o = out + t * I;
    int64_t i = i0;
    for (; i + 4 <= i1; i += 4) {
        const uint16_t s[4] = {table[g[i]], table[g[i + 1]], table[g[i + 2]], table[g[i + 3]]};
        vst1_u16(o + i, round4(vmulq_f32(widen4(vld1_u16(s)), widen4(vld1_u16(u + i)))));
    }
    for (; i < i1; i++)
        o[i] = round_bf16(widen(table[g[i]]) * widen(u[i]));
}
