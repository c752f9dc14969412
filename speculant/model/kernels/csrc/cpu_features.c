/* What this CPU can run, read once from cpuid (x86) or the auxiliary vector
 * (aarch64): the one place that decides which instruction path each dispatched
 * kernel takes (kernels.h, "Runtime dispatch").
 *
 * Every path is compiled with its own target attribute whatever -march the
 * library is built for, so the library builds for a baseline (x86-64, armv8-a)
 * and a path is only entered where all the features its code uses are present
 * here (and the operating system saves their registers: __builtin_cpu_supports
 * checks XGETBV). The cap (speculant_isa_set, from SPECULANT_CPU_ISA) lowers
 * the active path for a whole process: tests walk every path with it.
 *
 * speculant_cpu_features(): bit i set when feature i of abi.CPU_FEATURE_NAMES is
 * present (0 on other architectures); the Python side names the missing ones.
 */
#include "kernels.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

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

int speculant_isa_runs(int isa)
{
    switch (isa) {
    case ISA_SCALAR:
        return 1;
#if defined(__x86_64__) && defined(__GNUC__)
    case ISA_AVX512_BF16:
        if (!__builtin_cpu_supports("avx512bf16"))
            return 0;
        /* fall through: the bfloat16 path also uses the AVX-512 base */
    case ISA_AVX512_VNNI:
        if (isa == ISA_AVX512_VNNI && !__builtin_cpu_supports("avx512vnni"))
            return 0;
        /* fall through */
    case ISA_AVX512:
        if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
              && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")))
            return 0;
        /* fall through */
    case ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#elif defined(__aarch64__) && defined(__linux__)
    case ISA_NEON_DOTPROD:
        return (getauxval(AT_HWCAP) & (HWCAP_ASIMD | HWCAP_ASIMDDP)) == (HWCAP_ASIMD | HWCAP_ASIMDDP);
    case ISA_NEON:
        return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#elif defined(__aarch64__)
    case ISA_NEON:
        return 1; /* part of armv8-a */
#endif
    default:
        return 0;
    }
}

int speculant_isa_below(int isa)
{
    switch (isa) {
    case ISA_AVX512_BF16: return ISA_AVX512_VNNI;
    case ISA_AVX512_VNNI: return ISA_AVX512;
    case ISA_AVX512: return ISA_AVX2;
    case ISA_NEON_DOTPROD: return ISA_NEON;
    default: return ISA_SCALAR;
    }
}

static int top_of_chain(void)
{
#if defined(__aarch64__)
    return ISA_NEON_DOTPROD;
#else
    return ISA_AVX512_BF16;
#endif
}

/* the first path at or under `isa` on its chain that this CPU runs */
static int runnable_from(int isa)
{
    while (!speculant_isa_runs(isa))
        isa = speculant_isa_below(isa);
    return isa;
}

static int detected = -1, active = -1;

int speculant_isa_detected(void)
{
    if (detected < 0) {
#if defined(__x86_64__) && defined(__GNUC__)
        __builtin_cpu_init();
#endif
        detected = runnable_from(top_of_chain());
    }
    return detected;
}

int speculant_isa_active(void)
{
    if (active < 0)
        active = speculant_isa_detected();
    return active;
}

int speculant_isa_set(int isa)
{
    active = isa < 0 || isa >= ISA_COUNT ? speculant_isa_detected() : runnable_from(isa);
    return active;
}
