/* y[R, N] = x[R, K] @ W[N, K]^T + bias with W kept in a GGUF block format (quant.h).
 *
 * Activations are quantized per row to 8 bits per block (scale = max|x| / 127, codes
 * rounded half away from zero), once per call: blocks of 256 where every matrix of the
 * call is a K-quant (super-blocks of 256), else of 32. Each output element is then one
 * thread's walk over its weight row, tile by tile (decode the tile once, then
 * one dot product per activation row against the decoded tile), accumulating in
 * a fixed order that does not depend on R or on the other rows: a row's output
 * is the same bits whichever batch it comes in (speculative verify = decode).
 *
 * Paths: scalar (the reference, every format), AVX2 (16-bit pair products,
 * 32-bit ones where a code may exceed 127), AVX-512 VNNI (VPDPBUSD), and on aarch64
 * NEON (16-bit products) and NEON dotprod (SDOT): the NEON paths find the same integer
 * group sums and share the scalar path's float arithmetic, so they give its bits. The
 * path is the best one under the kernels' active path (quant_dispatch.c).
 */
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"
#include "quant.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_QUANT_X86 1
#else
#define HAVE_QUANT_X86 0
#endif

/* 1 where ggml type `type` has a kernel */
int speculant_qlinear_has_type(int type)
{
    return speculant_qformat(type) != 0;
}

static void dot_scalar(const qtile *t, const qact *a, float *acc)
{
    int32_t dots[QTILE / QGROUP];
    for (int g = 0; g < t->n / QGROUP; g++) {
        int32_t dot = 0;
        for (int i = g * QGROUP; i < (g + 1) * QGROUP; i++)
            dot += (int32_t)t->u[i] * a->q[i];
        dots[g] = dot;
    }
    speculant_qacc_dots(t, a, dots, acc);
}

#if HAVE_QUANT_X86
QUANT_AVX2_TARGET static void dot_avx2(const qtile *t, const qact *a, float *accv)
{
    __m256 acc = _mm256_loadu_ps(accv);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int c = 0; c < t->n; c += 32) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(t->u + c));
        __m256i x = _mm256_loadu_si256((const __m256i *)(a->q + c));
        float s0 = t->ws[c / 16] * a->d[c / 16], s1 = t->ws[c / 16 + 1] * a->d[c / 16 + 1];
        if (!t->wide) {  /* lanes 0-3: group c/16, lanes 4-7: the next one */
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones);
            __m256 sv = _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sv, acc);
        } else {        /* 255 * 127 * 2 overflows 16 bits: widen first */
            __m256i lo = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(u)),
                                           _mm256_cvtepi8_epi16(_mm256_castsi256_si128(x)));
            __m256i hi = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(u, 1)),
                                           _mm256_cvtepi8_epi16(_mm256_extracti128_si256(x, 1)));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_set1_ps(s0), acc);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_set1_ps(s1), acc);
        }
    }
    int g = 0, ng = t->n / QGROUP;
    for (; g + 8 <= ng; g += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(t->wb + g), _mm256_loadu_ps(a->s + g), acc);
    _mm256_storeu_ps(accv, acc);
    for (; g < ng; g++)
        accv[8] += t->wb[g] * a->s[g];
}

QUANT_VNNI_TARGET static void dot_vnni(const qtile *t, const qact *a, float *accv)
{
    __m512 acc = _mm512_loadu_ps(accv);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    int c = 0;
    for (; c < t->n; c += 64) {  /* lane i holds weights 4i .. 4i + 3: group c / 16 + i / 4 */
        __mmask64 m = t->n - c >= 64 ? ~(__mmask64)0 : (__mmask64)0xffffffffu;
        __mmask8 gm = t->n - c >= 64 ? 0xf : 0x3;
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_maskz_loadu_epi8(m, t->u + c),
                                        _mm512_maskz_loadu_epi8(m, a->q + c));
        __m128 s4 = _mm_mul_ps(_mm_maskz_loadu_ps(gm, t->ws + c / 16), _mm_maskz_loadu_ps(gm, a->d + c / 16));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(s4)), acc);
    }
    int ng = t->n / QGROUP;
    __mmask16 bm = ng >= 16 ? 0xffff : (__mmask16)((1u << ng) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(bm, t->wb), _mm512_maskz_loadu_ps(bm, a->s), acc);
    _mm512_storeu_ps(accv, acc);
}
#endif

