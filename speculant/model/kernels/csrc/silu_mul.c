/* The gated MLP's activation for bfloat16, CPU: act = round(silu(gate) * up), with
 * silu(gate) already rounded to bfloat16, i.e. bit for bit torch's
 * `F.silu(gate).mul_(up)` on bfloat16 tensors.
 *
 * A bfloat16 gate has 65,536 possible values, so silu is a table the caller fills
 * once from torch's own F.silu over all of them (`table[bits] = silu(bits)`): the
 * same bits as torch by construction, whatever exp torch uses. The product of
 * two bfloat16 numbers is exact in float32 and rounds once, as torch's mul does.
 * One call replaces two operators per layer.
 *
 * Layouts: gate_up [T, 2 I] with row stride ld (gate the first I columns, up the
 * next I); table [65536]; out [T, I] contiguous.
 */
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"


static inline __attribute__((always_inline)) void cols_body(const uint16_t *gate_up, int64_t t, int64_t ld, int64_t I, int64_t i0, int64_t i1,
                             const uint16_t *table, uint16_t *out)
{
    const uint16_t *g = gate_up + t * ld, *u = g + I;
    uint16_t *o = out + t * I;
    for (int64_t i = i0; i < i1; i++)
        o[i] = round_bf16(widen(table[g[i]]) * widen(u[i]));
}

#define COLS_ARGS \
    (const uint16_t *gate_up, int64_t t, int64_t ld, int64_t I, int64_t i0, int64_t i1, const uint16_t *table, \
        uint16_t *out)
#define COLS_CALL (gate_up, t, ld, I, i0, i1, table, out)
/* scalar, AVX2 and AVX-512 clones of the same C (kernels.h): the same bits on every path */
SPECULANT_CLONED(speculant_silu_mul_cols, cols_body, COLS_ARGS, COLS_CALL)

void speculant_silu_mul_bf16(const uint16_t *gate_up, int64_t T, int64_t ld, int64_t I, const uint16_t *table,
                             uint16_t *out)
{
    for (int64_t t = 0; t < T; t++)
        speculant_silu_mul_cols(gate_up, t, ld, I, 0, I, table, out);
}
