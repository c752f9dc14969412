/* What this CPU can run, read once from cpuid: the one place that decides
 * whether the AVX-512 bfloat16 paths (the vectorised attention task, the
 * VDPBF16PS score dot products, the blocked linear kernel and the fused decoder
 * built on it) may run.
 *
 * Those paths are compiled with target attributes whatever -march the library
 * is built for, so every file compiles for any x86-64 level; the paths are only
 * entered where all the features their intrinsics use are present here:
 * AVX512F, AVX512BW (16-bit masked loads), AVX512DQ, AVX512VL (256-bit masked
 * loads and stores) and AVX512_BF16 (VDPBF16PS).
 *
 * speculant_cpu_features(): bit i set when feature i of CPU_FEATURE_NAMES is
 * present (0 on other architectures); the Python side names the missing ones.
 */
#include "kernels.h"

int speculant_cpu_features(void)
{
    int mask = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    mask |= __builtin_cpu_supports("avx512f") ? 1 << CPU_AVX512F : 0;
    mask |= __builtin_cpu_supports("avx512bw") ? 1 << CPU_AVX512BW : 0;
    mask |= __builtin_cpu_supports("avx512dq") ? 1 << CPU_AVX512DQ : 0;
    mask |= __builtin_cpu_supports("avx512vl") ? 1 << CPU_AVX512VL : 0;
    mask |= __builtin_cpu_supports("avx512bf16") ? 1 << CPU_AVX512BF16 : 0;
#endif
    return mask;
}

int speculant_cpu_has_bf16_paths(void)
{
    return (speculant_cpu_features() & CPU_BF16_PATHS) == CPU_BF16_PATHS;
}
