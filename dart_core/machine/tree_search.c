/* DART's n-gram-guided beam search (dart_core/tree_search.py) in C, and the n-gram counts it needs.

   The search is the same algorithm as tree_search.search, step for step: the same scores by the same operations in
   the same order (no contraction into fused multiply-adds, the one log of the C library, which tree_search's
   log_term also uses where this is built), the same ties broken the same way. It fills the same columns for every
   candidate, so the trace and the app see exactly what the numpy search would have recorded (tests/
   test_tree_search.py compares them bit for bit).

   The n-gram counts: the search asks, for each beam path's context suffix s, count(s) and count(s + t) for the same
   k candidate tokens t. Every key that starts with s lies in one run of the sorted (m+1)-gram keys: it is found once
   per path (two binary searches of the whole table) and the candidates are searched inside it in ascending order,
   each search starting where the last one ended, a few cache lines instead of some twenty misses each over tens of
   megabytes; a one-token suffix's counts are found once per level. Counts are integers: the result is exactly
   numpy's. */
#ifdef __clang__
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef unsigned long long u64;

/* ------------------------------------------------------------------------------------------------ n-gram counts */

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

/* lower_bound probing outwards from lo: cheap where the answer lies near lo. */
static long gallop(const u64 *keys, long lo, long hi, u64 key) {
    if (lo >= hi || keys[lo] >= key) return lo;
    long below = lo, step = 1;   /* keys[below] < key */
    while (below + step < hi && keys[below + step] < key) below += step, step *= 2;
    return lower_bound(keys, below + 1, below + step < hi ? below + step + 1 : hi, key);
}

/* For the k tokens in `ascending` order (their indices), count(prefix + token) into num (0 where unseen) from the run
   [lo, hi) of keys that start with `prefix`: one forward walk, each search starting where the last one ended.
   skip[j] set: left as it is. */
static void counts_in_run(const u64 *keys, const long long *counts, long lo, long hi, u64 prefix, int bits,
                          const long long *tokens, const long *ascending, long k, const signed char *skip,
                          double *num) {
    for (long i = 0; i < k && lo < hi; i++) {
        long j = ascending[i];
        if (skip && skip[j]) continue;
        u64 key = (prefix << bits) | (u64)tokens[j];
        lo = gallop(keys, lo, hi, key);
        num[j] = lo < hi && keys[lo] == key ? (double)counts[lo] : 0.0;
    }
}

static long count_of(const u64 *keys, const long long *counts, long lo, long hi, u64 key) {
    long at = lower_bound(keys, lo, hi, key);
    return at < hi && keys[at] == key ? (long)counts[at] : 0;
}

/* The run [*lo, *hi) of the (m+1)-gram keys in keys[from, to) that start with the packed m-gram `prefix`. */
static void run_of(const u64 *keys, long from, long to, u64 prefix, int bits, long *lo, long *hi) {
    u64 first = prefix << bits, last = first | (bits >= 64 ? ~0ULL : (1ULL << bits) - 1);
    *lo = lower_bound(keys, from, to, first);
    *hi = lower_bound(keys, *lo, to, last);
    if (*hi < to && keys[*hi] == last) ++*hi;
}

/* ctx_keys [B]: the packed m-token suffixes; valid [B] (0: the row is skipped, its counts 0); tokens [B, T], ids of
   the vocabulary. keys_m / counts_m (n_m of them): the sorted m-grams; keys_next / counts_next (n_next): the
   (m+1)-grams. num [B, T] = count(suffix + token), den [B] = count(suffix), as doubles. */
void ngram_counts(const u64 *ctx_keys, const unsigned char *valid, const long long *tokens, long B, long T, int bits,
                  const u64 *keys_m, const long long *counts_m, long n_m, const u64 *keys_next,
                  const long long *counts_next, long n_next, double *num, double *den) {
    for (long b = 0; b < B; b++) {
        den[b] = 0.0;
        for (long t = 0; t < T; t++) num[b * T + t] = 0.0;
        if (!valid[b]) continue;
        den[b] = (double)count_of(keys_m, counts_m, 0, n_m, ctx_keys[b]);
        long lo, hi;
        run_of(keys_next, 0, n_next, ctx_keys[b], bits, &lo, &hi);
        for (long t = 0; lo < hi && t < T; t++)
            num[b * T + t] = (double)count_of(keys_next, counts_next, lo, hi, (ctx_keys[b] << bits) | (u64)tokens[b * T + t]);
    }
}

