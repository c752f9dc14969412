/* bfloat16 <-> float32 on NEON registers, the vector forms of bf16.h (same bits): widening
 * is a shift; narrowing rounds to nearest even and keeps NaN a quiet NaN. Included by the
 * *_neon.c and *_neon_dotprod.c path files only (aarch64). */
#ifndef SPECULANT_SIMD_NEON_H
#define SPECULANT_SIMD_NEON_H
#include <arm_neon.h>
#include <stdint.h>

#include "kernels.h"

/* 4 bfloat16 numbers widened to float32 (exact). */
PATH_NEON static inline float32x4_t widen4(uint16x4_t v)
{
    return vreinterpretq_f32_u32(vshll_n_u16(v, 16));
}

/* 4 float32 numbers rounded to bfloat16 (nearest even, NaN kept quiet): bf16.h's rule. */
PATH_NEON static inline uint16x4_t round4(float32x4_t f)
{
    const uint32x4_t u = vreinterpretq_u32_f32(f);
    const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffffu)), vdupq_n_u32(0x7f800000u));
    const uint32x4_t odd = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t r = vshrq_n_u32(vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fffu), odd)), 16);
    const uint32x4_t quiet = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x40u));
    return vmovn_u32(vbslq_u32(nan, quiet, r));
}
#endif
