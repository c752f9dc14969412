/* The accumulation loop of the bfloat16 linear layer's widening paths (AVX2 and AVX-512; the
 * contract and the blocked layout are linear_bf16.c's), one body for both vector widths.
 *
 * Included by linear_bf16_avx2.c and linear_bf16_avx512.c after they define, for their registers:
 *   WV, WI           the float32 and integer vector types; W_PATH the path's target attribute;
 *   W_LOAD(p)        an unaligned load of a vector of 32-bit lanes from uint16_t *p;
 *   W_SET1(i)        a 32-bit integer broadcast;   W_ZERO()  a zero float vector;
 *   W_SLL16(v), W_AND(v, m), W_AS_FLOAT(v)        shift lanes left by 16, and, reinterpret;
 *   W_FMA(a, b, c)   a * b + c fused.
 * It defines widened_accumulate(): for `rows` input rows (a constant at each call site, so the
 * accumulators stay in registers), a0[t] and a1[t] = the float32 dot products of row t with the
 * output rows held by the weight vectors at w0 and w1 (16 * 2 elements apart per feature pair).
 * Each 32-bit lane holds one output row's feature pair: a shift left by 16 widens the even
 * feature, a mask of the high half the odd one (both exact), and the odd product then the even
 * one are added to the lane's accumulator, over k in order: the scalar path's sums, so its bits
 * (a product of two bfloat16 numbers is exact in float32, so the fused add rounds as it does). */
W_PATH __attribute__((always_inline)) static inline void
widened_accumulate(const int rows, const uint16_t *x, int64_t ldx, const uint16_t *w0, const uint16_t *w1, int64_t k2,
                   WV *a0, WV *a1)
{
    const WI high = W_SET1((int)0xffff0000u);
    for (int t = 0; t < rows; t++)
        a0[t] = a1[t] = W_ZERO();
    for (int64_t kk = 0; kk < k2; kk++) {
        const WI v0 = W_LOAD(w0 + kk * 32), v1 = W_LOAD(w1 + kk * 32);
        const WV even0 = W_AS_FLOAT(W_SLL16(v0)), odd0 = W_AS_FLOAT(W_AND(v0, high));
        const WV even1 = W_AS_FLOAT(W_SLL16(v1)), odd1 = W_AS_FLOAT(W_AND(v1, high));
        for (int t = 0; t < rows; t++) {
            int32_t pair;
            memcpy(&pair, x + t * ldx + 2 * kk, sizeof pair);
            const WI p = W_SET1(pair);
            const WV x0 = W_AS_FLOAT(W_SLL16(p)), x1 = W_AS_FLOAT(W_AND(p, high));
            a0[t] = W_FMA(even0, x0, W_FMA(odd0, x1, a0[t]));
            a1[t] = W_FMA(even1, x0, W_FMA(odd1, x1, a1[t]));
        }
    }
}
