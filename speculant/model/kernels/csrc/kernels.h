/* Row-level pieces of the C kernels, shared with the fused decoder layers
 * (decoder_bf16.c), which runs them inside one OpenMP parallel region. Each
 * computes exactly what its kernel's public entry point computes for the
 * same rows, so the fused forward and the per-operator one give the same bits.
 */
#ifndef SPECULANT_KERNELS_H
#define SPECULANT_KERNELS_H
#include <stdint.h>

/* Runtime dispatch (cpu_features.c). The library is built once for a baseline -march (x86-64,
 * armv8-a) and holds every instruction path; which one runs is chosen at run time from cpuid,
 * capped by speculant_isa_set() (SPECULANT_CPU_ISA on the Python side).
 *
 * Paths, in enum order. x86 chain: AVX512_BF16 > AVX512_VNNI > AVX512 > AVX2 > SCALAR;
 * aarch64 chain: NEON_DOTPROD > NEON > SCALAR. speculant_isa_below() walks a chain down.
 *
 * How to add a function with per-ISA variants:
 *   1. write the scalar variant in the function's own file (always built: the reference);
 *   2. put each SIMD variant in its own file named <name>_<path>.c (e.g. linear_bf16_avx2.c),
 *      every function there marked with that path's PATH_* target attribute below, and declare it
 *      here with SPECULANT_VARIANT (a weak symbol): build.py compiles each file on its own, and a
 *      <name>_<path>.c that fails to build is left out, so its weak symbol is NULL and only that
 *      path is lost;
 *   3. make a table indexed by path, NULL where there is no variant, and call through
 *      SPECULANT_PICK(table): the active path's entry, else the next one down its chain
 *      (the scalar entry ends every chain, so it must be filled):
 *
 *        static const my_fn TABLE[ISA_COUNT] = {[ISA_SCALAR] = my_scalar, [ISA_AVX2] = my_avx2};
 *        my_fn f; SPECULANT_PICK(TABLE, f); f(...);
 *
 *   4. tests: tests/model/kernels/test_isa_paths.py walks every path this CPU runs
 *      (speculant_isa_set) and compares it with the scalar one.
 */
enum speculant_isa {
    ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AVX512_VNNI = 3, ISA_AVX512_BF16 = 4,
    ISA_NEON = 5, ISA_NEON_DOTPROD = 6, ISA_COUNT = 7
};
int speculant_isa_detected(void);      /* the best path this CPU runs (cpuid) */
int speculant_isa_runs(int isa);       /* 1 where this CPU has every feature the path uses */
int speculant_isa_active(void);        /* the detected path, capped */
int speculant_isa_below(int isa);      /* the next path down isa's chain (SCALAR stays SCALAR) */
/* Cap the paths at `isa` (-1: no cap); returns the path now active (the first one at or
 * under the cap that this CPU runs). */
int speculant_isa_set(int isa);

#define SPECULANT_PICK(table, out)                                                                  \
    do {                                                                                            \
        int isa_ = speculant_isa_active();                                                          \
        while (!(table)[isa_])                                                                      \
            isa_ = speculant_isa_below(isa_);                                                       \
        (out) = (table)[isa_];                                                                      \
    } while (0)
#define SPECULANT_VARIANT __attribute__((weak))

/* `void name(ARGS)` as one C body (`body`, a static always_inline function) compiled per x86 path, the
 * compiler vectorising it for that path's registers, and dispatched like any other: for element-wise
 * and fixed-order code whose bits do not depend on the vector width (builds use -ffp-contract=off,
 * so no multiply-add is contracted). ARGS and CALL: the parameter list and the call's arguments,
 * each in parentheses. */