/* A table of `order` orders: keys[k - 1], counts[k - 1], sizes[k - 1] for the k-grams, and starts[k - 1] [vocab + 1]:
   where the k-grams that begin with each token start (a search of a first token's keys only, a few cache lines
   instead of some twenty misses over tens of megabytes). */
typedef struct {
    int order, bits;
    const u64 *const *keys;
    const long long *const *counts;
    const long *sizes;
    const long long *const *starts;
} table;

/* A level's k tokens as its n-gram lookups read them: in ascending order (each run of keys walked forward once), and
   its length-1 backoff rows by the context's last token, count(last + t) / count(last) for each token t (0 where
   unseen). The beams of a level share few last tokens (the row's best few, under different parents), and these
   lookups, in the long runs of the 2-grams that follow a common token, were most of the search. */
typedef struct {
    long k;
    const long long *tokens;   /* [k] */
    long *ascending;           /* [k] the tokens' indices, by token */
    double *num;               /* [k] scratch */
    long n_last;
    long long *last;           /* [capacity] the last tokens met so far at this level */
    double *q;                 /* [capacity * k] their rows */
} level_tokens;

static void start_level(level_tokens *lv, const long long *tokens) {
    lv->tokens = tokens, lv->n_last = 0;
    for (long i = 0; i < lv->k; i++) {   /* insertion sort: k is tens */
        long j = i;
        for (; j > 0 && tokens[lv->ascending[j - 1]] > tokens[i]; j--) lv->ascending[j] = lv->ascending[j - 1];
        lv->ascending[j] = i;
    }
}

/* For the suffix of `length` tokens packed in `key` (its first token `first`): count(suffix), returned, and where it
   is seen, num[j] = count(suffix + token j) for each of the level's tokens (0 where unseen or skip[j] is set). */
static double suffix_counts(const table *t, long length, long long first, u64 key, const level_tokens *lv,
                            const signed char *skip, double *num) {
    const long long *in_m = t->starts[length - 1] + first, *in_next = t->starts[length] + first;
    double den = (double)count_of(t->keys[length - 1], t->counts[length - 1], in_m[0], in_m[1], key);
    if (den > 0) {
        for (long j = 0; j < lv->k; j++) num[j] = 0.0;
        long lo, hi;
        run_of(t->keys[length], in_next[0], in_next[1], key, t->bits, &lo, &hi);
        counts_in_run(t->keys[length], t->counts[length], lo, hi, key, t->bits, lv->tokens, lv->ascending, lv->k,
                      skip, num);
    }
    return den;
}

static const double *last_row(const table *t, level_tokens *lv, long long last) {
    for (long r = 0; r < lv->n_last; r++)
        if (lv->last[r] == last) return lv->q + r * lv->k;
    double *q = lv->q + lv->n_last * lv->k;
    lv->last[lv->n_last++] = last;
    double den = suffix_counts(t, 1, last, (u64)last, lv, 0, q);
    for (long j = 0; j < lv->k; j++)
        q[j] = den > 0 && q[j] > 0 ? q[j] / fmax(den, 1e-12) : 0.0;
    return q;
}

/* The reference's backoff (ngram.backoff) for one context of n_ctx tokens (-1: missing) and the level's k tokens: for
   the longest suffix first, a token seen after it gets count(suffix + token) / count(suffix); a token seen after none
   gets 0 with match 0. The last suffix, one token, from the level's rows (the same quotients, computed once a last
   token). */
