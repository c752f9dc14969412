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

/* round_bf16 on every lane of a GCC vector of float32 bit patterns (uint32_t lanes; the SIMD paths'
 * registers cast to it): the bfloat16 result in the low half of each lane. One definition for
 * every width, instantiated per path: DEFINE_ROUND_LANES(name, vector type, path attribute). */
#define DEFINE_ROUND_LANES(NAME, U32V, PATH)                                                        \
    PATH static inline U32V NAME(U32V u)                                                            \
    {                                                                                               \
        typedef int32_t i32v_ __attribute__((vector_size(sizeof(U32V))));                          \
        const U32V nan = (U32V)((i32v_)(u & 0x7fffffffu) > (i32v_)(u - u + 0x7f800000u));           \
        const U32V r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;                                      \
        return (r & ~nan) | (((u >> 16) | 0x40u) & nan);                                            \
    }
#endif
