/* Q4_0, Q4_1, Q5_0 and Q8_0 (blocks of 32 weights) repacked at load for the AVX-512 VNNI path
 * (quant_x16_b32_avx512_vnni.c), the same information as the file's blocks in the same bytes: one
 * 512-bit register holds 4 codes of each of 16 weight rows (one 32-bit lane per row), so a dot
 * product takes the activation's 4 codes broadcast to every lane, and a block's scales are one
 * vector over the 16 rows.
 *
 * A group is 16 consecutive weight rows (the last one padded with zero rows) of nb = K / 32 blocks,
 * stored as sections, each block after block (l = row in the group, b < 4 a byte of a lane):
 *   d      nb x 32 bytes: d[l] float16
 *   Q4_1:  m     nb x 32 bytes: m[l] float16 (the block's offset)
 *   Q5_0:  qh    nb x 64 bytes: qh[l][b], bit k = the 5th bit of weight 4k + b
 *   codes  Q4_0, Q4_1, Q5_0: nb x 256 bytes, qs[v][l][b] (v < 4): low nibble = weight 8v + b, high
 *          nibble = weight 8v + 4 + b; Q8_0: nb x 512 bytes, q[k][l][b] (k < 8) = weight 4k + b + 128
 * Per row and block that is the file's 18, 20, 22 or 34 bytes; with nb even every section and group
 * starts on a 64-byte line.
 */
#include <string.h>

#include "quant.h"

/* byte offsets of the m or qh section and of the codes in a group of nb blocks */
static int64_t side_at(int64_t nb)
{
    return 32 * nb;
}

static int64_t codes_at(int base, int64_t nb)
{
    return nb * (base == QT_Q4_1 ? 64 : base == QT_Q5_0 ? 96 : 32);
}

int speculant_qis_b32(int type)
{
    return type == QT_Q4_0 || type == QT_Q4_1 || type == QT_Q5_0 || type == QT_Q8_0;
}

/* block j of row l (file bytes at b) into the group at g */
static void put_block(int type, const uint8_t *b, int l, int64_t j, int64_t nb, uint8_t *g)
{
    uint8_t u[32];
    float ws[2], wb[2];
    speculant_qdecode(type, b, 0, 32, u, ws, wb, 0);
    memcpy(g + 32 * j + 2 * l, b, 2);
    if (type == QT_Q4_1)
        memcpy(g + side_at(nb) + 32 * j + 2 * l, b + 2, 2);
    uint8_t *c = g + codes_at(type, nb);
    for (int k = 0; k < 8; k++)
        for (int i = 0; i < 4; i++) {
            if (type == QT_Q8_0) {
                c[512 * j + 64 * k + 4 * l + i] = u[4 * k + i];  /* already q + 128 */
                continue;
            }
            if (type == QT_Q5_0)
                g[side_at(nb) + 64 * j + 4 * l + i] |= (uint8_t)((u[4 * k + i] >> 4) << k);
            c[256 * j + 64 * (k / 2) + 4 * l + i] |= (uint8_t)((u[4 * k + i] & 0xf) << (4 * (k % 2)));
        }
}

/* dst = the N rows of src (file blocks) repacked; dst zeroed, sized by speculant_qrepacked_bytes */
void speculant_qrepack_x16_b32(int type, const uint8_t *src, int64_t N, int64_t K, uint8_t *dst)
{
    const qformat *f = speculant_qformat(type);
    const int64_t nb = K / 32, row_bytes = nb * f->block_bytes, group_bytes = nb * f->block_bytes * XROWS;
    const int64_t groups = (N + XROWS - 1) / XROWS;
#pragma omp parallel for schedule(static)
    for (int64_t grp = 0; grp < groups; grp++)
        for (int l = 0; l < XROWS && grp * XROWS + l < N; l++)
            for (int64_t j = 0; j < nb; j++)
                put_block(type, src + (grp * XROWS + l) * row_bytes + j * f->block_bytes, l, j, nb,
                          dst + grp * group_bytes);
}

static float half_at(const uint8_t *p)
{
    return speculant_half_to_float((uint16_t)(p[0] | p[1] << 8));
}

/* speculant_qdecode_x16 for these formats: row `row`'s weights [k0, k0 + n) (multiples of 32) */
void speculant_qdecode_x16_b32(int type, const uint8_t *w, int64_t K, int64_t row, int64_t k0, int n, uint8_t *u,
                               float *ws, float *wb)
{
    const int base = type - QT_X16;
    const qformat *f = speculant_qformat(type);
    const int64_t nb = K / 32;
    const uint8_t *g = w + row / XROWS * nb * f->block_bytes * XROWS, *c = g + codes_at(base, nb);
    const int l = (int)(row % XROWS);
    for (int done = 0; done < n; done += 32) {
        const int64_t j = (k0 + done) / 32;
        const float d = half_at(g + 32 * j + 2 * l);
        uint8_t *y = u + done;
        for (int k = 0; k < 8; k++)
            for (int i = 0; i < 4; i++) {
                if (base == QT_Q8_0) {
                    y[4 * k + i] = c[512 * j + 64 * k + 4 * l + i];
                    continue;
                }
                uint8_t q = (uint8_t)((c[256 * j + 64 * (k / 2) + 4 * l + i] >> (4 * (k % 2))) & 0xf);
                if (base == QT_Q5_0)
                    q |= (uint8_t)(((g[side_at(nb) + 64 * j + 4 * l + i] >> k) & 1) << 4);
                y[4 * k + i] = q;
            }
        /* the offsets exactly as speculant_qdecode computes them from the file's block */
        const float off = base == QT_Q4_0 ? -8.0f * d : base == QT_Q4_1 ? half_at(g + side_at(nb) + 32 * j + 2 * l)
                        : base == QT_Q5_0 ? -16.0f * d : -128.0f * d;
        ws[done / QGROUP] = ws[done / QGROUP + 1] = d;
        wb[done / QGROUP] = wb[done / QGROUP + 1] = off;
    }
}
