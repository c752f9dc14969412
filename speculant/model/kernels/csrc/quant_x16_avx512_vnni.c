/* AVX-512 VNNI dot products over Q4_K and Q6_K weights repacked in groups of 16 rows
 * (quant_repack.c). A register holds 4 codes of each of the 16 rows (one 32-bit lane per
 * row); VPDPBUSD multiplies them by the activation row's 4 codes at the same positions,
 * broadcast to every lane, and sums the 4 products into the row's lane. A sub-block's
 * (Q4_K: 32 weights) or group's (Q6_K: 16) integer dot is then multiplied by its scale,
 * which is one vector over the 16 rows (VPMULLD), and summed over the tile in 32 bits:
 *   Q4_K: d * dx * sum_j sc_j <u, x>_j - dmin * dx * sum_j m_j sum(x)_j
 *   Q6_K: d * dx * sum_g sc_g (<u, x>_g - 32 sum(x)_g)
 * (the Q4_K mins by VPDPWSSD over pairs of sub-blocks; Q6_K's -32 starts each group's sum).
 * One float step per tile and row, the same instructions whichever activation rows come
 * along: a row's result does not depend on the batch. Bounds: Q4_K |sum| < 8 * 63 * 32 * 15 *
 * 127 < 2^25, Q6_K < 16 * 128 * (16 * 63 * 127 + 32 * 16 * 127) < 2^29: no overflow.
 */
#include "quant.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include "quant_x16_vnni.h"

/* two Q4_K sub-block sums of 16-weight groups n[0..3] as one int16 pair (each at most 32 * 127) */
static inline int32_t pair_sums(const int16_t *n)
{
    uint32_t s0 = (uint16_t)(n[0] + n[1]), s1 = (uint16_t)(n[2] + n[3]);
    return (int32_t)(s0 | s1 << 16);
}

/* tile at T against rows [r0, r0 + NR): acc[i] += its 16 lanes' contribution */
#define Q4K_TILE(NR)                                                                                       \
    {                                                                                                      \
        __m512i tot[NR], mn[NR];                                                                           \
        for (int i = 0; i < NR; i++)                                                                       \
            tot[i] = mn[i] = _mm512_setzero_si512();                                                       \
        for (int j = 0; j < 8; j++) {                                                                      \
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(T + K4_SC + 16 * j))); \
            __m512i q[8];                                                                                  \
            for (int v = 0; v < 4; v++) {                                                                  \
                __m512i raw = _mm512_loadu_si512(T + K4_QS + 256 * j + 64 * v);                            \
                q[2 * v] = _mm512_and_si512(raw, low);                                                     \
                q[2 * v + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);                           \
            }                                                                                              \
            for (int i = 0; i < NR; i++) {                                                                 \
                const int8_t *x = xq + (r0 + i) * K + k0 + 32 * j;                                         \
                const __m512i dot = speculant_dot32_x16(_mm512_setzero_si512(), q, x);                     \
                tot[i] = _mm512_add_epi32(tot[i], _mm512_mullo_epi32(dot, sc));                            \
            }                                                                                              \
        }                                                                                                  \
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(T + K4_D)));                 \
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(T + K4_DMIN)));           \
        for (int i = 0; i < NR; i++) {                                                                     \
            const int64_t g0 = ((r0 + i) * K + k0) / QGROUP;                                               \
            for (int p = 0; p < 4; p++) {                                                                  \
                __m512i m = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(T + K4_M + 32 * p))); \
                mn[i] = _mm512_dpwssd_epi32(mn[i], m, _mm512_set1_epi32(pair_sums(xn + g0 + 4 * p)));     \
            }                                                                                              \
            const __m512 dx = _mm512_set1_ps(xd[g0]);                                                      \
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[i]), _mm512_mul_ps(d, dx), acc[i]);            \
            acc[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mn[i]), _mm512_mul_ps(dmin, dx), acc[i]);         \
        }                                                                                                  \
    }

