/* Which instruction path the quantized dot products take (quant_linear.c): the best one this CPU
 * runs (cpuid on x86; on aarch64 the auxiliary vector's HWCAP, asimd and asimddp) under the
 * kernels' active path, so SPECULANT_CPU_ISA caps it too; speculant_qlinear_set_isa forces one
 * (tests). A NEON path whose file did not build (its weak symbol NULL) is not available. */
#include "kernels.h"
#include "quant.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_QUANT_X86 1
#else
#define HAVE_QUANT_X86 0
#endif

static int qisa_available(int isa)
{
    if (isa == QISA_SCALAR)
        return 1;
#if HAVE_QUANT_X86
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (isa == QISA_AVX2)
        return avx2;
    if (isa == QISA_AVX512_VNNI)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
               && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#elif defined(__aarch64__)
    /* the auxiliary vector's HWCAP (asimd, asimddp), through the kernels' dispatch */
    if (isa == QISA_NEON)
        return speculant_isa_runs(ISA_NEON) && speculant_qdot_neon != 0;
    if (isa == QISA_NEON_DOTPROD)
        return speculant_isa_runs(ISA_NEON_DOTPROD) && speculant_qdot_neon_dotprod != 0;
#endif
    return 0;
}

static int g_isa = -1; /* a path forced by speculant_qlinear_set_isa, or -1 */

/* The best path under the kernels' active one (speculant_isa_set caps it: SPECULANT_CPU_ISA). */
int speculant_qlinear_isa(void)
{
    if (g_isa >= 0)
        return g_isa;
#if HAVE_QUANT_X86 || defined(__aarch64__)
    const int active = speculant_isa_active();
    static const int ORDER[][2] = {{QISA_AVX512_VNNI, ISA_AVX512_VNNI}, {QISA_AVX2, ISA_AVX2},
                                   {QISA_NEON_DOTPROD, ISA_NEON_DOTPROD}, {QISA_NEON, ISA_NEON}};
    for (int i = 0; i < 4; i++) {
        int at = active; /* is ORDER[i][1] on the active path's chain? */
        while (at != ORDER[i][1] && at != ISA_SCALAR)
            at = speculant_isa_below(at);
        if (at == ORDER[i][1] && qisa_available(ORDER[i][0]))
            return ORDER[i][0];
    }
#endif
    return QISA_SCALAR;
}

/* force path `isa` (-1: back to the default); returns the path now in use, or -1 where this CPU lacks it */
int speculant_qlinear_set_isa(int isa)
{
    if (isa < 0) {
        g_isa = -1;
        return speculant_qlinear_isa();
    }
    if (isa >= QISA_COUNT || !qisa_available(isa))
        return -1;
    return g_isa = isa;
}

int speculant_qlinear_isa_available(int isa)
{
    return isa >= 0 && isa < QISA_COUNT && qisa_available(isa);
}