static void backoff(const table *t, const long long *ctx, long n_ctx, level_tokens *lv, double *q, signed char *match) {
    long k = lv->k;
    for (long j = 0; j < k; j++) q[j] = 0.0, match[j] = 0;
    long longest = t->order - 1 < n_ctx ? t->order - 1 : n_ctx;
    for (long length = longest; length >= 2; length--) {
        const long long *suffix = ctx + n_ctx - length;
        u64 key = 0;
        int valid = 1;
        for (long i = 0; i < length; i++) {
            valid &= suffix[i] >= 0;
            key = (key << t->bits) | (u64)(suffix[i] >= 0 ? suffix[i] : 0);
        }
        if (!valid) continue;
        double den = suffix_counts(t, length, suffix[0], key, lv, match, lv->num);
        if (!(den > 0)) continue;
        for (long j = 0; j < k; j++)
            if (!match[j] && lv->num[j] > 0) q[j] = lv->num[j] / fmax(den, 1e-12), match[j] = (signed char)length;
    }
    if (longest < 1 || ctx[n_ctx - 1] < 0) return;
    const double *row = last_row(t, lv, ctx[n_ctx - 1]);
    for (long j = 0; j < k; j++)
        if (!match[j] && row[j] > 0) q[j] = row[j], match[j] = 1;
}

/* ------------------------------------------------------------------------------------------------ the search */

/* tree_search's log_term: weight * ln(p + eps), never above 0. */
static double log_term(double p, double weight, double eps) {
    double v = weight * log(p + eps);
    return v < 0.0 ? v : 0.0;
}

void log_terms(const double *p, long n, double weight, double eps, double *out) {
    for (long i = 0; i < n; i++) out[i] = log_term(p[i], weight, eps);
}

typedef struct {   /* a candidate as sorted: by a small integer key, its score (descending) and its index */
    int first;
    double score;
    long index;
} entry;

static int by_first_score_index(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->index < y->index ? -1 : (x->index > y->index);
}

static int by_score_first_index(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return x->index < y->index ? -1 : (x->index > y->index);
}

typedef int (*order_fn)(const void *, const void *);

/* The first n of `all` [count] in the order `before` gives, sorted, into best [n]: one comparison with the last kept
   for most entries (the search wants a beam or a tree of tens out of hundreds or thousands). Returns how many. */
static long best_of(const entry *all, long count, long n, order_fn before, entry *best) {
    long have = 0;
    for (long i = 0; i < count && n > 0; i++) {
        if (have == n && before(&all[i], &best[n - 1]) >= 0) continue;
        long j = have < n ? have++ : n - 1;
        while (j > 0 && before(&all[i], &best[j - 1]) < 0) best[j] = best[j - 1], j--;
        best[j] = all[i];
    }
    return have;
}

/* Beam states, as tree_search.BEAM_STATES */
enum { EXPANDED, BEAM_CUT, EOS_END, LAST_LEVEL };

/* rows_tokens [R, stride] (the first k of each row used), rows_probs [R, stride] as doubles; tail [n_ctx]: the
   context's last tokens (-1 where the context is shorter); level_weight, logit_weight [R]; ngram: NULL for no n-gram
   term; eos [n_eos]. The columns (capacity: every candidate the search can make) are filled for each candidate;
   kept [budget] receives the tree's candidates in node order. Returns the candidates made; *n_kept the kept ones.
   A level's beams are shared among `threads` threads, each beam's candidates computed alone (each thread keeps its
   own rows of last tokens): the same columns whatever their number. After a target forward the n-gram tables are
   out of the caches and the lookups wait on memory: two threads wait at once (on an EPYC Zen 5, a search inside
   decoding 0.32 -> 0.27 ms: studies/step_anatomy.py --search-threads 1,2). */
