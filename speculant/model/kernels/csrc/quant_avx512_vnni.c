/* AVX-512 VNNI weight rows for the two formats of Q4_K_M files (Q4_K, Q6_K), against
 * activations quantized per block of 256 (one scale dx per tile). Integer arithmetic
 * up to one float step per tile: per 64 codes VPMADDUBSW (code x activation, pairs
 * summed in 16 bits: at most 63 * 127 * 2) then VPDPWSSD (times the group's integer
 * scale, summed into 32 bits); the offsets (Q4_K mins, Q6_K's -32) times the
 * activations' integer group sums the same way. So per tile and row:
 *   Q4_K: d * dx * sum_g sc_g <u, x>_g - dmin * dx * sum_g m_g sum(x)_g
 *   Q6_K: d * dx * sum_g sc_g (<u, x>_g - 32 sum(x)_g)
 * Q4_K codes stay in the file's nibble order (no shuffles): the activations are given in
 * that order as well (quant_linear.c keeps a copy per row, speculant_q4k_order).
 * The tile's 256 codes are decoded into four registers and reused for up to 8 rows; each
 * row's 16 integer lanes are folded to 8 before its float steps, which are 256 bits wide.
 */
#include <string.h>

#include "quant.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

static inline uint32_t load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* the 8 six-bit scales (bytes 0-7) and mins (bytes 8-15) packed in a K-quant's 12 bytes */
static inline __m128i k4_scale_bytes(const uint8_t *s)
{
    uint32_t a = load_u32(s), b = load_u32(s + 4), c = load_u32(s + 8);
    uint32_t sc_lo = a & 0x3f3f3f3fu, m_lo = b & 0x3f3f3f3fu;
    uint32_t sc_hi = (c & 0x0f0f0f0fu) | ((a >> 6) & 0x03030303u) << 4;
    uint32_t m_hi = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 6) & 0x03030303u) << 4;
    return _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)m_lo, (int)m_hi);
}

typedef struct {
    __m512i u[4];    /* codes of weights 64c .. 64c + 63 */
    __m512i sc[4];   /* per 16-bit lane of chunk c's pair sums: its group's integer scale */
    __m256i off;     /* per group: Q4_K the min m, Q6_K the scale (16 x int16) */
    float d, dmin;   /* Q6_K: dmin unused */
} ktile;

/* SPREAD[k][c][i]: the scale that 16-bit lane i (weights 64c + 2i, + 1) of chunk c reads, for
 * scales of 32 weights (k = 0, Q4_K) or of 16 (k = 1, Q6_K) */
static int16_t SPREAD[2][4][32] __attribute__((aligned(64)));

__attribute__((constructor)) static void fill_spread(void)
{
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < 32; i++) {
            /* Q4_K chunk c = 2h + part holds, in its 64 codes, weights 128h + 32 part + [0, 32) then
             * + 64 + [0, 32): groups of 32 4h + part, then 4h + part + 2 */
            SPREAD[0][c][i] = (int16_t)(4 * (c / 2) + c % 2 + 2 * (i >= 16));
            SPREAD[1][c][i] = (int16_t)((64 * c + 2 * i) / 16);
        }
}

QUANT_VNNI_TARGET static inline void spread_scales(__m512i scales, int k, __m512i out[4])
{
    for (int c = 0; c < 4; c++)
        out[c] = _mm512_permutexvar_epi16(_mm512_load_si512(SPREAD[k][c]), scales);
}

QUANT_VNNI_TARGET static inline void q4k_tile(const uint8_t *b, ktile *t)
{
    t->d = _cvtsh_ss((uint16_t)(b[0] | b[1] << 8));
    t->dmin = _cvtsh_ss((uint16_t)(b[2] | b[3] << 8));
    __m128i bytes = k4_scale_bytes(b + 4);
    spread_scales(_mm512_cvtepu8_epi16(_mm256_castsi128_si256(bytes)), 0, t->sc);
    const __m128i dup_m = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    t->off = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(bytes, dup_m));
    const __m512i low = _mm512_set1_epi8(0xf);
    /* 64 bytes: weights 128h + [0, 32) low, [32, 64) high, then the next 64; the codes stay in
     * that order, and the activations come in it too (speculant_q4k_order) */
    for (int h = 0; h < 2; h++) {
        __m512i v = _mm512_loadu_si512(b + 16 + 64 * h);
        t->u[2 * h] = _mm512_and_si512(v, low);
        t->u[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
}

QUANT_VNNI_TARGET static inline void q6k_tile(const uint8_t *b, ktile *t)
{
    t->d = _cvtsh_ss((uint16_t)(b[208] | b[209] << 8));
    t->dmin = 0.0f;
    t->off = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    spread_scales(_mm512_castsi256_si512(t->off), 1, t->sc);
    const __m512i low = _mm512_set1_epi8(0xf), two = _mm512_set1_epi8(0x30);
    /* per 64-bit lane: the lower 256 bits shift the high-bit bytes by one amount, the upper by another */
    const __m512i sh_a = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), sh_b = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    for (int n = 0; n < 2; n++) {
        __m512i ql = _mm512_loadu_si512(b + 64 * n);
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n)));
        /* weights 128n + [0, 64): low nibbles, high bits 0-1 then 2-3; [64, 128): high nibbles, bits 4-5, 6-7 */
        __m512i h01 = _mm512_and_si512(_mm512_sllv_epi64(qh, sh_a), two);
        __m512i h23 = _mm512_and_si512(_mm512_srlv_epi64(qh, sh_b), two);
        t->u[2 * n] = _mm512_or_si512(_mm512_and_si512(ql, low), h01);
        t->u[2 * n + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low), h23);
    }
}

