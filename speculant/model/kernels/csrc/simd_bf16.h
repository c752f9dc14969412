/* bfloat16 <-> float32 on AVX2 and AVX-512 registers, the vector forms of bf16.h (same bits):
 * widening is a shift; narrowing rounds to nearest even and keeps NaN a quiet NaN.
 * Included by the *_avx2.c and *_avx512.c path files only. */
#ifndef SPECULANT_SIMD_BF16_H
#define SPECULANT_SIMD_BF16_H
#include <immintrin.h>
#include <stdint.h>

#include "kernels.h"

/* 8 bfloat16 numbers widened to float32 (exact). */
PATH_AVX2 static inline __m256 widen8(__m128i v)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

/* float32 lanes rounded to bfloat16, still in the low halves of 32-bit lanes. */
PATH_AVX2 static inline __m256i round8_lanes(__m256 f)
{
    const __m256i u = _mm256_castps_si256(f);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, quiet, nan);
}

/* 8 float32 numbers rounded to 8 bfloat16 numbers. */
PATH_AVX2 static inline __m128i round8(__m256 f)
{
    const __m256i r = round8_lanes(f);
    /* packus works per 128-bit half: [r0..r3 r0..r3 | r4..r7 r4..r7]; keep quadwords 0 and 2 */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

/* 16 bfloat16 numbers widened to float32 (exact). */
PATH_AVX512 static inline __m512 widen16(__m256i v)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

/* 16 float32 numbers rounded to 16 bfloat16 numbers. */
PATH_AVX512 static inline __m256i round16(__m512 f)
{
    const __m512i u = _mm512_castps_si512(f);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}
#endif
