/* Q4_K and Q6_K repacked at load for the AVX-512 VNNI path (quant_x16_avx512_vnni.c): the same
 * information as the file's blocks, laid out so that one 512-bit register holds 4 codes of each
 * of 16 weight rows (one 32-bit lane per row). A dot product then takes the activation's 4 codes
 * broadcast to every lane, and a sub-block's scales are one vector over the 16 rows: no shuffles,
 * no per-tile scale unpacking.
 *
 * A group is 16 consecutive weight rows (the last one padded with zero rows), stored tile after
 * tile (256 weights of each row per tile). Offsets inside a group tile, l = row in the group:
 *
 * Q4_K_X16, 2368 bytes (16 x 148: the file's 144 plus the 6-bit scales and mins as bytes):
 *   0     d[l]     float16                 32    dmin[l]  float16
 *   64    sc[j][l] sub-block j's scale     192   m[p][l][e] the min of sub-block 2p + e
 *   320   qs[j][v][l][b]: low nibble = weight 32j + 8v + b, high nibble = weight 32j + 8v + 4 + b
 * Q6_K_X16, 3392 bytes (16 x 212: the file's 210, and 32 bytes that keep tiles on 64-byte lines):
 *   0     sc[g][l] group g's int8 scale (16 weights)   256   d[l] float16
 *   320 + 192 g: ql[v][l][b] (128 bytes): low nibble = low 4 bits of weight 16g + 8v + b, high nibble =
 *         of 16g + 8v + 4 + b; then qh[l][b] (64 bytes): bits 2i, 2i + 1 = the top 2 bits of 16g + 4i + b
 * (j < 8 sub-blocks of 32, g < 16 groups of 16, v < 4 or 2 vectors, b < 4 bytes of a lane.)
 */
#include <string.h>

#include "quant.h"

static int tile_bytes(int type)
{
    return type == QT_Q4_K_X16 ? K4_TILE : K6_TILE;
}

/* bytes of a repacked matrix of N rows of K (a whole number of blocks), the last group padded */
int64_t speculant_qrepacked_bytes(int type, int64_t N, int64_t K)
{
    const qformat *f = speculant_qformat(QT_X16 + type);
    return (N + XROWS - 1) / XROWS * (K / f->block_elems) * f->block_bytes * XROWS;
}

static void put_q4k(const uint8_t *b, int l, uint8_t *t)
{
    uint8_t u[QTILE];
    float ws[QTILE / QGROUP], wb[QTILE / QGROUP];
    speculant_qdecode(QT_Q4_K, b, 0, QTILE, u, ws, wb, 0);
    memcpy(t + K4_D + 2 * l, b, 2);
    memcpy(t + K4_DMIN + 2 * l, b + 2, 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        speculant_scale_min_k4(j, b + 4, &sc, &m);
        t[K4_SC + 16 * j + l] = (uint8_t)sc;
        t[K4_M + 32 * (j / 2) + 2 * l + j % 2] = (uint8_t)m;
        for (int v = 0; v < 4; v++)
            for (int i = 0; i < 4; i++)
                t[K4_QS + 256 * j + 64 * v + 4 * l + i] = (uint8_t)(u[32 * j + 8 * v + i] | u[32 * j + 8 * v + 4 + i] << 4);
    }
}

static void put_q6k(const uint8_t *b, int l, uint8_t *t)
{
    uint8_t u[QTILE];
    float ws[QTILE / QGROUP], wb[QTILE / QGROUP];
    speculant_qdecode(QT_Q6_K, b, 0, QTILE, u, ws, wb, 0);
    memcpy(t + K6_D + 2 * l, b + 208, 2);
    for (int g = 0; g < 16; g++) {
        t[K6_SC + 16 * g + l] = b[192 + g];
        for (int i = 0; i < 4; i++) {
            uint8_t h = 0;
            for (int q = 0; q < 4; q++)
                h |= (uint8_t)((u[16 * g + 4 * q + i] >> 4) << (2 * q));
            t[K6_G + 192 * g + 128 + 4 * l + i] = h;
            for (int v = 0; v < 2; v++)
                t[K6_G + 192 * g + 64 * v + 4 * l + i] =
                    (uint8_t)((u[16 * g + 8 * v + i] & 0xf) | (u[16 * g + 8 * v + 4 + i] & 0xf) << 4);
        }
    }
}

/* dst (speculant_qrepacked_bytes) = the N rows of src (file blocks, Q4_K or Q6_K, or a block of 32
 * format: quant_repack_b32.c) repacked; 0, or -1 for another type or a K that is not a whole number of blocks */
