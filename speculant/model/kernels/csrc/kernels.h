/* Row-level pieces of the C kernels, shared with the fused decoder layers
 * (decoder_bf16.c), which runs them inside one OpenMP parallel region. Each
 * computes exactly what its kernel's public entry point computes for the
 * same rows, so the fused forward and the per-operator one give the same bits.
 */
#ifndef SPECULANT_KERNELS_H
#define SPECULANT_KERNELS_H
#include <stdint.h>

/* cpu_features.c: the features the AVX-512 bfloat16 paths need, as bits of speculant_cpu_features()
 * (the order of cpu_kernel_build.CPU_FEATURE_NAMES) */
enum { CPU_AVX512F = 0, CPU_AVX512BW = 1, CPU_AVX512DQ = 2, CPU_AVX512VL = 3, CPU_AVX512BF16 = 4 };
#define CPU_BF16_PATHS 0x1f
int speculant_cpu_features(void);
/* 1 where every feature of CPU_BF16_PATHS is present */
int speculant_cpu_has_bf16_paths(void);

/* The AVX-512 bfloat16 paths' target attribute: every feature their intrinsics use */
#define BF16_PATH_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

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

/* rotary.c: tokens [t0, t1) of the rotation (out [T, heads, D] contiguous). */
void speculant_rotary_rows(const uint16_t *x, int64_t t0, int64_t t1, int64_t ldx, int64_t heads, int64_t D,
                           const uint16_t *cos, const uint16_t *sin, uint16_t *out);

/* silu_mul.c: columns [i0, i1) of row t (out row stride I). */
void speculant_silu_mul_cols(const uint16_t *gate_up, int64_t t, int64_t ld, int64_t I, int64_t i0, int64_t i1,
                             const uint16_t *table, uint16_t *out);

/* linear_bf16.c: the 32 outputs of block pair `pair` for all T rows (see the file's header);
 * only on CPUs where speculant_linear_bf16_available() says so. */
int speculant_linear_bf16_available(void);
void speculant_linear_bf16_pair(int64_t T, const uint16_t *x, int64_t ldx, const uint16_t *blocked, int64_t nblk,
                                int64_t k2, const float *bias, const uint16_t *res, int64_t ldr, int64_t N,
                                int64_t pair, uint16_t *y, int64_t ldy);

/* paged_attention.c: how many slices of query heads to cut each of `tasks` (span, K/V head) pairs
 * into (at most G, the group size) so that `threads` threads have about four tasks each. */
int speculant_attend_slices(int64_t tasks, int64_t G, int threads);

/* paged_attention.c: one task: a span, a K/V head and its group's query heads g0 .. g0 + gn - 1;
 * 0, or -1 when its scratch allocation failed. */
int speculant_attend_task(const void *q, const void *k_cache, const void *v_cache, void *out, int dtype,
                          int64_t row0, int64_t n_query, int64_t start, const int64_t *table, int64_t kv_head,
                          int64_t g0, int64_t gn, int64_t H, int64_t H_kv, int64_t D, int64_t block_size,
                          float scale);

/* attention_bf16.c: the same task for bfloat16 on AVX512-BF16; -2 where it does not apply. */
int speculant_attend_task_bf16(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, uint16_t *out,
                               int64_t row0, int64_t n_query, int64_t start, const int64_t *table, int64_t kv_head,
                               int64_t g0, int64_t gn, int64_t H, int64_t H_kv, int64_t D, int64_t block_size,
                               float scale);
#endif
