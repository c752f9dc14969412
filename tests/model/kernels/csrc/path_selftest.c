/* C-level self-test of the kernels' instruction paths against the scalar one, for a cross-built
 * library run under emulation (tests/model/kernels/test_aarch64_selftest.py: aarch64 under
 * qemu-user). Small shapes, correctness only: for every path this CPU runs, the bfloat16 linear
 * layer (with and without bias and residual), RMSNorm rows (every lane count), rotary and
 * silu * up must give the scalar path's bits, and paged attention must stay within a stated bound
 * of it. Prints one line per check; exits 1 at the first difference. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

int speculant_linear_bf16(const uint16_t *x, int64_t T, int64_t ldx, const uint16_t *blocked, int64_t N,
                          int64_t K, const float *bias, const uint16_t *residual, int64_t ldr, uint16_t *y,
                          int64_t ldy, int threads);
int speculant_rms_norm_bf16(const uint16_t *x, int64_t T, int64_t ldx, const uint16_t *weight, int64_t H, float eps,
                            int lanes, uint16_t *out, int64_t ldo, int threads);
void speculant_rotary_bf16(const uint16_t *x, int64_t T, int64_t ldx, int64_t heads, int64_t D,
                           const uint16_t *cos, const uint16_t *sin, uint16_t *out);
void speculant_silu_mul_bf16(const uint16_t *gate_up, int64_t T, int64_t ld, int64_t I, const uint16_t *table,
                             uint16_t *out);

static uint64_t state = 88172645463325252ull;

static float uniform(void) /* in [-1, 1) */
{
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return (float)((state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static uint16_t *random_bf16(int64_t n, float scale)
{
    uint16_t *v = malloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        v[i] = round_bf16(uniform() * scale);
    return v;
}

static int failures = 0;

static void compare(const char *what, int isa, const uint16_t *got, const uint16_t *want, int64_t n)
{
    const int same = memcmp(got, want, sizeof(uint16_t) * (size_t)n) == 0;
    printf("%s %s path %d\n", same ? "ok" : "DIFFERS", what, isa);
    failures += !same;
}

static void check_linear(int isa, int64_t N, int64_t K, int64_t T, int with_bias, int with_res)
{
    const int64_t nblk = (N + 15) / 16;
    uint16_t *blocked = calloc((size_t)(nblk * 16 * K), sizeof(uint16_t));
    for (int64_t n = 0; n < N; n++) /* blocked[b][k2][r][j] = W[16 b + r][2 k2 + j] */
        for (int64_t k = 0; k < K; k++)
            blocked[((n / 16) * (K / 2) + k / 2) * 32 + (n % 16) * 2 + k % 2] = round_bf16(uniform() * 0.1f);
    uint16_t *x = random_bf16(T * K, 1.0f), *res = random_bf16(T * N, 1.0f);
    float *bias = malloc(sizeof(float) * (size_t)N);
    for (int64_t n = 0; n < N; n++)
        bias[n] = uniform();
    uint16_t *want = calloc((size_t)(T * N), sizeof(uint16_t)), *got = calloc((size_t)(T * N), sizeof(uint16_t));
    speculant_isa_set(ISA_SCALAR);
    speculant_linear_bf16(x, T, K, blocked, N, K, with_bias ? bias : NULL, with_res ? res : NULL, N, want, N, 1);
    speculant_isa_set(isa);
    speculant_linear_bf16(x, T, K, blocked, N, K, with_bias ? bias : NULL, with_res ? res : NULL, N, got, N, 2);
    char what[96];
    snprintf(what, sizeof what, "linear N=%lld K=%lld T=%lld bias=%d residual=%d", (long long)N, (long long)K,
             (long long)T, with_bias, with_res);
    compare(what, isa, got, want, T * N);
    free(blocked), free(x), free(res), free(bias), free(want), free(got);
}

static void check_rows(int isa, int64_t T, int64_t H)
{
    uint16_t *x = random_bf16(T * H, 3.0f), *w = random_bf16(H, 1.0f), *c = random_bf16(T * H, 1.0f);
    uint16_t *s = random_bf16(T * H, 1.0f), *table = random_bf16(65536, 1.0f);
    uint16_t *want = malloc(sizeof(uint16_t) * (size_t)(T * H)), *got = malloc(sizeof(uint16_t) * (size_t)(T * H));
    for (int lanes = 4; lanes <= 16; lanes *= 2) {
        speculant_isa_set(ISA_SCALAR);
        speculant_rms_norm_bf16(x, T, H, w, H, 1e-5f, lanes, want, H, 1);
        speculant_isa_set(isa);
        speculant_rms_norm_bf16(x, T, H, w, H, 1e-5f, lanes, got, H, 1);
        char what[64];
        snprintf(what, sizeof what, "rms_norm H=%lld lanes=%d", (long long)H, lanes);
        compare(what, isa, got, want, T * H);
    }
    speculant_isa_set(ISA_SCALAR);
    speculant_rotary_bf16(x, T, H, 1, H, c, s, want);
    speculant_isa_set(isa);
    speculant_rotary_bf16(x, T, H, 1, H, c, s, got);
    compare("rotary", isa, got, want, T * H);
    speculant_isa_set(ISA_SCALAR);
    speculant_silu_mul_bf16(x, T, H, H / 2, table, want);
    speculant_isa_set(isa);
    speculant_silu_mul_bf16(x, T, H, H / 2, table, got);
    compare("silu_mul", isa, got, want, T * H / 2);
    free(x), free(w), free(c), free(s), free(table), free(want), free(got);
}

int speculant_paged_attention(int dtype, const void *q, const void *k_cache, const void *v_cache, void *out,
                              const int64_t *cu_query_lens, const int64_t *starts, const int64_t *block_tables,
                              int64_t n_seqs, int64_t max_blocks, const int64_t *span_ids, int64_t n_spans,
                              int64_t num_tokens, int64_t num_blocks, int64_t H, int64_t H_kv, int64_t D,
                              int64_t block_size, float scale, const int64_t *mask_offsets, const uint8_t *masks,
                              int threads, int64_t *bad);

static float as_float(const void *v, int dtype, int64_t i)
{
    return dtype ? widen(((const uint16_t *)v)[i]) : ((const float *)v)[i];
}

/* Paged attention (dtype 0 float32, 1 bfloat16) over a decode span and a verify span of 4 tokens,
 * grouped-query heads, blocks of 4 scattered in the pool. Not bit for bit (each path sums a score
 * in its own order): every output within the stated bound of the scalar path's, float32 1e-5
 * (inputs in [-1, 1], outputs convex combinations of values), bfloat16 two units in the last
 * place of the scalar result (2^-6 |want|) plus 1e-6 (the one rounding of float32 results that
 * differ by round-off can land either side of a rounding boundary). */
static void check_attention(int isa, int dtype, int64_t D)
{
    enum { H = 4, H_KV = 2, BS = 4, BLOCKS = 8, MAXB = 3, T = 5 };
    const int64_t cu[3] = {0, 1, 5}, starts[2] = {5, 3}, tables[2 * MAXB] = {5, 2, 0, 1, 7, 3}, spans[2] = {0, 1};
    const int64_t nq = T * H * D, nkv = BLOCKS * BS * H_KV * D, esize = dtype ? 2 : 4;
    void *q = malloc((size_t)(nq * esize)), *k = malloc((size_t)(nkv * esize)), *v = malloc((size_t)(nkv * esize));
    void *want = calloc((size_t)nq, (size_t)esize), *got = calloc((size_t)nq, (size_t)esize);
    void *bufs[3] = {q, k, v};
    const int64_t sizes[3] = {nq, nkv, nkv};
    for (int b = 0; b < 3; b++)
        for (int64_t i = 0; i < sizes[b]; i++) {
            if (dtype)
                ((uint16_t *)bufs[b])[i] = round_bf16(uniform());
            else
                ((float *)bufs[b])[i] = uniform();
        }
    int64_t bad[SPAN_BAD_FIELDS];
    const float scale = 1.0f / sqrtf((float)D);
    speculant_isa_set(ISA_SCALAR);
    int rc = speculant_paged_attention(dtype, q, k, v, want, cu, starts, tables, 2, MAXB, spans, 2, T, BLOCKS, H, H_KV,
                                       D, BS, scale, NULL, NULL, 1, bad);  /* no tree masks: causal spans */
    speculant_isa_set(isa);
    rc |= speculant_paged_attention(dtype, q, k, v, got, cu, starts, tables, 2, MAXB, spans, 2, T, BLOCKS, H, H_KV, D,
                                    BS, scale, NULL, NULL, 2, bad);
    double worst = 0.0;
    int within = rc == 0;
    for (int64_t i = 0; i < nq; i++) {
        const double a = as_float(got, dtype, i), b = as_float(want, dtype, i), diff = fabs(a - b);
        const double bound = dtype ? fabs(b) / 64.0 + 1e-6 : 1e-5;
        within &= diff <= bound;
        worst = diff > worst ? diff : worst;
    }
    printf("%s attention %s D=%lld path %d (largest difference %.3g)\n", within ? "ok" : "DIFFERS",
           dtype ? "bfloat16" : "float32", (long long)D, isa, worst);
    failures += !within;
    free(q), free(k), free(v), free(want), free(got);
}

int speculant_qlinear_multi(int n_mats, const int *types, const uint8_t *const *ws, const int64_t *Ns,
                            const float *const *biases, int64_t K, const void *x, int64_t R, int64_t ldx, int dtype,
                            void *y, int64_t ldy, int threads);
int speculant_qlinear_set_isa(int isa);

/* GGUF block formats (ggml type, block elements, block bytes, byte offsets of its float16 fields) */
static const struct { int type, elems, bytes, halves[2]; } QFORMATS[] = {
    {2, 32, 18, {0, -1}}, {3, 32, 20, {0, 2}}, {6, 32, 22, {0, -1}}, {8, 32, 34, {0, -1}},
    {12, 256, 144, {0, 2}}, {13, 256, 176, {0, 2}}, {14, 256, 210, {208, -1}}};

/* The quantized linear layer on quantized-kernel path `qisa` against its scalar path, bit for bit
 * (the NEON paths find the same integer group sums and share the scalar float arithmetic): each
 * format alone (K-quants then take activation blocks of 256), and a Q8_0 matrix beside each
 * K-quant (blocks of 32), R = 1, 3 and 5 activation rows, float32 and bfloat16 activations and outputs. */
static void check_quant(int qisa)
{
    const int64_t K = 512, N = 5;
    const size_t nf = sizeof QFORMATS / sizeof QFORMATS[0];
    uint8_t *w[sizeof QFORMATS / sizeof QFORMATS[0]];
    for (size_t f = 0; f < nf; f++) {
        const int64_t blocks = N * K / QFORMATS[f].elems;
        w[f] = malloc((size_t)(blocks * QFORMATS[f].bytes));
        for (int64_t i = 0; i < blocks * QFORMATS[f].bytes; i++)
            w[f][i] = (uint8_t)(uniform() * 128.0f + 128.0f);
        for (int64_t b = 0; b < blocks; b++) /* scales: positive float16 numbers near 1/100 */
            for (int h = 0; h < 2 && QFORMATS[f].halves[h] >= 0; h++) {
                uint8_t *at = w[f] + b * QFORMATS[f].bytes + QFORMATS[f].halves[h];
                const uint16_t half = (uint16_t)(0x2000 | ((uint16_t)(uniform() * 512.0f + 512.0f) & 0x3ff));
                at[0] = (uint8_t)(half & 0xff), at[1] = (uint8_t)(half >> 8);
            }
    }
    float *x = malloc(sizeof(float) * (size_t)(5 * K)), want[2 * 5 * 5], got[2 * 5 * 5];
    uint16_t *x16 = random_bf16(5 * K, 2.0f);
    for (int64_t i = 0; i < 5 * K; i++)
        x[i] = uniform() * 2.0f;
    const int64_t Ns[2] = {N, N};
    const float *const biases[2] = {NULL, NULL};
    for (size_t f = 0; f < nf; f++)
        for (int pair = 0; pair < 1 + (QFORMATS[f].elems == 256); pair++)
            for (int64_t R = 1; R <= 5; R += 2)
                for (int dtype = 0; dtype < 2; dtype++) {
                    const int types[2] = {QFORMATS[f].type, 8};
                    const uint8_t *const mats[2] = {w[f], w[3]};
                    const int n_mats = 1 + pair;
                    int rc = 0;
                    memset(want, 0, sizeof want), memset(got, 0, sizeof got);
                    speculant_qlinear_set_isa(0);
                    rc |= speculant_qlinear_multi(n_mats, types, mats, Ns, biases, K, dtype ? (void *)x16 : x, R, K,
                                                  dtype, want, n_mats * N, 1);
                    speculant_qlinear_set_isa(qisa);
                    rc |= speculant_qlinear_multi(n_mats, types, mats, Ns, biases, K, dtype ? (void *)x16 : x, R, K,
                                                  dtype, got, n_mats * N, 2);
                    speculant_qlinear_set_isa(-1);
                    const int same = rc == 0 && memcmp(want, got, (dtype ? 2 : 4) * (size_t)(R * n_mats * N)) == 0;
                    printf("%s quant type %d%s R=%lld %s quant path %d\n", same ? "ok" : "DIFFERS", QFORMATS[f].type,
                           pair ? " beside Q8_0" : "", (long long)R, dtype ? "bfloat16" : "float32", qisa);
                    failures += !same;
                }
    for (size_t f = 0; f < nf; f++)
        free(w[f]);
    free(x), free(x16);
}

int main(void)
{
    static const int64_t shapes[][3] = {{1, 2, 1}, {7, 62, 3}, {16, 64, 4}, {17, 258, 5}, {33, 96, 9}, {100, 130, 13}};
    int paths = 0;
    for (int isa = 1; isa < ISA_COUNT; isa++) {
        if (!speculant_isa_runs(isa))
            continue;
        paths++;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int variant = 0; variant < 3; variant++)
                check_linear(isa, shapes[i][0], shapes[i][1], shapes[i][2], variant > 0, variant > 1);
        check_rows(isa, 3, 64);
        check_rows(isa, 2, 200);
        check_rows(isa, 1, 4102); /* RMSNorm's cascade of levels (16 groups of 4 vectors and more) */
        if (isa == ISA_NEON || isa == ISA_NEON_DOTPROD) { /* quantized paths 3 and 4 (quant.h) */
            if (speculant_qlinear_set_isa(isa == ISA_NEON ? 3 : 4) < 0) {
                printf("MISSING quantized kernel path for path %d\n", isa);
                failures++;
            } else {
                check_quant(isa == ISA_NEON ? 3 : 4);
            }
        }
        for (int dtype = 0; dtype < 2; dtype++)
            for (int64_t D = 6; D <= 70; D += 32) /* 6, 38 (a tail of 2 past the vectors), 70 */
                check_attention(isa, dtype, D);
    }
    printf("%d vector path(s) checked, %d difference(s)\n", paths, failures);
    return failures || !paths ? 1 : 0;
}
