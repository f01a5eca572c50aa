/* The counts an n-gram lookup needs (dart_core/ngram.py, NGramModel.continuation_counts), from the sorted packed keys.

   The tree search asks, for each beam path's context suffix s, count(s) and count(s + t) for the same k candidate
   tokens t. Every key that starts with s lies in one run of the sorted (m+1)-gram keys: it is found once per path
   (two binary searches of the whole table), and the candidates are searched inside it, a few cache lines instead of
   some twenty misses each over tens of megabytes. Counts are integers: the result is exactly numpy's. */
typedef unsigned long long u64;

/* The first index in keys[lo, hi) whose key is >= key (hi when none). */
static long lower_bound(const u64 *keys, long lo, long hi, u64 key) {
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        if (keys[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static long count_of(const u64 *keys, const long long *counts, long lo, long hi, u64 key) {
    long at = lower_bound(keys, lo, hi, key);
    return at < hi && keys[at] == key ? (long)counts[at] : 0;
}

/* ctx_keys [B]: the packed m-token suffixes; valid [B] (0: the row is skipped, its counts 0); tokens [B, T].
   keys_m / counts_m (n_m of them): the sorted m-grams; keys_next / counts_next (n_next): the (m+1)-grams.
   num [B, T] = count(suffix + token), den [B] = count(suffix), as doubles. */
void ngram_counts(const u64 *ctx_keys, const unsigned char *valid, const long long *tokens, long B, long T, int bits,
                  const u64 *keys_m, const long long *counts_m, long n_m, const u64 *keys_next,
                  const long long *counts_next, long n_next, double *num, double *den) {
    u64 low_bits = bits >= 64 ? ~0ULL : (1ULL << bits) - 1;
    for (long b = 0; b < B; b++) {
        den[b] = 0.0;
        for (long t = 0; t < T; t++) num[b * T + t] = 0.0;
        if (!valid[b]) continue;
        den[b] = (double)count_of(keys_m, counts_m, 0, n_m, ctx_keys[b]);
        u64 first = ctx_keys[b] << bits;
        long lo = lower_bound(keys_next, 0, n_next, first);
        long hi = lower_bound(keys_next, lo, n_next, first | low_bits);
        if (hi < n_next && keys_next[hi] == (first | low_bits)) hi++;
        if (lo == hi) continue;
        for (long t = 0; t < T; t++)
            num[b * T + t] = (double)count_of(keys_next, counts_next, lo, hi, first | (u64)tokens[b * T + t]);
    }
}