/* Quantize block b0 / block of one row of x (dtype 0 float32, 1 bfloat16; blocks of `block` = 32,
 * or 256 for layers that are all K-quants): q[b0 .. b0 + block) codes, and per group of 16 d[] = the
 * block's scale, s[] = scale * the group's code sum, n[] = that sum as an integer. Blocks are
 * independent, so a row may be quantized by several threads, a block each, with the same bits. */
static void quantize_block(const void *x, int dtype, int64_t b0, int block, int8_t *q, float *d, float *s,
                           int16_t *n)
{
    float v[QTILE];
    float amax = 0.0f;
    for (int i = 0; i < block; i++) {
        v[i] = dtype ? widen(((const uint16_t *)x)[b0 + i]) : ((const float *)x)[b0 + i];
        float m = v[i] < 0 ? -v[i] : v[i];
        amax = m > amax ? m : amax;
    }
    float scale = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int g = 0; g < block / QGROUP; g++) {
        int32_t sum = 0;
        for (int i = g * QGROUP; i < (g + 1) * QGROUP; i++) {
            float r = v[i] * inv;
            int c = (int)(r + (r >= 0 ? 0.5f : -0.5f));
            c = c > 127 ? 127 : c < -127 ? -127 : c;
            q[b0 + i] = (int8_t)c;
            sum += c;
        }
        int64_t at = (b0 + g * QGROUP) / QGROUP;
        d[at] = scale;
        s[at] = scale * (float)sum;
        n[at] = (int16_t)sum;
    }
}

void speculant_q4k_order(const int8_t *xq, int64_t K, int8_t *out)
{
    static const int from[4] = {0, 64, 32, 96};
    for (int64_t k0 = 0; k0 < K; k0 += 128)
        for (int j = 0; j < 4; j++)
            memcpy(out + k0 + 32 * j, xq + k0 + from[j], 32);
}

static void dot_tile(int isa, const qtile *t, const qact *a, float *accv)
{
#if HAVE_QUANT_X86
    if (isa == QISA_AVX512_VNNI) { dot_vnni(t, a, accv); return; }
    if (isa == QISA_AVX2) { dot_avx2(t, a, accv); return; }
#endif
    if (isa == QISA_NEON_DOTPROD && speculant_qdot_neon_dotprod) { speculant_qdot_neon_dotprod(t, a, accv); return; }
    if (isa == QISA_NEON && speculant_qdot_neon) { speculant_qdot_neon(t, a, accv); return; }
    dot_scalar(t, a, accv);
}

#define ROW_CHUNK 64  /* activation rows per pass over the weights (64 rows of K = 8960: 560 KiB) */
#define ACC_LANES 17  /* 16 vector lanes + one scalar tail */

/* sums[r] = dot(weight row n of the matrix at w, activation row r) for r < R; acc: R * ACC_LANES floats
 * of scratch. A repacked matrix (group_rows > 1) is read one row at a time here, by the reference decoder. */
static void weight_row(int type, const qformat *f, int isa, const uint8_t *w, int64_t n, int64_t K, int64_t R,
                       const int8_t *xq, const int8_t *xq4, const float *xd, const float *xs, const int16_t *xn,
                       int block, float *acc, float *sums)
{
    const uint8_t *row = w + n * (K / f->block_elems * f->block_bytes);
#if HAVE_QUANT_X86
    if (isa == QISA_AVX512_VNNI && block == QTILE && (type == QT_Q4_K || type == QT_Q6_K) && speculant_qrow_k_vnni) {
        speculant_qrow_k_vnni(type, row, K, R, type == QT_Q4_K ? xq4 : xq, xd, xn, sums);
        return;
    }
#endif
    uint8_t u[QTILE] __attribute__((aligned(64)));
    float ws[QTILE / QGROUP], wb[QTILE / QGROUP];
    memset(acc, 0, sizeof(float) * (size_t)(R * ACC_LANES));
    for (int64_t k0 = 0; k0 < K; k0 += QTILE) {
        int cnt = K - k0 < QTILE ? (int)(K - k0) : QTILE;
        if (f->group_rows > 1)
            speculant_qdecode_x16(type, w, K, n, k0, cnt, u, ws, wb);
        else
            speculant_qdecode(type, row, k0, cnt, u, ws, wb, isa != QISA_SCALAR);
        qtile t = {u, ws, wb, cnt, f->max_code > 127};
        for (int64_t r = 0; r < R; r++) {
            qact a = {xq + r * K + k0, xd + (r * K + k0) / QGROUP, xs + (r * K + k0) / QGROUP,
                      xn + (r * K + k0) / QGROUP};
            dot_tile(isa, &t, &a, acc + r * ACC_LANES);
        }
    }
    for (int64_t r = 0; r < R; r++) {
        float sum = 0.0f;
        for (int l = 0; l < ACC_LANES; l++)
            sum += acc[r * ACC_LANES + l];
        sums[r] = sum;
    }
}

