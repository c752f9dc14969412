/* bfloat16 linear layer, CPU: y = x W^T (+ bias), dispatched per instruction path.
 *
 * Why: at decode and verify sizes (a few rows) a linear layer is a stream of
 * its weight from memory, and the fastest kernel is the one that keeps that
 * stream at memory speed. The weight is stored once in a blocked layout: 16
 * output rows by 2 input features per 64-byte vector,
 *
 *     blocked[b][k2][r][j] = W[16 b + r][2 k2 + j]      ([nblk, K/2, 16, 2])
 *
 * (rows past N are zero), made for VDPBF16PS and as good for widening: a
 * 32-bit lane holds one output row's feature pair, so a shift left by 16 gives
 * feature 2 k2 and a mask of the high half feature 2 k2 + 1, both exact float32.
 * Each path streams the weight once per group of input rows, with no horizontal
 * sums. Work is split over OpenMP threads by pairs of blocks (32 outputs).
 *
 * Paths (kernels.h dispatch): scalar (this file, the reference); AVX2+FMA
 * (linear_bf16_avx2.c, 8 outputs per vector, groups of 4 rows); AVX-512
 * (linear_bf16_avx512.c, 16 outputs, groups of 8 rows); AVX512-BF16
 * (linear_bf16_avx512_bf16.c, VDPBF16PS, groups of 12 rows); NEON (linear_bf16_neon.c, aarch64, the
 * AVX2 plan on 128-bit registers).
 *
 * Arithmetic, the same on every path: per output, a float32 accumulator runs over
 * k in order, adding the odd feature's product then the even one's (the order
 * of VDPBF16PS); a product of two bfloat16 numbers is exact in float32, so a fused
 * multiply-add and a multiply then add give the same bits, and the scalar, AVX2
 * and AVX-512 paths agree bit for bit (AVX512-BF16 too, but where it flushes
 * denormals). A row's result does not depend on the other rows of the call or
 * the thread split (a decode and the same position in a verify run give the
 * same bits). The bias (float32) is added last, and the sum rounds to bfloat16
 * once, to nearest even: the rounding rule of the oneDNN path it replaces.
 *
 * With `residual` (fused residual add): y = residual + round(x W^T + bias),
 * the sum of two bfloat16 numbers taken in float32 and rounded once more:
 * bit for bit what `residual.add_(linear(x))` gives in torch. y may be
 * residual itself (in place).
 *
 * Layouts: x [T, K] with row stride ldx (elements), K even; blocked as above;
 * bias [N] float32 or NULL; residual [T, N] with row stride ldr, or NULL;
 * y [T, N] with row stride ldy. `threads`: the OpenMP team size (torch's thread
 * count, passed in: a thread other than the one that set it would not see it).
 * Returns 0.
 */
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

#define BLOCK_ROWS 16 /* output rows per blocked vector */

/* The scalar path: the outputs of block pair `pair` for all T rows. Not loop-vectorised: GCC 12.2's
 * -O3 loop vectoriser got this loop wrong (a sum of 0 .. 63 came out 2256, right at -O2), and the
 * reference path has to be right more than fast. */
__attribute__((optimize("no-tree-loop-vectorize"))) static void pair_scalar(int64_t T, const uint16_t *x, int64_t ldx, const uint16_t *blocked, int64_t nblk, int64_t k2,
                        const float *bias, const uint16_t *res, int64_t ldr, int64_t N, int64_t pair, uint16_t *y,
                        int64_t ldy)
{
    for (int64_t b = 2 * pair; b < 2 * pair + 2 && b < nblk; b++) {
        const uint16_t *w = blocked + b * k2 * 2 * BLOCK_ROWS;
        const int64_t n0 = b * BLOCK_ROWS, valid = N - n0 < BLOCK_ROWS ? N - n0 : BLOCK_ROWS;
        for (int64_t t = 0; t < T; t++) {
            const uint16_t *xt = x + t * ldx;
            float acc[BLOCK_ROWS] = {0};  /* one accumulator per output row of the block (16 independent sums) */
            for (int64_t kk = 0; kk < k2; kk++) {
                const float x0 = widen(xt[2 * kk]), x1 = widen(xt[2 * kk + 1]);
                const uint16_t *wk = w + kk * 2 * BLOCK_ROWS;
                for (int r = 0; r < BLOCK_ROWS; r++) {
                    acc[r] += widen(wk[2 * r + 1]) * x1;
                    acc[r] += widen(wk[2 * r]) * x0;
                }
            }
            for (int64_t r = 0; r < valid; r++) {
                uint16_t out = round_bf16(bias ? acc[r] + bias[n0 + r] : acc[r]);
                if (res)
                    out = round_bf16(widen(out) + widen(res[t * ldr + n0 + r]));
                y[t * ldy + n0 + r] = out;
            }
        }
    }
}

typedef void (*pair_fn)(int64_t, const uint16_t *, int64_t, const uint16_t *, int64_t, int64_t, const float *,
                        const uint16_t *, int64_t, int64_t, int64_t, uint16_t *, int64_t);

static pair_fn pick_pair(void)
{
    static const pair_fn TABLE[ISA_COUNT] = {
        [ISA_SCALAR] = pair_scalar,
        [ISA_AVX2] = speculant_linear_bf16_pair_avx2,
        [ISA_AVX512] = speculant_linear_bf16_pair_avx512,
        [ISA_AVX512_BF16] = speculant_linear_bf16_pair_avx512_bf16,
        [ISA_NEON] = speculant_linear_bf16_pair_neon,
    };
    pair_fn f;
    SPECULANT_PICK(TABLE, f);
    return f;
}

int speculant_linear_bf16_available(void)
{
    return pick_pair() != pair_scalar;
}

void speculant_linear_bf16_pair(int64_t T, const uint16_t *x, int64_t ldx, const uint16_t *blocked, int64_t nblk,
                                int64_t k2, const float *bias, const uint16_t *res, int64_t ldr, int64_t N,
                                int64_t pair, uint16_t *y, int64_t ldy)
{
    pick_pair()(T, x, ldx, blocked, nblk, k2, bias, res, ldr, N, pair, y, ldy);
}

int speculant_linear_bf16(const uint16_t *x, int64_t T, int64_t ldx, const uint16_t *blocked, int64_t N,
                          int64_t K, const float *bias, const uint16_t *residual, int64_t ldr, uint16_t *y,
                          int64_t ldy, int threads)
{
    const pair_fn f = pick_pair();
    const int64_t nblk = (N + BLOCK_ROWS - 1) / BLOCK_ROWS, pairs = (nblk + 1) / 2, k2 = K / 2;
#pragma omp parallel for schedule(static) num_threads(threads) if (pairs > 1)
    for (int64_t p = 0; p < pairs; p++)
        f(T, x, ldx, blocked, nblk, k2, bias, residual, ldr, N, p, y, ldy);
    return 0;
}
