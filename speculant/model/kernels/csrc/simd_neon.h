/* bfloat16 <-> float32 on NEON registers, the vector forms of bf16.h (same bits): widening
 * is a shift; narrowing is bf16.h's DEFINE_ROUND_LANES on 4 lanes, then a narrowing move. Included by the
 * *_neon.c and *_neon_dotprod.c path files only (aarch64). */
#ifndef SPECULANT_SIMD_NEON_H
#define SPECULANT_SIMD_NEON_H
#include <arm_neon.h>
#include <stdint.h>

#include "bf16.h"
#include "kernels.h"

/* 4 bfloat16 numbers widened to float32 (exact). */
PATH_NEON static inline float32x4_t widen4(uint16x4_t v)
{
    return vreinterpretq_f32_u32(vshll_n_u16(v, 16));
}

typedef uint32_t u32x4 __attribute__((vector_size(16)));
DEFINE_ROUND_LANES(round_lanes4, u32x4, PATH_NEON)

/* 4 float32 numbers rounded to bfloat16 (nearest even, NaN kept quiet): bf16.h's rule. */
PATH_NEON static inline uint16x4_t round4(float32x4_t f)
{
    return vmovn_u32((uint32x4_t)round_lanes4((u32x4)vreinterpretq_u32_f32(f)));
}
#endif
