/* The loops of the bfloat16 linear layer's paths over the blocks of a pair and the groups of input rows.
 *
 * FOR_EACH_BLOCK_OF_PAIR: the loop of a path that works one block of 16 outputs at a time
 * (linear_bf16_avx2.c, linear_bf16_neon.c): the body of speculant_linear_bf16_pair_<path>,
 * calling ONE_BLOCK(rows, x, ldx, w, k2, bias, res, ldr, y, ldy, valid) for each block of
 * the pair and each group of up to 4 input rows (`rows` a constant at each call, so the
 * path keeps its accumulators in registers). Uses the pair function's parameters. */
#ifndef SPECULANT_LINEAR_BLOCKS_H
#define SPECULANT_LINEAR_BLOCKS_H

#define FOR_EACH_BLOCK_OF_PAIR(ONE_BLOCK)                                                                  \
    for (int64_t b = 2 * pair; b < 2 * pair + 2 && b < nblk; b++) {                                          \
        const int64_t n0 = b * 16, valid = N - n0 < 16 ? N - n0 : 16;                                        \
        const uint16_t *w = blocked + b * k2 * 32;                                                           \
        const float *bb = bias ? bias + n0 : NULL;                                                           \
        for (int64_t t0 = 0; t0 < T; t0 += 4) {                                                              \
            const int64_t n = T - t0 < 4 ? T - t0 : 4;                                                       \
            const uint16_t *xt = x + t0 * ldx, *rt = res ? res + t0 * ldr + n0 : NULL;                       \
            uint16_t *yt = y + t0 * ldy + n0;                                                                \
            if (n == 1)                                                                                      \
                ONE_BLOCK(1, xt, ldx, w, k2, bb, rt, ldr, yt, ldy, valid);                                   \
            else if (n == 2)                                                                                 \
                ONE_BLOCK(2, xt, ldx, w, k2, bb, rt, ldr, yt, ldy, valid);                                   \
            else if (n == 3)                                                                                 \
                ONE_BLOCK(3, xt, ldx, w, k2, bb, rt, ldr, yt, ldy, valid);                                   \
            else                                                                                             \
                ONE_BLOCK(4, xt, ldx, w, k2, bb, rt, ldr, yt, ldy, valid);                                   \
        }                                                                                                    \
    }

/* The body of a pair function that computes both blocks of the pair at once (linear_bf16_avx512.c,
 * linear_bf16_avx512_bf16.c): for each group of up to GROUP input rows it calls
 * two_blocks(rows, x, ldx, w0, w1, k2, bias, res, ldr, y, ldy, m0, m1) with `rows` a constant (one
 * case per count below GROUP, listed by CASES) and m0/m1 the outputs of each block below N (an odd
 * last block pairs with itself, its second half masked off). Uses the pair function's parameters. */
#define ROW_MASK16(remaining) \
    ((remaining) >= 16 ? (__mmask16)0xFFFF : (remaining) <= 0 ? (__mmask16)0 : (__mmask16)((1u << (remaining)) - 1))
#define ROWS_BELOW_8(F) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
#define ROWS_BELOW_12(F) ROWS_BELOW_8(F) F(8) F(9) F(10) F(11)
#define TWO_BLOCKS_CASE(rows) \
    case rows: two_blocks(rows, xt, ldx, w0, w1, k2, bb, rt, ldr, yt, ldy, m0, m1); break;
#define FOR_EACH_ROW_GROUP_OF_TWO_BLOCKS(GROUP, CASES)                                                   \
    const int64_t b = 2 * pair, n0 = b * 16;                                                                  \
    const uint16_t *w0 = blocked + b * k2 * 32;                                                               \
    const uint16_t *w1 = b + 1 < nblk ? w0 + k2 * 32 : w0;                                                    \
    const __mmask16 m0 = ROW_MASK16(N - n0), m1 = b + 1 < nblk ? ROW_MASK16(N - n0 - 16) : 0;                 \
    const float *bb = bias ? bias + n0 : NULL;                                                                \
    for (int64_t t0 = 0; t0 < T; t0 += GROUP) {                                                               \
        const int64_t n = T - t0 < GROUP ? T - t0 : GROUP;                                                   \
        const uint16_t *xt = x + t0 * ldx, *rt = res ? res + t0 * ldr + n0 : NULL;                            \
        uint16_t *yt = y + t0 * ldy + n0;                                                                     \
        switch (n) {                                                                                          \
            CASES(TWO_BLOCKS_CASE)                                                                            \
        default: two_blocks(GROUP, xt, ldx, w0, w1, k2, bb, rt, ldr, yt, ldy, m0, m1); break;                 \
        }                                                                                                     \
    }
#endif
