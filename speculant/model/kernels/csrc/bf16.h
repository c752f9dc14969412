/* bfloat16 <-> float32 for the C kernels: widening is exact; narrowing rounds to
 * nearest, ties to even (what torch and VCVTNEPS2BF16 do), and keeps NaN a quiet NaN. */
#ifndef SPECULANT_BF16_H
#define SPECULANT_BF16_H
#include <stdint.h>
#include <string.h>

static inline float widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t round_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
#endif
