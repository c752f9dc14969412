/* RMSNorm of bfloat16 rows, CPU, bit for bit what torch computes for
 *
 *     weight * F.rms_norm(x, eps)      (x, weight bfloat16)
 *
 * i.e. per row: v = mean(float(x)^2); r = 1 / sqrt(v + eps); y = round(float(x) * r)
 * to bfloat16; out = round(float(weight) * float(y)) to bfloat16 (all float32, round
 * to nearest even). One call replaces torch's eight operators per norm, whose fixed
 * costs dominate at decode sizes.
 *
 * The only step whose result depends on an order is the float32 sum of squares.
 * This follows ATen's vectorised inner sum (ReduceOps SumKernel: vectors of `lanes`
 * floats, four interleaved vector accumulators with its cascade of levels, the
 * leftover vectors into the first, the four merged in order, then the scalar tail
 * and the lanes added one by one). `lanes` is the vector width torch's sum follows
 * for the row width (8 on the torch 2.13 CPU build here, AVX-512 host included); the
 * caller finds it by comparing speculant_sum_squares_bf16 with torch's own float32
 * sums, then probes the output, and uses torch where neither holds. Squares of
 * bfloat16 numbers are exact in float32, so a fused multiply-add cannot change them.
 *
 * Layouts: x [T, H] with row stride ldx; weight [H]; out [T, H] with row stride
 * ldo (may be x); `threads` is the OpenMP team size for long inputs. Returns 0, or -1
 * for a lane count this code does not follow.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

#define MAX_LANES 16
#define ILP 4
#define LEVELS 4


static inline __attribute__((always_inline)) int ceil_log2(int64_t n)
{
    int r = 0;
    while (((int64_t)1 << r) < n)
        r++;
    return r;
}

/* acc[k][l] += square of element (vector `v`, lane l) of row x, k = 0..ILP-1 for vectors v = ILP*i + k */
static inline __attribute__((always_inline)) void add_squares(float acc[ILP][MAX_LANES], const uint16_t *x, int64_t vec, int lanes)
{
    for (int k = 0; k < ILP; k++)
        for (int l = 0; l < lanes; l++) {
            float e = widen(x[(vec + k) * lanes + l]);
            acc[k][l] += e * e;
        }
}

/* ATen's float32 sum of squares of one row, in its order (see the header). */
static inline __attribute__((always_inline)) float sum_squares(const uint16_t *x, int64_t H, int lanes)
{
    int64_t nvec = H / lanes, rows = nvec / ILP;
    float acc[LEVELS][ILP][MAX_LANES];
    memset(acc, 0, sizeof acc);
    int power = ceil_log2(rows) / LEVELS;
    if (power < 4)
        power = 4;
    int64_t step = (int64_t)1 << power, mask = step - 1;
    int64_t i = 0;
    while (i + step <= rows) {
        for (int64_t j = 0; j < step; j++, i++)
            add_squares(acc[0], x, i * ILP, lanes);
        for (int j = 1; j < LEVELS; j++) {
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < lanes; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (mask << (j * power))) != 0)
                break;
        }
    }
    for (; i < rows; i++)
        add_squares(acc[0], x, i * ILP, lanes);
    for (int j = 1; j < LEVELS; j++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < lanes; l++)
                acc[0][k][l] += acc[j][k][l];
    float *part = acc[0][0];
    for (int64_t v = rows * ILP; v < nvec; v++) /* vectors left over after the groups of ILP */
        for (int l = 0; l < lanes; l++) {
            float e = widen(x[v * lanes + l]);
            part[l] += e * e;
        }
    for (int k = 1; k < ILP; k++)
        for (int l = 0; l < lanes; l++)
            part[l] += acc[0][k][l];
    float total = 0.0f;
    for (int64_t e = nvec * lanes; e < H; e++) { /* scalar tail first, then the lanes in order */
        float v = widen(x[e]);
        total += v * v;
    }
    for (int l = 0; l < lanes; l++)
        total += part[l];
    return total;
}

/* The float32 sums of squares of T rows in the order above (sums [T]): what the caller
 * compares with torch's own to find the lane count torch follows. */
int speculant_sum_squares_bf16(const uint16_t *x, int64_t T, int64_t ldx, int64_t H, int lanes, float *sums)
{
    if (lanes != 4 && lanes != 8 && lanes != 16)
        return -1;
    for (int64_t t = 0; t < T; t++)
        sums[t] = sum_squares(x + t * ldx, H, lanes);
    return 0;
}

static inline __attribute__((always_inline)) void rows_body(const uint16_t *x, int64_t t0, int64_t t1, int64_t ldx, const uint16_t *weight,
                             int64_t H, float eps, int lanes, uint16_t *out, int64_t ldo)
{
    for (int64_t t = t0; t < t1; t++) {
        const uint16_t *row = x + t * ldx;
        float mean = sum_squares(row, H, lanes) / (float)H;
        float r = 1.0f / sqrtf(mean + eps);
        uint16_t *o = out + t * ldo;
        for (int64_t h = 0; h < H; h++) {
            uint16_t y = round_bf16(widen(row[h]) * r);
            o[h] = round_bf16(widen(weight[h]) * widen(y));
        }
    }
}

#define ROWS_ARGS \
    (const uint16_t *x, int64_t t0, int64_t t1, int64_t ldx, const uint16_t *weight, int64_t H, float eps, int lanes, \
        uint16_t *out, int64_t ldo)
#define ROWS_CALL (x, t0, t1, ldx, weight, H, eps, lanes, out, ldo)
/* scalar, AVX2 and AVX-512 clones of the same C (kernels.h): the same bits on every path */
SPECULANT_CLONED(speculant_rms_norm_rows, rows_body, ROWS_ARGS, ROWS_CALL)

int speculant_rms_norm_bf16(const uint16_t *x, int64_t T, int64_t ldx, const uint16_t *weight, int64_t H, float eps,
                            int lanes, uint16_t *out, int64_t ldo, int threads)
{
    if (lanes != 4 && lanes != 8 && lanes != 16)
        return -1;
#pragma omp parallel for schedule(static) num_threads(threads) if (T >= 64)
    for (int64_t t = 0; t < T; t++)
        speculant_rms_norm_rows(x, t, t + 1, ldx, weight, H, eps, lanes, out, ldo);
    return 0;
}
