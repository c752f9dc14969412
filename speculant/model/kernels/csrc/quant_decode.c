/* Decoding GGUF blocks into the common tile shape of quant.h: a scalar
 * decoder per format (the reference) and AVX2 decoders for the formats of the
 * common Q4_K_M and Q4_1/Q5_0/Q8_0 files. Both give the same bytes and floats: the
 * scales are computed by the same scalar code, only the code unpacking is vectorised.
 */
#include <string.h>

#include "quant.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_QUANT_X86 1
#else
#define HAVE_QUANT_X86 0
#endif

static const qformat FORMATS[] = {
    [QT_Q4_0] = {32, 18, 15, 1},   [QT_Q4_1] = {32, 20, 15, 1},   [QT_Q5_0] = {32, 22, 31, 1},
    [QT_Q8_0] = {32, 34, 255, 1},  [QT_Q4_K] = {256, 144, 15, 1}, [QT_Q5_K] = {256, 176, 31, 1},
    [QT_Q6_K] = {256, 210, 63, 1}, [QT_Q4_K_X16] = {256, 148, 15, XROWS}, [QT_Q6_K_X16] = {256, 212, 63, XROWS},
    [QT_Q4_0_X16] = {32, 18, 15, XROWS}, [QT_Q4_1_X16] = {32, 20, 15, XROWS}, [QT_Q5_0_X16] = {32, 22, 31, XROWS},
    [QT_Q8_0_X16] = {32, 34, 255, XROWS},
};

const qformat *speculant_qformat(int type)
{
    if (type < 0 || type > QT_MAX || FORMATS[type].block_elems == 0)
        return 0;
    return &FORMATS[type];
}

float speculant_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f)
        bits = sign | 0x7f800000u | (man << 13);
    else if (exp != 0)
        bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (man == 0)
        bits = sign;
    else {  /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float half_at(const uint8_t *p)
{
    return speculant_half_to_float((uint16_t)(p[0] | p[1] << 8));
}

/* scales of one 32-weight block (2 groups): ws = d, wb = offset */
static void small_scales(float d, float offset, float *ws, float *wb)
{
    ws[0] = ws[1] = d;
    wb[0] = wb[1] = offset;
}

static void decode_small(int type, const uint8_t *b, uint8_t *u, float *ws, float *wb)
{
    float d = half_at(b);
    if (type == QT_Q8_0) {
        for (int i = 0; i < 32; i++)
            u[i] = (uint8_t)(b[2 + i] ^ 0x80);  /* int8 q -> q + 128 */
        small_scales(d, -128.0f * d, ws, wb);
        return;
    }
    const uint8_t *qs = b + (type == QT_Q4_0 ? 2 : type == QT_Q4_1 ? 4 : 6);
    uint32_t qh = type == QT_Q5_0 ? (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24
                                  : 0;
    for (int j = 0; j < 16; j++) {
        u[j] = (uint8_t)((qs[j] & 0xf) | ((qh >> j) & 1) << 4);
        u[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
    float offset = type == QT_Q4_0 ? -8.0f * d : type == QT_Q4_1 ? half_at(b + 2) : -16.0f * d;
    small_scales(d, offset, ws, wb);
}

static void k4_scales(const uint8_t *b, float *ws, float *wb)
{
    float d = half_at(b), dmin = half_at(b + 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        speculant_scale_min_k4(j, b + 4, &sc, &m);
        ws[2 * j] = ws[2 * j + 1] = d * (float)sc;
        wb[2 * j] = wb[2 * j + 1] = -dmin * (float)m;
    }
}

static void q6k_scales(const uint8_t *b, float *ws, float *wb)
{
    float d = half_at(b + 208);
    for (int g = 0; g < 16; g++) {
        ws[g] = d * (float)(int8_t)b[192 + g];
        wb[g] = -32.0f * ws[g];
    }
}

static void decode_q4k(const uint8_t *b, uint8_t *u)
{
    const uint8_t *qs = b + 16;
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            u[64 * j + l] = qs[32 * j + l] & 0xf;
            u[64 * j + 32 + l] = qs[32 * j + l] >> 4;
        }
}

static void decode_q5k(const uint8_t *b, uint8_t *u)
{
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            u[64 * j + l] = (uint8_t)((qs[32 * j + l] & 0xf) | ((qh[l] >> (2 * j)) & 1) << 4);
            u[64 * j + 32 + l] = (uint8_t)((qs[32 * j + l] >> 4) | ((qh[l] >> (2 * j + 1)) & 1) << 4);
        }
}

static void decode_q6k(const uint8_t *b, uint8_t *u)
{
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        uint8_t *y = u + 128 * n;
        for (int l = 0; l < 32; l++) {
            y[l] = (uint8_t)((ql[l] & 0xf) | ((qh[l] >> 0) & 3) << 4);
            y[l + 32] = (uint8_t)((ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4);
            y[l + 64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
            y[l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
        }
    }
}

#if HAVE_QUANT_X86
QUANT_AVX2_TARGET static void decode_q4k_avx2(const uint8_t *b, uint8_t *u)
{
    const __m256i low = _mm256_set1_epi8(0xf);
    for (int j = 0; j < 4; j++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * j));
        _mm256_storeu_si256((__m256i *)(u + 64 * j), _mm256_and_si256(v, low));
        _mm256_storeu_si256((__m256i *)(u + 64 * j + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
    }
}

QUANT_AVX2_TARGET static void decode_q6k_avx2(const uint8_t *b, uint8_t *u)
{
    const __m256i low = _mm256_set1_epi8(0xf), two = _mm256_set1_epi8(0x30);
    for (int n = 0; n < 2; n++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(b + 64 * n));
        __m256i c = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32));
        __m256i h = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
        uint8_t *y = u + 128 * n;
        _mm256_storeu_si256((__m256i *)y, _mm256_or_si256(_mm256_and_si256(a, low),
                                                          _mm256_and_si256(_mm256_slli_epi16(h, 4), two)));
        _mm256_storeu_si256((__m256i *)(y + 32), _mm256_or_si256(_mm256_and_si256(c, low),
                                                                 _mm256_and_si256(_mm256_slli_epi16(h, 2), two)));
        _mm256_storeu_si256((__m256i *)(y + 64), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low),
                                                                 _mm256_and_si256(h, two)));
        _mm256_storeu_si256((__m256i *)(y + 96), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low),
                                                                 _mm256_and_si256(_mm256_srli_epi16(h, 2), two)));
    }
}

