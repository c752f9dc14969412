/* The paged K/V cache write, CPU: token t's key and value rows go to cache
 * slot slot_mapping[t] (slot = block * block_size + offset).
 *
 * One memcpy per token and tensor replaces torch's advanced-index assignment,
 * whose index machinery costs more than the copy at decode sizes. Rows are
 * copied bit for bit, so the cache holds exactly what the index assignment
 * would store (the caller passes rows already in the cache's dtype).
 * No per-path variant (kernels.h): a byte copy has no arithmetic to vectorise
 * by hand, and the C library's memcpy already picks the widest copy this CPU
 * has at run time (glibc's own ifunc dispatch, AVX2/AVX-512 on x86, NEON/SVE
 * on aarch64), so every path writes the same bytes at memory speed.
 *
 * Layouts: key/value [T, H_kv * D] with a row stride (elements) each, the
 * inner H_kv * D elements contiguous (a slice of a fused projection is fine);
 * k_cache/v_cache [num_slots, H_kv * D] contiguous; slot_mapping [T] int64.
 * Returns 0, or -3 when a slot lies outside [0, num_slots) (nothing is
 * written then: the caller raises).
 */
#include <stdint.h>
#include <string.h>

int speculant_write_kv(const void *key, int64_t key_stride, const void *value, int64_t value_stride,
                       void *k_cache, void *v_cache, const int64_t *slot_mapping, int64_t T, int64_t row_elems,
                       int64_t elem_size, int64_t num_slots)
{
    for (int64_t t = 0; t < T; t++)
        if (slot_mapping[t] < 0 || slot_mapping[t] >= num_slots)
            return -3;
    const int64_t row_bytes = row_elems * elem_size;
    for (int64_t t = 0; t < T; t++) {
        const int64_t slot = slot_mapping[t];
        memcpy((char *)k_cache + slot * row_bytes, (const char *)key + t * key_stride * elem_size, row_bytes);
        memcpy((char *)v_cache + slot * row_bytes, (const char *)value + t * value_stride * elem_size, row_bytes);
    }
    return 0;
}
