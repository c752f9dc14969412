/* The bfloat16 linear layer's AVX2+FMA path (linear_bf16.c has the contract, the
 * blocked layout and the dispatch).
 *
 * Per block of 16 outputs and group of up to 4 input rows: each 64-byte vector of
 * the blocked weight (16 rows x 2 features) is loaded as two 256-bit halves and
 * widened, and two FMAs per half add the odd then the even product to 8 float32
 * accumulators (linear_bf16_widened.h, the loop shared with the AVX-512 path). 8 accumulators, 4 weight
 * vectors and 2 input vectors fit the 16 registers, and each weight byte is read
 * once per group of 4 rows.
 */
#include <stdint.h>
#include <string.h>

#include "linear_blocks.h"
#include "simd_bf16.h"

#define BLOCK_ROWS 16
#define ROW_GROUP 4

#define WV __m256
#define WI __m256i
#define W_PATH PATH_AVX2
#define W_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define W_SET1(i) _mm256_set1_epi32(i)
#define W_ZERO() _mm256_setzero_ps()
#define W_SLL16(v) _mm256_slli_epi32(v, 16)
#define W_AND(v, m) _mm256_and_si256(v, m)
#define W_AS_FLOAT(v) _mm256_castsi256_ps(v)
#define W_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#include "linear_bf16_widened.h"

/* One block (16 outputs, `valid` of them below N) for `rows` input rows; `rows` is a constant at each
 * call site, so the accumulators stay in registers. */
PATH_AVX2 __attribute__((always_inline)) static inline void
one_block(const int rows, const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t k2, const float *bias,
          const uint16_t *res, int64_t ldr, uint16_t *y, int64_t ldy, int64_t valid)
{
    __m256 a[2][ROW_GROUP]; /* the block's two halves of 8 outputs: the 256-bit halves of its 64-byte vectors */
    widened_accumulate(rows, x, ldx, w, w + BLOCK_ROWS, k2, a[0], a[1]);
    for (int t = 0; t < rows; t++) {
        for (int h = 0; h < 2; h++) {
            const int64_t n = valid - 8 * h < 8 ? valid - 8 * h : 8; /* outputs of this half below N */
            if (n <= 0)
                break;
            __m256 acc = a[h][t];
            if (bias) {
                float b[8] = {0};
                memcpy(b, bias + 8 * h, sizeof(float) * (size_t)n);
                acc = _mm256_add_ps(acc, _mm256_loadu_ps(b));
            }
            __m128i out = round8(acc);
            if (res) {
                uint16_t r[8] = {0};
                memcpy(r, res + t * ldr + 8 * h, sizeof(uint16_t) * (size_t)n);
                out = round8(_mm256_add_ps(widen8(out), widen8(_mm_loadu_si128((const __m128i *)r))));
            }
            if (n == 8) {
                _mm_storeu_si128((__m128i *)(y + t * ldy + 8 * h), out);
            } else {
                uint16_t o[8];
                _mm_storeu_si128((__m128i *)o, out);
                memcpy(y + t * ldy + 8 * h, o, sizeof(uint16_t) * (size_t)n);
            }
        }
    }
}

PATH_AVX2 void speculant_linear_bf16_pair_avx2(int64_t T, const uint16_t *x, int64_t ldx, const uint16_t *blocked,
                                               int64_t nblk, int64_t k2, const float *bias, const uint16_t *res,
                                               int64_t ldr, int64_t N, int64_t pair, uint16_t *y, int64_t ldy)
{
    FOR_EACH_BLOCK_OF_PAIR(one_block)
}