#if defined(__x86_64__) && defined(__GNUC__)
#define SPECULANT_CLONED(name, body, ARGS, CALL)                                                     \
    static void name##_scalar ARGS { body CALL; }                                                    \
    PATH_AVX2 static void name##_avx2 ARGS { body CALL; }                                            \
    PATH_AVX512 static void name##_avx512 ARGS { body CALL; }                                        \
    void name ARGS                                                                                   \
    {                                                                                                \
        typedef void(*fn_) ARGS;                                                                     \
        static const fn_ TABLE[ISA_COUNT] = {                                                        \
            [ISA_SCALAR] = name##_scalar, [ISA_AVX2] = name##_avx2, [ISA_AVX512] = name##_avx512};  \
        fn_ f;                                                                                       \
        SPECULANT_PICK(TABLE, f);                                                                    \
        f CALL;                                                                                      \
    }
#elif defined(__aarch64__) && defined(__GNUC__)
/* aarch64: the C body is the scalar path (the compiler may vectorise it for armv8-a's NEON), and
 * name##_neon, explicit NEON intrinsics in <kernel>_neon.c (declared weak below), the NEON one. */
#define SPECULANT_CLONED(name, body, ARGS, CALL)                                                     \
    static void name##_scalar ARGS { body CALL; }                                                    \
    void name ARGS                                                                                   \
    {                                                                                                \
        typedef void(*fn_) ARGS;                                                                     \
        static const fn_ TABLE[ISA_COUNT] = {[ISA_SCALAR] = name##_scalar, [ISA_NEON] = name##_neon}; \
        fn_ f;                                                                                       \
        SPECULANT_PICK(TABLE, f);                                                                    \
        f CALL;                                                                                      \
    }
#else
#define SPECULANT_CLONED(name, body, ARGS, CALL) \
    void name ARGS { body CALL; }
#endif

/* Each path's target attribute: every feature its code uses. */
#define PATH_AVX2 __attribute__((target("avx2,fma,f16c")))
#define PATH_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")))
#define PATH_AVX512_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#define PATH_AVX512_BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#define BF16_PATH_TARGET PATH_AVX512_BF16
/* aarch64: NEON (ASIMD, part of armv8-a) and the dot-product extension (SDOT/UDOT, armv8.2-a's
 * +dotprod: GCC's arm_neon.h declares vdotq_s32 under that arch, so the attribute names it) */
#define PATH_NEON __attribute__((target("+simd")))
#define PATH_NEON_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))

/* cpu_features.c: the features the AVX-512 bfloat16 paths need, as bits of speculant_cpu_features()
 * (the order of abi.CPU_FEATURE_NAMES) */
enum { CPU_AVX512F = 0, CPU_AVX512BW = 1, CPU_AVX512DQ = 2, CPU_AVX512VL = 3, CPU_AVX512BF16 = 4 };
#define CPU_BF16_PATHS 0x1f
int speculant_cpu_features(void);
/* 1 where every feature of CPU_BF16_PATHS is present */
int speculant_cpu_has_bf16_paths(void);

/* paged_attention.c: check every span's reads and writes against the pool before any is made:
 * span ids within the n_seqs rows of block_tables, query rows within [0, num_tokens), positions
 * from 0, a table entry for every block up to the span's end, each entry a block of the pool
 * [0, num_blocks). Returns 0, or -3 with bad[SPAN_BAD_FIELDS] describing the first offender. */
enum { BAD_BLOCK_ID = 0, BAD_TABLE_SHORT = 1, BAD_ROWS = 2, BAD_SPAN_ID = 3 };
#define SPAN_BAD_FIELDS 6 /* {kind, span, table entry, block id, first position, end} */
int speculant_check_spans(const int64_t *cu_query_lens, const int64_t *starts, const int64_t *block_tables,
                          int64_t n_seqs, int64_t max_blocks, const int64_t *span_ids, int64_t n_spans,
                          int64_t num_tokens, int64_t num_blocks, int64_t block_size, int64_t *bad);

/* rms_norm.c: rows [t0, t1) of weight * rms_norm(x); lanes 4, 8 or 16 (checked by the caller). */
void speculant_rms_norm_rows(const uint16_t *x, int64_t t0, int64_t t1, int64_t ldx, const uint16_t *weight,
                             int64_t H, float eps, int lanes, uint16_t *out, int64_t ldo);

/* The NEON variants of the three row kernels above (rms_norm_neon.c, rotary_neon.c, silu_mul_neon.c):
 * explicit intrinsics, the same bits as the scalar C (aarch64 only; NULL where not built). */
SPECULANT_VARIANT void speculant_rms_norm_rows_neon(const uint16_t *x, int64_t t0, int64_t t1, int64_t ldx,
                                                    const uint16_t *weight, int64_t H, float eps, int lanes,
                                                    uint16_t *out, int64_t ldo);
SPECULANT_VARIANT void speculant_rotary_rows_neon(const uint16_t *x, int64_t t0, int64_t t1, int64_t ldx,
                                                  int64_t heads, int64_t D, const uint16_t *cos, const uint16_t *sin,
                                                  uint16_t *out);
SPECULANT_VARIANT void speculant_silu_mul_cols_neon(const uint16_t *gate_up, int64_t t, int64_t ld, int64_t I,
                                                    int64_t i0, int64_t i1, const uint16_t *table, uint16_t *out);

/* rotary.c: tokens [t0, t1) of the rotation (out [T, heads, D] contiguous). */
void speculant_rotary_rows(const uint16_t *x, int64_t t0, int64_t t1, int64_t ldx, int64_t heads, int64_t D,
                           const uint16_t *cos, const uint16_t *sin, uint16_t *out);

/* silu_mul.c: columns [i0, i1) of row t (out row stride I). */
void speculant_silu_mul_cols(const uint16_t *gate_up, int64_t t, int64_t ld, int64_t I, int64_t i0, int64_t i1,
                             const uint16_t *table, uint16_t *out);

/* linear_bf16.c: the 32 outputs of block pair `pair` for all T rows (see the file's header), on the
 * active path; speculant_linear_bf16_available(): 1 where that path is a SIMD one (not scalar). */
int speculant_linear_bf16_available(void);
void speculant_linear_bf16_pair(int64_t T, const uint16_t *x, int64_t ldx, const uint16_t *blocked, int64_t nblk,
                                int64_t k2, const float *bias, const uint16_t *res, int64_t ldr, int64_t N,
                                int64_t pair, uint16_t *y, int64_t ldy);
#define LINEAR_PAIR_ARGS                                                                                        \
    int64_t T, const uint16_t *x, int64_t ldx, const uint16_t *blocked, int64_t nblk, int64_t k2,               \
        const float *bias, const uint16_t *res, int64_t ldr, int64_t N, int64_t pair, uint16_t *y, int64_t ldy
SPECULANT_VARIANT void speculant_linear_bf16_pair_avx2(LINEAR_PAIR_ARGS);
SPECULANT_VARIANT void speculant_linear_bf16_pair_avx512(LINEAR_PAIR_ARGS);
SPECULANT_VARIANT void speculant_linear_bf16_pair_avx512_bf16(LINEAR_PAIR_ARGS);
SPECULANT_VARIANT void speculant_linear_bf16_pair_neon(LINEAR_PAIR_ARGS);

/* paged_attention.c: how many slices of query heads to cut each of `tasks` (span, K/V head) pairs
 * into (at most G, the group size) so that `threads` threads have about four tasks each. */
int speculant_attend_slices(int64_t tasks, int64_t G, int threads);

/* paged_attention.c: one task: a span, a K/V head and its group's query heads g0 .. g0 + gn - 1;
 * 0, or -1 when its scratch allocation failed. */
int speculant_attend_task(const void *q, const void *k_cache, const void *v_cache, void *out, int dtype,
                          int64_t row0, int64_t n_query, int64_t start, const int64_t *table, int64_t kv_head,
                          int64_t g0, int64_t gn, int64_t H, int64_t H_kv, int64_t D, int64_t block_size,
                          float scale, const uint8_t *mask);

/* span b's tree mask ([n_query, n_query] bytes, paged_attention.c), or NULL where it is causal */
static inline const uint8_t *speculant_span_mask(const int64_t *mask_offsets, const uint8_t *masks, int64_t b)
{
    return mask_offsets && mask_offsets[b] >= 0 ? masks + mask_offsets[b] : (const uint8_t *)0;
}

/* attention_avx512_bf16.c: the same task for bfloat16 on AVX512-BF16; -2 where it does not apply. */
SPECULANT_VARIANT int speculant_attend_task_bf16(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, uint16_t *out,
                               int64_t row0, int64_t n_query, int64_t start, const int64_t *table, int64_t kv_head,
                               int64_t g0, int64_t gn, int64_t H, int64_t H_kv, int64_t D, int64_t block_size,
                               float scale, const uint8_t *mask);
/* attention_neon.c: the same task for float32 and bfloat16 storage on NEON (any head size);
 * -2 for another dtype (the caller runs the portable task). */
SPECULANT_VARIANT int speculant_attend_task_neon(const void *q, const void *k_cache, const void *v_cache, void *out,
                                                 int dtype, int64_t row0, int64_t n_query, int64_t start,
                                                 const int64_t *table, int64_t kv_head, int64_t g0, int64_t gn,
                                                 int64_t H, int64_t H_kv, int64_t D, int64_t block_size, float scale);
#endif