/* y[row, col] from a dot product: + bias, then float32, bfloat16, or bfloat16 added to res */
static inline void store_out(float sum, float bias, int dtype, const void *res, void *y, int64_t at)
{
    sum += bias;
    if (!dtype)
        ((float *)y)[at] = sum;
    else if (res)
        ((uint16_t *)y)[at] = round_bf16(widen(((const uint16_t *)res)[at]) + widen(round_bf16(sum)));
    else
        ((uint16_t *)y)[at] = round_bf16(sum);
}

typedef void (*group_kernel_fn)(int type, const uint8_t *group, int64_t K, int64_t R, const int8_t *xq,
                                const float *xd, const int16_t *xn, float *sums);

/* the kernel of XROWS weight rows at once for type `type` (a repacked layout) on the VNNI path, else NULL */
static group_kernel_fn group_kernel(int type, int vnni)
{
    if (!vnni || speculant_qformat(type)->group_rows == 1)
        return 0;
    return speculant_qis_b32(type - QT_X16) ? speculant_qgroup_x16_b32_vnni : speculant_qgroup_x16_vnni;
}

/* the work units of a matrix: its repacked groups where the group kernel runs, else its rows */
static int64_t units_of(int type, int64_t N, int vnni)
{
    return group_kernel(type, vnni) ? (N + XROWS - 1) / XROWS : N;
}

/* the block of activation codes for a call over `n_mats` matrices: 256 where every matrix is a
 * K-quant (super-blocks of 256), else 32; 0 for a type without a kernel or a K it cannot split */
int speculant_qlinear_block(int n_mats, const int *types, int64_t K)
{
    int block = QTILE;
    for (int m = 0; m < n_mats; m++) {
        const qformat *f = speculant_qformat(types[m]);
        if (!f || K <= 0 || K % f->block_elems || K % 32)
            return 0;
        block = f->block_elems == QTILE ? block : 32;
    }
    return block;
}

/* Bytes of scratch speculant_qlinear_team needs for R rows of K. */
int64_t speculant_qlinear_scratch_bytes(int64_t R, int64_t K)
{
    return 2 * R * K + R * (K / QGROUP) * (int64_t)(2 * sizeof(float) + sizeof(int16_t)) + 64;
}

/* Inside an OpenMP parallel region, called by every thread of the team (orphaned worksharing):
 * y[:, cols of matrix m] = x @ W_m^T + bias_m for the n_mats matrices of `p` (the layout of
 * speculant_qlinear_multi's arguments), x read with row stride ldx (dtype 0 float32, 1 bfloat16),
 * and for bfloat16 with `res` non-NULL y = res + that, rounded as torch's `res + y` rounds
 * (y first rounded to bfloat16). `block` from speculant_qlinear_block; `scratch` of
 * speculant_qlinear_scratch_bytes(R, K), shared by the team. */