long dart_search(const long long *rows_tokens, const double *rows_probs, long R, long stride, long k,
                 const long long *tail, long n_ctx, const double *level_weight, const double *logit_weight,
                 double ngram_weight, double eps, int ngram_first_level, long beam_width, long budget,
                 const long long *eos, long n_eos, const table *ngram,
                 long long *token, int *level, int *parent, double *draft_prob, double *logit_term_out,
                 double *ngram_prob, signed char *ngram_match, double *ngram_term, double *level_weight_out,
                 double *score, signed char *beam, long *kept, long *n_kept, int threads) {
    long width = beam_width > 0 ? beam_width : 1, offset = 0;
    long *beam_idx = malloc(sizeof(long) * width), *next_idx = malloc(sizeof(long) * width);
    double *beam_score = malloc(sizeof(double) * width), *next_score = malloc(sizeof(double) * width);
    long long *ctx = malloc(sizeof(long long) * (width * n_ctx + 1)),
              *next_ctx = malloc(sizeof(long long) * (width * n_ctx + 1));
    entry *order = malloc(sizeof(entry) * (width * k + 1)), *chosen = malloc(sizeof(entry) * width);
    double *lt = malloc(sizeof(double) * (k + 1));
    unsigned char *is_eos = malloc(k + 1);
    int T = threads > 1 ? threads : 1;
    level_tokens *lvs = malloc(sizeof(level_tokens) * T);
    for (int t = 0; t < T; t++)
        lvs[t] = (level_tokens){k, 0, malloc(sizeof(long) * (k + 1)), malloc(sizeof(double) * (k + 1)), 0,
                                malloc(sizeof(long long) * width), malloc(sizeof(double) * (width * k + 1))};
    long B = 1, levels = budget > 0 ? R : 0;
    beam_idx[0] = -1, beam_score[0] = 0.0;
    memcpy(ctx, tail, sizeof(long long) * n_ctx);
    for (long l = 0; l < levels; l++) {
        const long long *tok = rows_tokens + l * stride;
        const double *prob = rows_probs + l * stride;
        double wlev = level_weight[l];
        int with_ngram = ngram && ngram_weight > 0 && (l > 0 || ngram_first_level);
        long non_eos = 0;
        if (with_ngram)
            for (int t = 0; t < T; t++) start_level(&lvs[t], tok);
        for (long j = 0; j < k; j++) {
            lt[j] = log_term(prob[j], logit_weight[l], eps);
            is_eos[j] = 0;
            for (long e = 0; e < n_eos; e++) is_eos[j] |= tok[j] == eos[e];
        }
        _Pragma("omp parallel for num_threads(T) schedule(static) reduction(+ : non_eos) if (T > 1 && B > 1)")
        for (long b = 0; b < B; b++) {
            long at = offset + b * k;
            int t = 0;
#ifdef _OPENMP
            t = omp_get_thread_num();
#endif
            if (with_ngram)
                backoff(ngram, ctx + b * n_ctx, n_ctx, &lvs[t], ngram_prob + at, ngram_match + at);
            for (long j = 0; j < k; j++) {
                long i = at + j;
                if (with_ngram)
                    ngram_term[i] = log_term(ngram_prob[i], ngram_weight, eps);
                else
                    ngram_prob[i] = NAN, ngram_match[i] = -1, ngram_term[i] = 0.0;
                token[i] = tok[j], level[i] = (int)l, parent[i] = (int)beam_idx[b];
                draft_prob[i] = prob[j], logit_term_out[i] = lt[j], level_weight_out[i] = wlev;
                score[i] = beam_score[b] + wlev * (lt[j] + ngram_term[i]);
                beam[i] = l == levels - 1 ? LAST_LEVEL : is_eos[j] ? EOS_END : BEAM_CUT;
                order[b * k + j] = (entry){is_eos[j], score[i], b * k + j};
                non_eos += !is_eos[j];
            }
        }
        /* the next beam: the best non-EOS sequences (ties keep the earlier, i.e. higher-ranked parent / token) */
        long n_next = l < levels - 1 ? (width < non_eos ? width : non_eos) : 0;
        best_of(order, B * k, n_next, by_first_score_index, chosen);
        for (long s = 0; s < n_next; s++) {
            long flat = chosen[s].index, row = flat / k;
            beam[offset + flat] = EXPANDED;
            next_idx[s] = offset + flat, next_score[s] = score[offset + flat];
            if (n_ctx) {
                memcpy(next_ctx + s * n_ctx, ctx + row * n_ctx + 1, sizeof(long long) * (n_ctx - 1));
                next_ctx[s * n_ctx + n_ctx - 1] = tok[flat % k];
            }
        }
        offset += B * k;
        B = n_next;
        long *ti = beam_idx; beam_idx = next_idx; next_idx = ti;
        double *ts = beam_score; beam_score = next_score; next_score = ts;
        long long *tc = ctx; ctx = next_ctx; next_ctx = tc;
        if (n_next == 0) break;
    }
    /* the tree: the top `budget` by score, shallower first on ties (a parent always precedes its children) */
    entry *all = order, *ranked = malloc(sizeof(entry) * (budget + 1));
    long *candidate_at = malloc(sizeof(long) * (budget + 1));
    if (offset > width * k) all = realloc(order, sizeof(entry) * offset), order = all;
    for (long i = 0; i < offset; i++) all[i] = (entry){level[i], score[i], i};
    long n = best_of(all, offset, budget, by_score_first_index, ranked);
    for (long i = 0; i < n; i++) candidate_at[i] = ranked[i].index, ranked[i].index = i;
    /* in node order: by depth, then score, ties in ranking order */
    qsort(ranked, n, sizeof(entry), by_first_score_index);
    for (long i = 0; i < n; i++) kept[i] = candidate_at[ranked[i].index];
    *n_kept = n;
    free(ranked), free(candidate_at), free(beam_idx), free(next_idx), free(beam_score), free(next_score), free(ctx);
    free(next_ctx), free(order), free(chosen), free(lt), free(is_eos);
    for (int t = 0; t < T; t++) free(lvs[t].ascending), free(lvs[t].num), free(lvs[t].last), free(lvs[t].q);
    free(lvs);
    return offset;
}

