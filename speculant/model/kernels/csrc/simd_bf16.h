/* bfloat16 <-> float32 on AVX2 and AVX-512 registers, the vector forms of bf16.h (same bits):
 * widening is a shift; narrowing is bf16.h's DEFINE_ROUND_LANES on 8 or 16 lanes, then a pack.
 * Included by the *_avx2.c and *_avx512*.c path files only. */
#ifndef SPECULANT_SIMD_BF16_H
#define SPECULANT_SIMD_BF16_H
#include <immintrin.h>
#include <stdint.h>

#include "bf16.h"
#include "kernels.h"

typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
DEFINE_ROUND_LANES(round_lanes8, u32x8, PATH_AVX2)
DEFINE_ROUND_LANES(round_lanes16, u32x16, PATH_AVX512)

/* 8 bfloat16 numbers widened to float32 (exact). */
PATH_AVX2 static inline __m256 widen8(__m128i v)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

/* 8 float32 numbers rounded to 8 bfloat16 numbers. */
PATH_AVX2 static inline __m128i round8(__m256 f)
{
    const __m256i r = (__m256i)round_lanes8((u32x8)_mm256_castps_si256(f));
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
    return _mm512_cvtepi32_epi16((__m512i)round_lanes16((u32x16)_mm512_castps_si512(f)));
}
#endif