void speculant_qlinear_team(int n_mats, const int *types, const uint8_t *const *ws, const int64_t *Ns,
                            const float *const *biases, int64_t K, int block, const void *x, int64_t R, int64_t ldx,
                            int dtype, const void *res, void *y, int64_t ldy, void *scratch)
{
    const int isa = speculant_qlinear_isa();
    const int vnni = HAVE_QUANT_X86 && isa == QISA_AVX512_VNNI;
    const int64_t ng = K / QGROUP;
    int64_t total = 0;
    for (int m = 0; m < n_mats; m++)
        total += units_of(types[m], Ns[m], vnni);
    float *xd = scratch, *xs = xd + R * ng;
    int16_t *xn = (int16_t *)(xs + R * ng);
    int8_t *xq = (int8_t *)(xn + R * ng), *xq4 = xq + R * K;  /* xq4: in Q4_K's order (VNNI rows) */
    const size_t esize = dtype ? 2 : 4;
    /* one block of one row per iteration: a decode's single row is shared by the team rather than
     * quantized by one thread while the others wait at the barrier */
    const int64_t nb = K / block;
#pragma omp for schedule(static)
    for (int64_t rb = 0; rb < R * nb; rb++) {
        const int64_t r = rb / nb, b0 = rb % nb * block;
        quantize_block((const char *)x + (size_t)(r * ldx) * esize, dtype, b0, block, xq + r * K, xd + r * ng,
                       xs + r * ng, xn + r * ng);
        if (block == QTILE)  /* a whole number of Q4_K's 128-code runs */
            speculant_q4k_order(xq + r * K + b0, QTILE, xq4 + r * K + b0);
    }
    float acc[ROW_CHUNK * ACC_LANES] __attribute__((aligned(64))), sums[ROW_CHUNK * XROWS];
    /* rows in chunks whose activations stay in L2 while every weight row passes over them */
    for (int64_t r0 = 0; r0 < R; r0 += ROW_CHUNK) {
        int64_t nr = R - r0 < ROW_CHUNK ? R - r0 : ROW_CHUNK;
#pragma omp for schedule(static)
        for (int64_t unit = 0; unit < total; unit++) {
            int m = 0;
            int64_t n = unit, col0 = 0;  /* col0: matrix m's first column of y */
            const qformat *f = speculant_qformat(types[0]);
            while (n >= units_of(types[m], Ns[m], vnni)) {
                n -= units_of(types[m], Ns[m], vnni);
                col0 += Ns[m++];
                f = speculant_qformat(types[m]);
            }
#if HAVE_QUANT_X86
            const group_kernel_fn group_rows = group_kernel(types[m], vnni);
            if (group_rows) {  /* XROWS weight rows at once */
                const uint8_t *group = ws[m] + n * (K / f->block_elems) * f->block_bytes * XROWS;
                group_rows(types[m], group, K, nr, xq + r0 * K, xd + r0 * ng, xn + r0 * ng, sums);
                for (int l = 0; l < XROWS && n * XROWS + l < Ns[m]; l++)
                    for (int64_t r = 0; r < nr; r++)
                        store_out(sums[r * XROWS + l], biases[m] ? biases[m][n * XROWS + l] : 0.0f, dtype, res, y,
                                  (r0 + r) * ldy + col0 + n * XROWS + l);
                continue;
            }
#endif
            weight_row(types[m], f, isa, ws[m], n, K, nr, xq + r0 * K, xq4 + r0 * K, xd + r0 * ng, xs + r0 * ng,
                       xn + r0 * ng, block, acc, sums);
            for (int64_t r = 0; r < nr; r++)
                store_out(sums[r], biases[m] ? biases[m][n] : 0.0f, dtype, res, y, (r0 + r) * ldy + col0 + n);
        }
    }
}

/* y[:, cols of matrix m] = x @ W_m^T + bias_m for n_mats matrices that read the same x (q/k/v, gate/up),
 * concatenated along y's columns: the activations are quantized once. 0; -1 for a type without a
 * kernel or a K it cannot split into blocks; -2 when memory runs out. */
int speculant_qlinear_multi(int n_mats, const int *types, const uint8_t *const *ws, const int64_t *Ns,
                            const float *const *biases, int64_t K, const void *x, int64_t R, int64_t ldx, int dtype,
                            void *y, int64_t ldy, int threads)
{
    int block = speculant_qlinear_block(n_mats, types, K);
    int64_t total = 0;
    for (int m = 0; m < n_mats; m++) {
        if (Ns[m] < 0)
            return -1;
        total += Ns[m];
    }
    if (!block || (dtype != 0 && dtype != 1))
        return -1;
    void *scratch = aligned_alloc(64, (size_t)(speculant_qlinear_scratch_bytes(R, K) + 63) / 64 * 64);
    if (!scratch)
        return -2;
#pragma omp parallel num_threads(threads) if (total > 1)
    speculant_qlinear_team(n_mats, types, ws, Ns, biases, K, block, x, R, ldx, dtype, NULL, y, ldy, scratch);
    free(scratch);
    return 0;
}

int speculant_qlinear(int type, const uint8_t *w, int64_t N, int64_t K, const void *x, int64_t R, int64_t ldx,
                      int dtype, const float *bias, void *y, int64_t ldy, int threads)
{
    return speculant_qlinear_multi(1, &type, &w, &N, &bias, K, x, R, ldx, dtype, y, ldy, threads);
}
