/* The llama family's decoder layers for bfloat16 on the CPU, all of them in one
 * call and one OpenMP parallel region.
 *
 * Why: at decode and verify sizes a layer is ten small operators, and called
 * one by one from Python each costs a ctypes call, a tensor allocation and an
 * OpenMP fork and join, about as much as its arithmetic. Here the team is
 * started once per forward and the operators are separated by its barriers.
 *
 * Per layer, exactly the fast decoder's per-operator sequence (decoder.py),
 * each step the same row-level code as its own kernel (kernels.h), so the bits
 * are the same:
 *
 *   normed  = rms_norm(hidden, in_norm)                 rms_norm.c
 *   qkv     = normed W_qkv^T (+ b)                      linear_bf16.c
 *   qk      = rotary(qkv[:, :(H_q + H_kv) D])           rotary.c
 *   cache[slot_mapping[t]] = k_t, v_t                   kv_write.c (memcpy)
 *   attn    = paged attention over the spans            paged_attention.c
 *   hidden += attn W_o^T (+ b)                          linear_bf16.c, fused add
 *   normed  = rms_norm(hidden, post_norm)
 *   gate_up = normed W_gu^T (+ b)
 *   act     = silu(gate) * up                           silu_mul.c
 *   hidden += act W_down^T (+ b)
 *
 * A projection whose field *_Q is non-zero is kept in GGUF blocks (model.quantization = "gguf"):
 * that field is the address of an int64 descriptor [n_mats, block, then per matrix type,
 * blocks, N, float32 bias or 0] (q/k/v and gate/up may be several matrices of different
 * types, their outputs concatenated), computed by quant_linear.c's team function as the
 * per-operator QuantLinear computes it (the residual add rounded as torch's `res + y`).
 *
 * Layouts: hidden [T, H] contiguous, updated in place; cos, sin [T, D]; the
 * metadata as for speculant_paged_attention (span_ids: the spans, all of the batch's; tree masks
 * through mask_offsets and masks, NULL for none); the
 * per-layer pointers `layers` [L, LAYER_FIELDS] (int64 addresses, in the order
 * of enum field); scratch of speculant_decoder_scratch_elems() bfloat16.
 * Returns 0; -1 when an attention scratch allocation failed (hidden is then
 * garbage); -3 when a slot lies outside the cache (nothing written); -6 when a
 * span would read outside the pool or the batch (nothing read or written; `bad`
 * describes it, as speculant_check_spans says); -4 where
 * this CPU has no AVX512-BF16; -5 for a lane count the norm does not follow; -2 when the
 * quantized projections' scratch cannot be allocated.
 */
#include <stdint.h>
#include <string.h>

#include <stdlib.h>

#include "kernels.h"
#include "quant.h"

enum field {
    IN_NORM, POST_NORM, QKV_W, QKV_B, O_W, O_B, GU_W, GU_B, DOWN_W, DOWN_B, K_CACHE, V_CACHE,
    QKV_Q, O_Q, GU_Q, DOWN_Q, LAYER_FIELDS
};

enum { DT_BF16 = 1 };

int speculant_decoder_layer_fields(void)
{
    return LAYER_FIELDS;
}

/* bfloat16 elements of scratch a forward of T tokens needs. */
int64_t speculant_decoder_scratch_elems(int64_t T, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t I)
{
    int64_t qkv = (Hq + 2 * Hkv) * D;
    return T * (H + qkv + (Hq + Hkv) * D + Hq * D + 2 * I + I);
}

#define PTR(type, l, f) ((type)(intptr_t)layers[(l) * LAYER_FIELDS + (f)])

#define QMATS 3  /* most matrices in one quantized projection (q, k, v) */

/* y [T, N] (+)= x [T, K] W^T (+ b), shared among the team (inside the parallel region): over
 * bfloat16 block pairs, or with `q` non-NULL over GGUF blocks (its descriptor, see above; qscratch
 * for T rows of K); every row stride is the row's width. */
static void linear(int64_t T, const uint16_t *x, const uint16_t *blocked, const float *bias, int64_t N, int64_t K,
                   const uint16_t *res, uint16_t *y, const int64_t *q, void *qscratch)
{
    if (q) {
        int types[QMATS];
        const uint8_t *ws[QMATS];
        int64_t Ns[QMATS];
        const float *biases[QMATS];
        for (int64_t m = 0; m < q[0]; m++) {
            types[m] = (int)q[2 + 4 * m];
            ws[m] = (const uint8_t *)(intptr_t)q[3 + 4 * m];
            Ns[m] = q[4 + 4 * m];
            biases[m] = (const float *)(intptr_t)q[5 + 4 * m];
        }
        speculant_qlinear_team((int)q[0], types, ws, Ns, biases, K, (int)q[1], x, T, K, 1, res, y, N, qscratch);
        return;
    }
    const int64_t nblk = (N + 15) / 16, pairs = (nblk + 1) / 2;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < pairs; p++)
        speculant_linear_bf16_pair(T, x, K, blocked, nblk, K / 2, bias, res, N, N, p, y, N);
}

