/* GGUF block formats kept quantized (quant_decode.c, quant_linear.c).
 *
 * Every format is decoded, a tile of up to 256 weights at a time, into one
 * common shape: unsigned 8-bit codes u[i] plus, per group of 16 weights, a
 * float scale ws[g] and a float offset wb[g], so that weight i = ws[g] * u[i] +
 * wb[g] (g = i / 16). Q4_K: ws = d * sc, wb = -dmin * m. Q6_K: u = the 6-bit
 * code, ws = d * sc, wb = -32 * d * sc. Q8_0: u = q + 128, wb = -128 * d.
 * The dot product of a weight row with an activation row quantized to 8 bits
 * per block of 32 or 256 (scale dx, codes xq, and per group the sum of its codes) is
 * then sum_g ws[g] * dx * <u, xq>_g + wb[g] * dx * sum_g(xq): integer dot
 * products of 16 codes and one float multiply per group, the same for every
 * format and every instruction path.
 */
#ifndef SPECULANT_QUANT_H
#define SPECULANT_QUANT_H
#include <stdint.h>

/* ggml type ids (the GGUF file's tensor types) */
enum { QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q5_0 = 6, QT_Q8_0 = 8, QT_Q4_K = 12, QT_Q5_K = 13, QT_Q6_K = 14 };
/* formats repacked at load into groups of 16 weight rows (quant_repack.c: Q4_K, Q6_K; quant_repack_b32.c:
 * the blocks of 32): our own type ids */
enum { QT_X16 = 64, QT_Q4_K_X16 = QT_X16 + QT_Q4_K, QT_Q6_K_X16 = QT_X16 + QT_Q6_K, QT_MAX = QT_Q6_K_X16 };
enum { QT_Q4_0_X16 = QT_X16 + QT_Q4_0, QT_Q4_1_X16 = QT_X16 + QT_Q4_1, QT_Q5_0_X16 = QT_X16 + QT_Q5_0,
       QT_Q8_0_X16 = QT_X16 + QT_Q8_0 };
#define XROWS 16 /* weight rows per repacked group */
/* byte offsets inside a repacked group tile (the layouts are described in quant_repack.c); tiles and
 * the code vectors inside them start on 64-byte lines (a load that crosses one costs two), and the
 * kernels read a tile front to back */
enum { K4_D = 0, K4_DMIN = 32, K4_SC = 64, K4_M = 192, K4_QS = 320, K4_TILE = 2368 };
enum { K6_SC = 0, K6_D = 256, K6_G = 320, K6_TILE = 3392 };  /* K6_G: group g's codes at K6_G + 192 g */
/* instruction paths of the dot products */
enum { QISA_SCALAR = 0, QISA_AVX2 = 1, QISA_AVX512_VNNI = 2, QISA_NEON = 3, QISA_NEON_DOTPROD = 4, QISA_COUNT = 5 };
#define QTILE 256
#define QGROUP 16

#define QUANT_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define QUANT_VNNI_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

typedef struct {
    int block_elems;  /* weights per block: 32 or 256 */
    int block_bytes;  /* bytes per block in the file */
    int max_code;     /* largest u: 255 needs 32-bit products (no 16-bit pair sums) */
    int group_rows;   /* 1: rows one after another (the file's layout); XROWS: repacked groups, where
                       * block_bytes is a group tile's bytes / XROWS and a group holds K / 256 tiles */
} qformat;

/* quant_dispatch.c: the path the dot products take now (a QISA_* value) */
int speculant_qlinear_isa(void);

/* the format of ggml type `type`, or NULL where there is no kernel for it */
const qformat *speculant_qformat(int type);

/* Decode weights [k0, k0 + n) of one row (n a multiple of the block size, at most QTILE,
 * k0 a multiple of it) into u[n], ws[n / 16], wb[n / 16]; `simd` picks the AVX2 decoder
 * where one exists (the result is the same bits either way). */
void speculant_qdecode(int type, const uint8_t *row, int64_t k0, int n, uint8_t *u, float *ws, float *wb,
                       int simd);

