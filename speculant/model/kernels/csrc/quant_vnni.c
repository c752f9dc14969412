/* AVX-512 VNNI weight rows for the two formats of Q4_K_M files (Q4_K, Q6_K): the
 * 256 codes of a tile are decoded straight into four registers and its 16 group
 * scales and offsets into two, then reused for every activation row. Same
 * arithmetic as quant_linear.c's tile path (quant.h): per 64 codes one VPDPBUSD,
 * the group scale times the activation block scale per lane, and per tile the
 * offsets times the activation group sums; only where the codes live differs.
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

QUANT_VNNI_TARGET static inline void q4k_tile(const uint8_t *b, __m512i u[4], __m512 *ws, __m512 *wb)
{
    float d = _cvtsh_ss((uint16_t)(b[0] | b[1] << 8)), dmin = _cvtsh_ss((uint16_t)(b[2] | b[3] << 8));
    __m128i bytes = k4_scale_bytes(b + 4);
    const __m128i dup_sc = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m128i dup_m = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    *ws = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, dup_sc))), _mm512_set1_ps(d));
    *wb = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, dup_m))),
                        _mm512_set1_ps(-dmin));
    const __m512i low = _mm512_set1_epi8(0xf);
    for (int h = 0; h < 2; h++) {  /* 64 bytes: weights 128h + [0, 32) low, [32, 64) high, then the next 64 */
        __m512i v = _mm512_loadu_si512(b + 16 + 64 * h);
        __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        u[2 * h] = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
        u[2 * h + 1] = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));
    }
}

QUANT_VNNI_TARGET static inline void q6k_tile(const uint8_t *b, __m512i u[4], __m512 *ws, __m512 *wb)
{
    float d = _cvtsh_ss((uint16_t)(b[208] | b[209] << 8));
    *ws = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 192)))),
                        _mm512_set1_ps(d));
    *wb = _mm512_mul_ps(*ws, _mm512_set1_ps(-32.0f));
    const __m512i low = _mm512_set1_epi8(0xf), two = _mm512_set1_epi8(0x30);
    /* per 16-bit lane: lower 256 bits shift the high-bit byte by one amount, upper 256 by another */
    const __m512i sh_a = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), sh_b = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    for (int n = 0; n < 2; n++) {
        __m512i ql = _mm512_loadu_si512(b + 64 * n);
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n)));
        /* weights 128n + [0, 64): low nibbles, high bits 0-1 then 2-3; [64, 128): high nibbles, bits 4-5, 6-7 */
        __m512i h01 = _mm512_and_si512(_mm512_sllv_epi64(qh, sh_a), two);
        __m512i h23 = _mm512_and_si512(_mm512_srlv_epi64(qh, sh_b), two);
        u[2 * n] = _mm512_or_si512(_mm512_and_si512(ql, low), h01);
        u[2 * n + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low), h23);
    }
}

#define ROW_GROUP 4  /* activation rows whose accumulators stay in registers */

/* one weight row (K a multiple of 256) against R activation rows: sums[r] = the row's dot product */
QUANT_VNNI_TARGET void speculant_qrow_k_vnni(int type, const uint8_t *row, int64_t K, int64_t R, const int8_t *xq,
                                             const float *xd, const float *xs, float *sums)
{
    const int bytes = type == QT_Q4_K ? 144 : 210;
    const __m512i spread[4] = {
        _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
        _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7),
        _mm512_setr_epi32(8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11),
        _mm512_setr_epi32(12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15)};
    for (int64_t r0 = 0; r0 < R; r0 += ROW_GROUP) {
        int nr = R - r0 < ROW_GROUP ? (int)(R - r0) : ROW_GROUP;
        __m512 acc[ROW_GROUP] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t k0 = 0; k0 < K; k0 += QTILE) {
            const uint8_t *b = row + k0 / QTILE * bytes;
            __m512i u[4];
            __m512 ws, wb;
            if (type == QT_Q4_K)
                q4k_tile(b, u, &ws, &wb);
            else
                q6k_tile(b, u, &ws, &wb);
            for (int i = 0; i < ROW_GROUP; i++) {
                if (i >= nr)
                    break;
                int64_t r = r0 + i, g0 = (r * K + k0) / QGROUP;
                const int8_t *x = xq + r * K + k0;
                __m512 s = _mm512_mul_ps(ws, _mm512_loadu_ps(xd + g0));
                __m512 p[4];
                for (int c = 0; c < 4; c++)  /* independent: the tile's terms, then one add into the row */
                    p[c] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u[c],
                                                                                _mm512_loadu_si512(x + 64 * c))),
                                         _mm512_permutexvar_ps(spread[c], s));
                __m512 t = _mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3]));
                t = _mm512_fmadd_ps(wb, _mm512_loadu_ps(xs + g0), t);
                acc[i] = _mm512_add_ps(acc[i], t);
            }
        }
        for (int i = 0; i < nr; i++)
            sums[r0 + i] = _mm512_reduce_add_ps(acc[i]);
    }
}
#endif