int speculant_decoder_bf16(const int64_t *layers, int64_t L, uint16_t *hidden, int64_t T, int64_t H, int64_t Hq,
                           int64_t Hkv, int64_t D, int64_t I, float eps, int lanes, const uint16_t *cos,
                           const uint16_t *sin, const int64_t *slot_mapping, int64_t num_slots,
                           const int64_t *cu_query_lens, const int64_t *starts, const int64_t *block_tables,
                           int64_t n_seqs, int64_t max_blocks, const int64_t *span_ids, int64_t n_spans,
                           int64_t block_size, float scale, const int64_t *mask_offsets, const uint8_t *masks,
                           const uint16_t *silu_table, uint16_t *scratch, int threads, int64_t *bad)
{
    if (!speculant_linear_bf16_available())
        return -4;
    if (lanes != 4 && lanes != 8 && lanes != 16)
        return -5;
    for (int64_t t = 0; t < T; t++)
        if (slot_mapping[t] < 0 || slot_mapping[t] >= num_slots)
            return -3;
    if (speculant_check_spans(cu_query_lens, starts, block_tables, n_seqs, max_blocks, span_ids, n_spans, T,
                              num_slots / block_size, block_size, bad) != 0)
        return -6;
    const int64_t qkv_n = (Hq + 2 * Hkv) * D, qk_heads = Hq + Hkv, kv_row = Hkv * D, G = Hq / Hkv;
    const int64_t slices = speculant_attend_slices(n_spans * Hkv, G, threads), per = (G + slices - 1) / slices;
    const int64_t tasks = n_spans * Hkv * slices;
    uint16_t *normed = scratch;                     /* [T, H] */
    uint16_t *qkv = normed + T * H;                 /* [T, qkv_n] */
    uint16_t *qk = qkv + T * qkv_n;                 /* [T, qk_heads, D] rotated */
    uint16_t *attn = qk + T * qk_heads * D;         /* [T, Hq, D] */
    uint16_t *gate_up = attn + T * Hq * D;          /* [T, 2 I] */
    uint16_t *act = gate_up + T * 2 * I;            /* [T, I] */
    const int64_t chunk = 64, chunks = (I + chunk - 1) / chunk;
    int status = 0;
    void *qscratch = NULL;  /* the quantized projections' activation codes, for T rows of the widest K */
    for (int64_t l = 0; l < L && !qscratch; l++)
        if (PTR(const int64_t *, l, QKV_Q) || PTR(const int64_t *, l, O_Q) || PTR(const int64_t *, l, GU_Q)
            || PTR(const int64_t *, l, DOWN_Q)) {
            int64_t k = H > I ? H : I;
            k = k > Hq * D ? k : Hq * D;
            qscratch = aligned_alloc(64, (size_t)(speculant_qlinear_scratch_bytes(T, k) + 63) / 64 * 64);
            if (!qscratch)
                return -2;
        }
#pragma omp parallel num_threads(threads)
    for (int64_t l = 0; l < L; l++) {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++)
            speculant_rms_norm_rows(hidden, t, t + 1, H, PTR(const uint16_t *, l, IN_NORM), H, eps, lanes, normed, H);
        linear(T, normed, PTR(const uint16_t *, l, QKV_W), PTR(const float *, l, QKV_B), qkv_n, H, NULL, qkv,
               PTR(const int64_t *, l, QKV_Q), qscratch);
        uint16_t *k_cache = PTR(uint16_t *, l, K_CACHE), *v_cache = PTR(uint16_t *, l, V_CACHE);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++)
            speculant_rotary_rows(qkv, t, t + 1, qkv_n, qk_heads, D, cos, sin, qk);
        /* in token order on one thread, as kv_write.c: where spans share a slot the last write stays */
#pragma omp single
        for (int64_t t = 0; t < T; t++) {
            memcpy(k_cache + slot_mapping[t] * kv_row, qk + (t * qk_heads + Hq) * D, sizeof(uint16_t) * kv_row);
            memcpy(v_cache + slot_mapping[t] * kv_row, qkv + t * qkv_n + qk_heads * D, sizeof(uint16_t) * kv_row);
        }
        /* the query rows are those of `qk` ([T, qk_heads, D]): attention reads them with the
         * row stride of a [T, Hq, D] array, so they are first packed into `attn`'s layout */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++)
            memcpy(attn + t * Hq * D, qk + t * qk_heads * D, sizeof(uint16_t) * Hq * D);
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t b = span_ids[task / (Hkv * slices)], row0 = cu_query_lens[b], g0 = task % slices * per;
            /* in place: each task reads its own query rows before it writes them, and no other
             * task touches them (rows of span b, its query heads of K/V head task / slices % Hkv) */
            if (g0 < G && speculant_attend_task(attn, k_cache, v_cache, attn, DT_BF16, row0,
                                                cu_query_lens[b + 1] - row0, starts[b],
                                                block_tables + b * max_blocks, task / slices % Hkv, g0,
                                                G - g0 < per ? G - g0 : per, Hq, Hkv, D, block_size, scale,
                                                speculant_span_mask(mask_offsets, masks, b)) != 0) {
#pragma omp atomic write
                status = -1;
            }
        }
        linear(T, attn, PTR(const uint16_t *, l, O_W), PTR(const float *, l, O_B), H, Hq * D, hidden,
               hidden, PTR(const int64_t *, l, O_Q), qscratch);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++)
            speculant_rms_norm_rows(hidden, t, t + 1, H, PTR(const uint16_t *, l, POST_NORM), H, eps, lanes, normed,
                                    H);
        linear(T, normed, PTR(const uint16_t *, l, GU_W), PTR(const float *, l, GU_B), 2 * I, H, NULL, gate_up,
               PTR(const int64_t *, l, GU_Q), qscratch);
#pragma omp for schedule(static) collapse(2)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < chunks; c++)
                speculant_silu_mul_cols(gate_up, t, 2 * I, I, c * chunk, c + 1 < chunks ? (c + 1) * chunk : I,
                                        silu_table, act);
        linear(T, act, PTR(const uint16_t *, l, DOWN_W), PTR(const float *, l, DOWN_B), H, I, hidden, hidden,
               PTR(const int64_t *, l, DOWN_Q), qscratch);
    }
    free(qscratch);
    return status;
}
