/* AVX-512 VNNI dot products over Q4_0, Q4_1, Q5_0 and Q8_0 weights repacked in groups of 16 rows
 * (quant_repack_b32.c), against activations quantized per block of 32 (scale dx, codes x, code
 * sum sx). A register holds 4 codes of each of the 16 rows (one 32-bit lane per row); VPDPBUSD
 * multiplies them by the activation's 4 codes at the same positions, broadcast to every lane, and
 * sums the 4 products into the row's lane: 8 of them give a block's integer dot <u, x> for 16 rows.
 * The formats' offsets are integer too, except Q4_1's:
 *   Q4_0: d * dx * (<u, x> - 8 sx)     Q5_0: d * dx * (<u, x> - 16 sx)
 *   Q8_0: d * dx * (<u, x> - 128 sx)   Q4_1: d * dx * <u, x> + m * (dx * sx)
 * (the integer offset starts the block's sum). One or two float steps per block and row, the same
 * instructions whichever activation rows come along: a row's result does not depend on the batch.
 * Each decoded block serves 4 activation rows while it sits in registers. Bounds: |<u, x>| <= 32 * 255 *
 * 127 < 2^21.
 */
#include "quant.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include "quant_x16_vnni.h"

/* block j's codes of the 16 rows: c[k] lane l byte b = weight 4k + b of row l, unsigned */
QUANT_VNNI_TARGET static inline __attribute__((always_inline)) void block_codes(int base, const uint8_t *codes, const uint8_t *qh, int64_t j,
                                                 __m512i c[8])
{
    if (base == QT_Q8_0) {
        for (int k = 0; k < 8; k++)
            c[k] = _mm512_loadu_si512(codes + 512 * j + 64 * k);
        return;
    }
    const __m512i low = _mm512_set1_epi8(0xf);
    for (int v = 0; v < 4; v++) {
        __m512i raw = _mm512_loadu_si512(codes + 256 * j + 64 * v);
        c[2 * v] = _mm512_and_si512(raw, low);
        c[2 * v + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
    }
    if (base != QT_Q5_0)
        return;
    /* bit k of each qh byte to bit 4 of c[k]'s byte: c | (shifted & 0x10) in one VPTERNLOGD */
    const __m512i h = _mm512_loadu_si512(qh + 64 * j), five = _mm512_set1_epi8(0x10);
    c[0] = _mm512_ternarylogic_epi32(c[0], _mm512_slli_epi16(h, 4), five, 0xf8);
    c[1] = _mm512_ternarylogic_epi32(c[1], _mm512_slli_epi16(h, 3), five, 0xf8);
    c[2] = _mm512_ternarylogic_epi32(c[2], _mm512_slli_epi16(h, 2), five, 0xf8);
    c[3] = _mm512_ternarylogic_epi32(c[3], _mm512_slli_epi16(h, 1), five, 0xf8);
    c[4] = _mm512_ternarylogic_epi32(c[4], h, five, 0xf8);
    c[5] = _mm512_ternarylogic_epi32(c[5], _mm512_srli_epi16(h, 1), five, 0xf8);
    c[6] = _mm512_ternarylogic_epi32(c[6], _mm512_srli_epi16(h, 2), five, 0xf8);
    c[7] = _mm512_ternarylogic_epi32(c[7], _mm512_srli_epi16(h, 3), five, 0xf8);
}

/* activation rows [r0, r0 + NR) against every block of the group */
#define ROWS_BODY(NR)                                                                                      \
    {                                                                                                      \
        __m512 acc[NR];                                                                                    \
        for (int i = 0; i < NR; i++)                                                                       \
            acc[i] = _mm512_setzero_ps();                                                                  \
        for (int64_t j = 0; j < nb; j++) {                                                                 \
            __m512i c[8];                                                                                  \
            block_codes(base, codes, side, j, c);                                                          \
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(group + 32 * j)));       \
            for (int i = 0; i < NR; i++) {                                                                 \
                const int8_t *x = xq + (r0 + i) * K + 32 * j;                                              \
                const int64_t at = (r0 + i) * ng + 2 * j;                                                  \
                const int32_t sx = xn[at] + xn[at + 1];                                                    \
                const __m512i dot = speculant_dot32_x16(_mm512_set1_epi32(-offset * sx), c, x);            \
                const float dx = xd[at];                                                                   \
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),                                          \
                                         _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[i]);                    \
                if (base == QT_Q4_1)                                                                       \
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(                           \
                                                 (const __m256i *)(group + 32 * nb + 32 * j))),            \
                                             _mm512_set1_ps(dx * (float)sx), acc[i]);                      \
            }                                                                                              \
        }                                                                                                  \
        for (int i = 0; i < NR; i++)                                                                       \
            _mm512_storeu_ps(sums + (r0 + i) * XROWS, acc[i]);                                             \
    }

/* the group kernel for one format (base a constant once inlined: no per-block branches) */
QUANT_VNNI_TARGET static inline __attribute__((always_inline)) void group_rows(
    const int base, const uint8_t *group, int64_t K, int64_t R, const int8_t *xq, const float *xd,
    const int16_t *xn, float *sums)
{
    const int64_t nb = K / 32, ng = K / QGROUP;
    const int32_t offset = base == QT_Q4_0 ? 8 : base == QT_Q5_0 ? 16 : base == QT_Q8_0 ? 128 : 0;
    const uint8_t *side = group + 32 * nb;
    const uint8_t *codes = group + nb * (base == QT_Q4_1 ? 64 : base == QT_Q5_0 ? 96 : 32);
    int64_t r0;
    QUANT_ROWS_IN_FOURS(R, r0, ROWS_BODY)
}

/* one repacked group of XROWS weight rows of K (a multiple of 32) against R activation rows:
 * sums[r * XROWS + l] = the dot product of weight row l with activation row r */
QUANT_VNNI_TARGET void speculant_qgroup_x16_b32_vnni(int type, const uint8_t *group, int64_t K, int64_t R,
                                                     const int8_t *xq, const float *xd, const int16_t *xn,
                                                     float *sums)
{
    switch (type - QT_X16) {
    case QT_Q4_0: group_rows(QT_Q4_0, group, K, R, xq, xd, xn, sums); break;
    case QT_Q4_1: group_rows(QT_Q4_1, group, K, R, xq, xd, xn, sums); break;
    case QT_Q5_0: group_rows(QT_Q5_0, group, K, R, xq, xd, xn, sums); break;
    default: group_rows(QT_Q8_0, group, K, R, xq, xd, xn, sums); break;
    }
}
#endif