int speculant_qrepack_x16(int type, const uint8_t *src, int64_t N, int64_t K, uint8_t *dst)
{
    if (speculant_qis_b32(type) && K > 0 && K % 32 == 0) {
        memset(dst, 0, (size_t)speculant_qrepacked_bytes(type, N, K));
        speculant_qrepack_x16_b32(type, src, N, K, dst);
        return 0;
    }
    if ((type != QT_Q4_K && type != QT_Q6_K) || K <= 0 || K % QTILE)
        return -1;
    const qformat *f = speculant_qformat(type);
    const int64_t tiles = K / QTILE, row_bytes = tiles * f->block_bytes, tb = tile_bytes(QT_X16 + type);
    const int64_t groups = (N + XROWS - 1) / XROWS;
    memset(dst, 0, (size_t)speculant_qrepacked_bytes(type, N, K));
#pragma omp parallel for schedule(static)
    for (int64_t grp = 0; grp < groups; grp++)
        for (int l = 0; l < XROWS && grp * XROWS + l < N; l++)
            for (int64_t t = 0; t < tiles; t++) {
                const uint8_t *b = src + (grp * XROWS + l) * row_bytes + t * f->block_bytes;
                uint8_t *out = dst + (grp * tiles + t) * tb;
                if (type == QT_Q4_K)
                    put_q4k(b, l, out);
                else
                    put_q6k(b, l, out);
            }
    return 0;
}

static float half_at(const uint8_t *p)
{
    return speculant_half_to_float((uint16_t)(p[0] | p[1] << 8));
}

void speculant_qdecode_x16(int type, const uint8_t *w, int64_t K, int64_t row, int64_t k0, int n, uint8_t *u,
                           float *ws, float *wb)
{
    if (speculant_qis_b32(type - QT_X16)) {
        speculant_qdecode_x16_b32(type, w, K, row, k0, n, u, ws, wb);
        return;
    }
    const int64_t tiles = K / QTILE, tb = tile_bytes(type);
    const int l = (int)(row % XROWS);
    for (int done = 0; done < n; done += QTILE) {
        const uint8_t *t = w + (row / XROWS * tiles + (k0 + done) / QTILE) * tb;
        uint8_t *y = u + done;
        float *s = ws + done / QGROUP, *o = wb + done / QGROUP;
        if (type == QT_Q4_K_X16) {
            float d = half_at(t + K4_D + 2 * l), dmin = half_at(t + K4_DMIN + 2 * l);
            for (int j = 0; j < 8; j++) {
                s[2 * j] = s[2 * j + 1] = d * (float)t[K4_SC + 16 * j + l];
                o[2 * j] = o[2 * j + 1] = -dmin * (float)t[K4_M + 32 * (j / 2) + 2 * l + j % 2];
                for (int v = 0; v < 4; v++)
                    for (int i = 0; i < 4; i++) {
                        uint8_t q = t[K4_QS + 256 * j + 64 * v + 4 * l + i];
                        y[32 * j + 8 * v + i] = q & 0xf;
                        y[32 * j + 8 * v + 4 + i] = q >> 4;
                    }
            }
            continue;
        }
        float d = half_at(t + K6_D + 2 * l);
        for (int g = 0; g < 16; g++) {
            s[g] = d * (float)(int8_t)t[K6_SC + 16 * g + l];
            o[g] = -32.0f * s[g];
            for (int i = 0; i < 4; i++) {
                uint8_t h = t[K6_G + 192 * g + 128 + 4 * l + i];
                for (int v = 0; v < 2; v++) {
                    uint8_t q = t[K6_G + 192 * g + 64 * v + 4 * l + i];
                    y[16 * g + 8 * v + i] = (uint8_t)((q & 0xf) | ((h >> (4 * v)) & 3) << 4);
                    y[16 * g + 8 * v + 4 + i] = (uint8_t)((q >> 4) | ((h >> (4 * v + 2)) & 3) << 4);
                }
            }
        }
    }
}

/* 1 where a matrix of file type `type` should be repacked: the dot products take the AVX-512 VNNI
 * path now and its group kernel was built (other paths read repacked rows, more slowly) */
int speculant_qrepack_wanted(int type)
{
    if (speculant_qlinear_isa() != QISA_AVX512_VNNI)
        return 0;
    if (speculant_qis_b32(type))
        return speculant_qgroup_x16_b32_vnni != 0;
    return (type == QT_Q4_K || type == QT_Q6_K) && speculant_qgroup_x16_vnni != 0;
}