#define ROW_GROUP 8  /* activation rows each decoded tile serves while it sits in registers */

/* tile `t` against one activation row (x: its 256 codes, xn: its 16 group sums, dx: its scale),
 * into acc (8 x float). The same instructions for every row slot and every R: row-invariant. */
QUANT_VNNI_TARGET static inline __m256 row_tile(const ktile *t, int q6, const int8_t *x, const int16_t *xn, float dx,
                                                __m256 acc)
{
    __m512i dot = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++)
        dot = _mm512_dpwssd_epi32(dot, _mm512_maddubs_epi16(t->u[c], _mm512_loadu_si512(x + 64 * c)), t->sc[c]);
    /* 16 lanes to 8 in integers (exact), then one 256-bit float step per term */
    __m256i dot8 = _mm256_add_epi32(_mm512_castsi512_si256(dot), _mm512_extracti64x4_epi64(dot, 1));
    /* per group: offset x the group's activation sum, 8 x int32 (pairs of groups) */
    __m256i off = _mm256_madd_epi16(t->off, _mm256_loadu_si256((const __m256i *)xn));
    if (q6)
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot8, _mm256_slli_epi32(off, 5))),
                               _mm256_set1_ps(t->d * dx), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot8), _mm256_set1_ps(t->d * dx), acc);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(off), _mm256_set1_ps(-t->dmin * dx), acc);
}

QUANT_VNNI_TARGET static inline float sum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* rows [r0, r0 + NR) of one weight row: each tile decoded once for all NR rows */
#define ROWS_BODY(NR)                                                                                        \
    {                                                                                                        \
        __m256 acc[NR];                                                                                      \
        for (int i = 0; i < NR; i++)                                                                         \
            acc[i] = _mm256_setzero_ps();                                                                    \
        for (int64_t k0 = 0; k0 < K; k0 += QTILE) {                                                          \
            ktile t;                                                                                         \
            if (q6)                                                                                          \
                q6k_tile(row + k0 / QTILE * bytes, &t);                                                      \
            else                                                                                             \
                q4k_tile(row + k0 / QTILE * bytes, &t);                                                      \
            for (int i = 0; i < NR; i++) {                                                                   \
                int64_t r = r0 + i, g0 = (r * K + k0) / QGROUP;                                              \
                acc[i] = row_tile(&t, q6, xq + r * K + k0, xn + g0, xd[g0], acc[i]);                         \
            }                                                                                                \
        }                                                                                                    \
        for (int i = 0; i < NR; i++)                                                                         \
            sums[r0 + i] = sum8(acc[i]);                                                                     \
    }

/* one weight row (K a multiple of 256) against R activation rows quantized per 256:
 * sums[r] = the row's dot product with activation row r */
QUANT_VNNI_TARGET void speculant_qrow_k_vnni(int type, const uint8_t *row, int64_t K, int64_t R, const int8_t *xq,
                                             const float *xd, const int16_t *xn, float *sums)
{
    const int q6 = type == QT_Q6_K, bytes = q6 ? 210 : 144;
    int64_t r0 = 0;
    for (; R - r0 >= ROW_GROUP; r0 += ROW_GROUP)
        ROWS_BODY(ROW_GROUP)
    /* the rest in one pass too, with a row count the compiler knows (registers, not memory) */
    switch (R - r0) {
    case 7: ROWS_BODY(7) break;
    case 6: ROWS_BODY(6) break;
    case 5: ROWS_BODY(5) break;
    case 4: ROWS_BODY(4) break;
    case 3: ROWS_BODY(3) break;
    case 2: ROWS_BODY(2) break;
    case 1: ROWS_BODY(1) break;
    default: break;
    }
}
#endif
