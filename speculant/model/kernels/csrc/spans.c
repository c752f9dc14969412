/* The span checks of the attention kernels (paged_attention.c, decoder_bf16.c): every read and
 * write a span would make, checked against the pool and the batch before any is made. */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

static int span_fault(int64_t *bad, int kind, int64_t span, int64_t entry, int64_t id, int64_t start, int64_t end)
{
    const int64_t fields[SPAN_BAD_FIELDS] = {kind, span, entry, id, start, end};
    memcpy(bad, fields, sizeof fields);
    return -3;
}

int speculant_check_spans(const int64_t *cu_query_lens, const int64_t *starts, const int64_t *block_tables,
                          int64_t n_seqs, int64_t max_blocks, const int64_t *span_ids, int64_t n_spans,
                          int64_t num_tokens, int64_t num_blocks, int64_t block_size, int64_t *bad)
{
    for (int64_t s = 0; s < n_spans; s++) {
        const int64_t b = span_ids[s];
        if (b < 0 || b >= n_seqs)
            return span_fault(bad, BAD_SPAN_ID, b, -1, -1, -1, -1);
        const int64_t row0 = cu_query_lens[b], row1 = cu_query_lens[b + 1], start = starts[b];
        const int64_t end = start + row1 - row0;
        if (row0 < 0 || row1 < row0 || row1 > num_tokens || start < 0 || block_size <= 0)
            return span_fault(bad, BAD_ROWS, b, -1, -1, start, end);
        const int64_t needed = (end + block_size - 1) / block_size;  /* blocks holding positions < end */
        if (needed > max_blocks)
            return span_fault(bad, BAD_TABLE_SHORT, b, max_blocks, -1, start, end);
        const int64_t *table = block_tables + b * max_blocks;
        for (int64_t i = 0; i < needed; i++)
            if (table[i] < 0 || table[i] >= num_blocks)
                return span_fault(bad, BAD_BLOCK_ID, b, i, table[i], start, end);
    }
    return 0;
}