float speculant_half_to_float(uint16_t h);

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (of 8) packed in 12 bytes */
static inline void speculant_scale_min_k4(int j, const uint8_t *s, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* quant_repack.c: weight row `n` of a repacked matrix (groups of XROWS rows at `w`, K wide), weights
 * [k0, k0 + n) decoded like speculant_qdecode (the same bytes and floats as the file's row) */
void speculant_qdecode_x16(int type, const uint8_t *w, int64_t K, int64_t row, int64_t k0, int n, uint8_t *u,
                           float *ws, float *wb);

/* quant_repack_b32.c: whether file type `type` is one of the blocks of 32 it repacks (Q4_0, Q4_1, Q5_0,
 * Q8_0); the repack (dst zeroed) and the reference decoder of those layouts */
int speculant_qis_b32(int type);
void speculant_qrepack_x16_b32(int type, const uint8_t *src, int64_t N, int64_t K, uint8_t *dst);
void speculant_qdecode_x16_b32(int type, const uint8_t *w, int64_t K, int64_t row, int64_t k0, int n, uint8_t *u,
                               float *ws, float *wb);
/* quant_x16_b32_avx512_vnni.c (a path file; NULL where not built): speculant_qgroup_x16_vnni's contract for
 * the repacked blocks of 32, K a multiple of 32, activations in blocks of 32 */
__attribute__((weak)) void speculant_qgroup_x16_b32_vnni(int type, const uint8_t *group, int64_t K, int64_t R,
                                                        const int8_t *xq, const float *xd, const int16_t *xn,
                                                        float *sums);

/* Activation rows in passes whose row count the compiler knows (accumulators in registers, not memory):
 * BODY(NR) runs rows [r0, r0 + NR) for r0 = 0, 4, 8, ... while 4 are left, then once for the 1-3 left. */
#define QUANT_ROWS_IN_FOURS(R, r0, BODY)                                                                  \
    for (r0 = 0; (R) - r0 >= 4; r0 += 4)                                                                  \
        BODY(4)                                                                                           \
    switch ((R) - r0) {                                                                                   \
    case 3: BODY(3) break;                                                                                \
    case 2: BODY(2) break;                                                                                \
    case 1: BODY(1) break;                                                                                \
    default: break;                                                                                       \
    }

/* quant_x16_avx512_vnni.c (a path file; NULL where not built): one repacked group of XROWS weight rows
 * (K a multiple of 256) against R activation rows in natural order: sums[r * XROWS + l] = the dot
 * product of weight row l with activation row r */
__attribute__((weak)) void speculant_qgroup_x16_vnni(int type, const uint8_t *group, int64_t K, int64_t R,
                                                    const int8_t *xq, const float *xd, const int16_t *xn,
                                                    float *sums);

/* One decoded tile of a weight row, and the activation codes it meets (quant_linear.c). */
typedef struct {
    const uint8_t *u;   /* [n] decoded codes */
    const float *ws;    /* [n / 16] */
    const float *wb;    /* [n / 16] */
    int n;              /* weights in the tile, a multiple of 32 */
    int wide;           /* codes may exceed 127 */
} qtile;

typedef struct {
    const int8_t *q;    /* [n] activation codes */
    const float *d;     /* [n / 16] the block scale of each group */
    const float *s;     /* [n / 16] scale * sum of the group's codes */
    const int16_t *sum; /* [n / 16] the sum of the group's codes */
} qact;

/* acc[0] += the tile's contribution from its groups' integer dot products dots[g] = <u, q>_g, in
 * group order: the scalar path's float arithmetic, shared by every path that keeps its bits (the
 * NEON ones: only how the integer dots are found differs, and integer sums are exact). */
static inline void speculant_qacc_dots(const qtile *t, const qact *a, const int32_t *dots, float *acc)
{
    for (int g = 0; g < t->n / QGROUP; g++)
        acc[0] += t->ws[g] * a->d[g] * (float)dots[g] + t->wb[g] * a->s[g];
}

/* quant_neon.c, quant_neon_dotprod.c (aarch64 path files; NULL where not built): the tile's dot
 * products into acc[0], the same bits as the scalar path's */
__attribute__((weak)) void speculant_qdot_neon(const qtile *t, const qact *a, float *acc);
__attribute__((weak)) void speculant_qdot_neon_dotprod(const qtile *t, const qact *a, float *acc);

/* Q4_K's nibble order of 256 activation codes, per 128: [0, 32), [64, 96), [32, 64), [96, 128)
 * (low nibbles of 64 bytes, then high ones); out[K] from xq[K], K a multiple of 256 */
void speculant_q4k_order(const int8_t *xq, int64_t K, int8_t *out);

/* quant_avx512_vnni.c (a path file, compiled on its own: NULL where the compiler could not build it):
 * one Q4_K or Q6_K weight row (K a multiple of 256) against R activation rows, sums[r] = its dot
 * product with row r (AVX-512 VNNI CPUs only); Q4_K reads xq in speculant_q4k_order */
__attribute__((weak)) void speculant_qrow_k_vnni(int type, const uint8_t *row, int64_t K, int64_t R, const int8_t *xq, const float *xd,
                           const int16_t *xn, float *sums);
/* quant_linear.c: the activation block of a call (0: a type or K without a kernel), the team's
 * scratch bytes for R rows of K, and y (+)= x W^T (+ b) run by every thread of an OpenMP team */
int speculant_qlinear_block(int n_mats, const int *types, int64_t K);
int64_t speculant_qlinear_scratch_bytes(int64_t R, int64_t K);
void speculant_qlinear_team(int n_mats, const int *types, const uint8_t *const *ws, const int64_t *Ns,
                            const float *const *biases, int64_t K, int block, const void *x, int64_t R, int64_t ldx,
                            int dtype, const void *res, void *y, int64_t ldy, void *scratch);
#endif
