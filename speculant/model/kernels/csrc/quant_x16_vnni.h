/* Shared by the AVX-512 VNNI group kernels over repacked rows (quant_x16_avx512_vnni.c,
 * quant_x16_b32_avx512_vnni.c): include only in files compiled for that path. */
#ifndef SPECULANT_QUANT_X16_VNNI_H
#define SPECULANT_QUANT_X16_VNNI_H
#include <immintrin.h>
#include <string.h>

#include "quant.h"

/* the activation's 4 codes at p, in every 32-bit lane */
QUANT_VNNI_TARGET static inline __m512i speculant_bcast4(const int8_t *p)
{
    int v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* init + per 32-bit lane the dot product of its 32 codes with x[0, 32): c[k] lane l byte b holds code
 * 4k + b of lane l (unsigned); two chains of 4 VPDPBUSD each, added */
QUANT_VNNI_TARGET static inline __attribute__((always_inline)) __m512i speculant_dot32_x16(__m512i init,
                                                                                           const __m512i c[8],
                                                                                           const int8_t *x)
{
    __m512i a = _mm512_dpbusd_epi32(init, c[0], speculant_bcast4(x));
    __m512i b = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[4], speculant_bcast4(x + 16));
    a = _mm512_dpbusd_epi32(a, c[1], speculant_bcast4(x + 4));
    b = _mm512_dpbusd_epi32(b, c[5], speculant_bcast4(x + 20));
    a = _mm512_dpbusd_epi32(a, c[2], speculant_bcast4(x + 8));
    b = _mm512_dpbusd_epi32(b, c[6], speculant_bcast4(x + 24));
    a = _mm512_dpbusd_epi32(a, c[3], speculant_bcast4(x + 12));
    b = _mm512_dpbusd_epi32(b, c[7], speculant_bcast4(x + 28));
    return _mm512_add_epi32(a, b);
}
#endif