QUANT_AVX2_TARGET static void decode_nibbles16_avx2(const uint8_t *qs, uint8_t *u)
{
    __m128i v = _mm_loadu_si128((const __m128i *)qs), low = _mm_set1_epi8(0xf);
    _mm_storeu_si128((__m128i *)u, _mm_and_si128(v, low));
    _mm_storeu_si128((__m128i *)(u + 16), _mm_and_si128(_mm_srli_epi16(v, 4), low));
}

/* Q5_0: the nibbles, then bit i of the block's 32-bit qh as bit 4 of code i (bytes spread by a
 * shuffle, each byte's own bit picked by a compare) */
QUANT_AVX2_TARGET static void decode_q5_0_avx2(const uint8_t *b, uint8_t *u)
{
    decode_nibbles16_avx2(b + 6, u);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit), _mm256_set1_epi8(0x10));
    _mm256_storeu_si256((__m256i *)u, _mm256_or_si256(_mm256_loadu_si256((const __m256i *)u), h));
}

QUANT_AVX2_TARGET static void decode_q8_0_avx2(const uint8_t *b, uint8_t *u)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)(b + 2));
    _mm256_storeu_si256((__m256i *)u, _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)));
}
#endif

void speculant_qdecode(int type, const uint8_t *row, int64_t k0, int n, uint8_t *u, float *ws, float *wb, int simd)
{
    const qformat *f = speculant_qformat(type);
    const uint8_t *b = row + k0 / f->block_elems * f->block_bytes;
#if !HAVE_QUANT_X86
    simd = 0;
#endif
    for (int done = 0; done < n; done += f->block_elems, b += f->block_bytes) {
        uint8_t *ub = u + done;
        float *s = ws + done / QGROUP, *o = wb + done / QGROUP;
        switch (type) {
        case QT_Q4_K:
            k4_scales(b, s, o);
#if HAVE_QUANT_X86
            if (simd) { decode_q4k_avx2(b, ub); break; }
#endif
            decode_q4k(b, ub);
            break;
        case QT_Q5_K:
            k4_scales(b, s, o);
            decode_q5k(b, ub);
            break;
        case QT_Q6_K:
            q6k_scales(b, s, o);
#if HAVE_QUANT_X86
            if (simd) { decode_q6k_avx2(b, ub); break; }
#endif
            decode_q6k(b, ub);
            break;
        default:
#if HAVE_QUANT_X86
            if (simd && (type == QT_Q4_0 || type == QT_Q4_1)) {
                float d = half_at(b);
                decode_nibbles16_avx2(b + (type == QT_Q4_0 ? 2 : 4), ub);
                small_scales(d, type == QT_Q4_0 ? -8.0f * d : half_at(b + 2), s, o);
                break;
            }
            if (simd && type == QT_Q5_0) {
                float d = half_at(b);
                decode_q5_0_avx2(b, ub);
                small_scales(d, -16.0f * d, s, o);
                break;
            }
            if (simd && type == QT_Q8_0) {
                float d = half_at(b);
                decode_q8_0_avx2(b, ub);
                small_scales(d, -128.0f * d, s, o);
                break;
            }
#endif
            decode_small(type, b, ub, s, o);
        }
    }
}

/* out[i, :] = row ids[i] of W dequantized (float32 [n_ids, K]): embedding lookups on a quantized table.
 * 0, or -1 for a type without a kernel, a bad K or an id outside [0, N). */
int speculant_qdequant_rows(int type, const uint8_t *w, int64_t N, int64_t K, const int64_t *ids, int64_t n_ids,
                            float *out)
{
    const qformat *f = speculant_qformat(type);
    if (!f || K <= 0 || K % f->block_elems || K % 32)
        return -1;
    for (int64_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= N)
            return -1;
    int64_t row_bytes = K / f->block_elems * f->block_bytes;
    for (int64_t i = 0; i < n_ids; i++) {
        uint8_t u[QTILE];
        float ws[QTILE / QGROUP], wb[QTILE / QGROUP];
        for (int64_t k0 = 0; k0 < K; k0 += QTILE) {
            int n = K - k0 < QTILE ? (int)(K - k0) : QTILE;
            if (f->group_rows > 1)
                speculant_qdecode_x16(type, w, K, ids[i], k0, n, u, ws, wb);
            else
                speculant_qdecode(type, w + ids[i] * row_bytes, k0, n, u, ws, wb, 0);
            for (int j = 0; j < n; j++)
                out[i * K + k0 + j] = ws[j / QGROUP] * (float)u[j] + wb[j / QGROUP];
        }
    }
    return 0;
}
