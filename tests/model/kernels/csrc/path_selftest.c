/* C-level self-test of the kernels' instruction paths against the scalar one, for a cross-built
 * library run under emulation (tests/model/kernels/test_aarch64_selftest.py: aarch64 under
 * qemu-user). Small shapes, correctness only: for every path this CPU runs, the bfloat16 linear
 * layer (with and without bias and residual), RMSNorm rows, rotary and silu * up must give the
 * scalar path's bits. Prints one line per check; exits 1 at the first difference. */
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
    speculant_isa_set(ISA_SCALAR);
    speculant_rms_norm_bf16(x, T, H, w, H, 1e-5f, 8, want, H, 1);
    speculant_isa_set(isa);
    speculant_rms_norm_bf16(x, T, H, w, H, 1e-5f, 8, got, H, 1);
    compare("rms_norm", isa, got, want, T * H);
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
    }
    printf("%d vector path(s) checked, %d difference(s)\n", paths, failures);
    return failures || !paths ? 1 : 0;
}