#define Q6K_TILE(NR)                                                                                       \
    {                                                                                                      \
        __m512i tot[NR];                                                                                   \
        for (int i = 0; i < NR; i++)                                                                       \
            tot[i] = _mm512_setzero_si512();                                                               \
        const int64_t gx = k0 / QGROUP;                                                                    \
        for (int g = 0; g < 16; g++) {                                                                     \
            const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(T + K6_SC + 16 * g))); \
            const __m512i qh = _mm512_loadu_si512(T + K6_G + 192 * g + 128);                                     \
            const __m512i l0 = _mm512_loadu_si512(T + K6_G + 192 * g);                                    \
            const __m512i l1 = _mm512_loadu_si512(T + K6_G + 192 * g + 64);                               \
            const __m512i c0 = _mm512_or_si512(_mm512_and_si512(l0, low),                                  \
                                               _mm512_and_si512(_mm512_slli_epi16(qh, 4), top));           \
            const __m512i c1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), low),            \
                                               _mm512_and_si512(_mm512_slli_epi16(qh, 2), top));           \
            const __m512i c2 = _mm512_or_si512(_mm512_and_si512(l1, low), _mm512_and_si512(qh, top));      \
            const __m512i c3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), low),            \
                                               _mm512_and_si512(_mm512_srli_epi16(qh, 2), top));           \
            for (int i = 0; i < NR; i++) {                                                                 \
                const int8_t *x = xq + (r0 + i) * K + k0 + 16 * g;                                         \
                __m512i a = _mm512_dpbusd_epi32(_mm512_set1_epi32(-32 * xn[((r0 + i) * K) / QGROUP + gx + g]), \
                                                c0, speculant_bcast4(x));                                   \
                __m512i b = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c2, speculant_bcast4(x + 8));       \
                a = _mm512_dpbusd_epi32(a, c1, speculant_bcast4(x + 4));                                    \
                b = _mm512_dpbusd_epi32(b, c3, speculant_bcast4(x + 12));                                   \
                tot[i] = _mm512_add_epi32(tot[i], _mm512_mullo_epi32(_mm512_add_epi32(a, b), sc));         \
            }                                                                                              \
        }                                                                                                  \
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(T + K6_D)));                 \
        for (int i = 0; i < NR; i++) {                                                                     \
            const __m512 dx = _mm512_set1_ps(xd[((r0 + i) * K + k0) / QGROUP]);                            \
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[i]), _mm512_mul_ps(d, dx), acc[i]);            \
        }                                                                                                  \
    }

/* activation rows [r0, r0 + NR) against every tile of the group */
#define ROWS_BODY(NR)                                                                                      \
    {                                                                                                      \
        __m512 acc[NR];                                                                                    \
        for (int i = 0; i < NR; i++)                                                                       \
            acc[i] = _mm512_setzero_ps();                                                                  \
        for (int64_t k0 = 0; k0 < K; k0 += QTILE) {                                                        \
            const uint8_t *T = group + k0 / QTILE * tile;                                                  \
            if (q6)                                                                                        \
                Q6K_TILE(NR)                                                                               \
            else                                                                                           \
                Q4K_TILE(NR)                                                                               \
        }                                                                                                  \
        for (int i = 0; i < NR; i++)                                                                       \
            _mm512_storeu_ps(sums + (r0 + i) * XROWS, acc[i]);                                             \
    }

QUANT_VNNI_TARGET void speculant_qgroup_x16_vnni(int type, const uint8_t *group, int64_t K, int64_t R,
                                                 const int8_t *xq, const float *xd, const int16_t *xn, float *sums)
{
    const int q6 = type == QT_Q6_K_X16;
    const int64_t tile = q6 ? K6_TILE : K4_TILE;
    const __m512i low = _mm512_set1_epi8(0xf), top = _mm512_set1_epi8(0x30);
    int64_t r0;  /* each decoded sub-block serves 4 activation rows while it sits in registers */
    QUANT_ROWS_IN_FOURS(R, r0, ROWS_BODY)
}
#endif