/* ----------------------------------------------------------------------------------------------- a pool's path */

/* The candidates of a search's pool (token, parent, score, level: n of them) spelling `path` from the root, as far as
   the pool holds it (a parent's children carry distinct tokens), and each one's rank in the search's ranking: how many
   candidates rank before it (a higher score, or an equal one shallower, or equal in both and earlier in the pool).
   Returns how many of the path it found; ranks [length]. (budget/pool.py: pool_path and ranks_of in numpy, which
   took the automatic budget about 0.05 ms a step over pools of 2,500.) */
long pool_path_ranks(const long long *token, const int *parent, const double *score, const int *level, long n,
                     const long long *path, long length, long long *ranks) {
    long prev = -1, found = 0;
    for (; found < length; found++) {
        long hit = -1;
        for (long j = 0; j < n && hit < 0; j++)
            if (parent[j] == prev && token[j] == path[found]) hit = j;
        if (hit < 0) break;
        double s = score[hit];
        int lv = level[hit];
        long long before = 0;
        for (long j = 0; j < n; j++)
            before += score[j] > s || (score[j] == s && (level[j] < lv || (level[j] == lv && j < hit)));
        ranks[found] = before, prev = hit;
    }
    return found;
}

/* ------------------------------------------------------------------------------------------- the search's rows */

/* The k largest of each of R rows of logits [R, V] (1 <= k <= V), best first and the earlier of equal ones first, with
   their softmax over those k (renormalised as the reference does): the rows the search reads, taken from the draft
   head's logits in one pass instead of torch's top-k, softmax and copies (inside decoding on the AMX Xeon, 0.17
   against 0.28 ms a step). A NaN counts as -inf. The rows are shared among `threads` threads (each row alone: the
   same result whatever their number). */
typedef float v16 __attribute__((vector_size(64)));
typedef int i16 __attribute__((vector_size(64)));

void draft_rows_top(const float *logits, long R, long V, long k, long long *ids, float *probs, int threads) {
    _Pragma("omp parallel for num_threads(threads) schedule(static) if (R > 1 && threads > 1)")
    for (long r = 0; r < R; r++) {
        const float *row = logits + r * V;
        long long *id = ids + r * k;
        float *value = probs + r * k;
        long n = 0;
        for (long j0 = 0; j0 < V; j0 += 16) {
            long j1 = j0 + 16 < V ? j0 + 16 : V;
            if (n == k && j1 - j0 == 16) {   /* most blocks hold nothing above the k-th: one test for 16 */
                v16 block;
                memcpy(&block, row + j0, sizeof block);
                i16 above = block > value[k - 1];   /* (a NaN is never above) */
                int any = 0;
                for (int l = 0; l < 16; l++) any |= above[l];
                if (!any) continue;
            }
            for (long j = j0; j < j1; j++) {
                float v = row[j] == row[j] ? row[j] : -INFINITY;
                if (n == k && !(v > value[k - 1])) continue;
                long at = n < k ? n++ : k - 1;
                while (at > 0 && v > value[at - 1]) {   /* after every equal one: the earlier index stays first */
                    value[at] = value[at - 1], id[at] = id[at - 1];
                    at--;
                }
                value[at] = v, id[at] = j;
            }
        }
        float top = value[0], sum = 0.0f;
        for (long i = 0; i < k; i++) sum += value[i] = expf(value[i] - top);
        for (long i = 0; i < k; i++) value[i] /= sum;
    }
}
