/* The loop of a linear-layer path that works one block of 16 outputs at a time
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
#endif
