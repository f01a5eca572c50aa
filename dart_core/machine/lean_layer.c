/* One decoder layer of the lean forward (Llama / Qwen2 / Qwen3 / Mistral) for few rows, in fp32, in one call; the
   same layer serves the DART draft head (dart_core/draft_native.py), whose attention reads rows it assembles itself
   (draft_input). Its weights are fp32, bf16 or int8 (few_rows.c), its arithmetic fp32.

   Between its matrix products a layer does some thirty small operations (norms, the rotation, the cache writes,
   attention, the activation). As torch operations each costs a dispatch, and after a product has streamed megabytes
   of weights through the caches each dispatch runs cold: on a 2-core CPU they took a third of a decode step. Here
   they are plain loops over a few rows.

   Every row is computed on its own, in a fixed order: its products by few_rows_linear, its attention over the cache
   entries it sees in ascending order. A row of a verified tree therefore gets exactly the bits plain decoding gets
   for the same prefix (its ancestors sit in the cache in the order plain decoding would have put them), which the
   suite checks. */
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

void few_rows_linear(const float *x, const float *w, const float *b, float *y, long M, long K, long N, int threads);
void few_rows_linear_bf16(const float *x, const unsigned short *w, const float *b, float *y, long M, long K, long N,
                          int threads);
void few_rows_linear_i8(const float *x, const signed char *w, const float *b, float *y, long M, long K, long N,
                        int threads);
void few_rows_linear_q4_1(const float *x, const unsigned char *w, const float *b, float *y, long M, long K, long N,
                          int threads);
void few_rows_share(const void *w, long size, long K, long N, int t, int T, const char **start, const char **end);
void few_rows_share_groups(const void *w, long group_bytes, long N, int t, int T, const char **start,
                           const char **end);
long few_rows_q4_1_bytes(long K, long N);
void bf16_tiles_linear(const float *x, const unsigned short *tiles, const float *b, float *y, long M, long K, long N,
                       int threads, int way);
void bf16_tiles_share(const void *tiles, long K, long N, int t, int T, const char **start, const char **end);

/* the weights' kinds (machine/few_rows.py: WEIGHT_KINDS): packed for few_rows.c (fp32, bf16, int8, or fp32 values
   as Q4_1 blocks), or bf16 as tiles (bf16_tiles.c), a kind per way their products run (BF16_TILES + the way - 1:
   amx_tiles.BF16_WAYS) */
enum { FP32_WEIGHTS, BF16_WEIGHTS, INT8_WEIGHTS, Q4_1_WEIGHTS, BF16_TILES };
static const long WEIGHT_BYTES[] = {4, 2, 1};        /* an entry's bytes, by kind packed for few_rows.c */

/* y = x w^T (+ b), w of the kind `weights` says */
static void linear(const float *x, const void *w, const float *b, float *y, long M, long K, long N, int threads,
                   int weights) {
    if (weights >= BF16_TILES)
        bf16_tiles_linear(x, w, b, y, M, K, N, threads, weights - BF16_TILES + 1);
    else if (weights == BF16_WEIGHTS)
        few_rows_linear_bf16(x, w, b, y, M, K, N, threads);
    else if (weights == INT8_WEIGHTS)
        few_rows_linear_i8(x, w, b, y, M, K, N, threads);
    else if (weights == Q4_1_WEIGHTS)
        few_rows_linear_q4_1(x, w, b, y, M, K, N, threads);
    else
        few_rows_linear(x, w, b, y, M, K, N, threads);
}

typedef float v8 __attribute__((vector_size(32)));
#ifdef __AVX512F__
#define VW 16
#else
#define VW 8
#endif
typedef float vw __attribute__((vector_size(VW * 4)));
typedef int vi __attribute__((vector_size(VW * 4)));
#define MAX_HEAD_DIM 512

/* Lane l of the result: the sum of v[l]'s lanes, by one tree of additions that is the same for every l. */
static inline vw reduce_lanes(const vw v[VW]) {
#if VW == 16
    vw a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29,
                                       30, 31);
    for (int i = 0; i < 4; i++)
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26,
                                       27) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                       31);
    for (int i = 0; i < 2; i++)
        c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28,
                                       29) +
               __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30,
                                       31);
    return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#else
    vw a[4], b[2];
    for (int i = 0; i < 4; i++)
        a[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(v[2 * i], v[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int i = 0; i < 2; i++)
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    return __builtin_shufflevector(b[0], b[1], 0, 2, 4, 6, 8, 10, 12, 14) +
           __builtin_shufflevector(b[0], b[1], 1, 3, 5, 7, 9, 11, 13, 15);
#endif
}

/* q against the keys of VW entries (rows of d floats from keys): each score by the same products and the same tree
   of sums. */
static inline vw score_block(const float *q, const float *keys, long d) {
    vw acc[VW], qc, kc;
    for (int l = 0; l < VW; l++) acc[l] = (vw){0};
    for (long c = 0; c < d; c += VW) {
        memcpy(&qc, q + c, sizeof qc);
        for (int l = 0; l < VW; l++) {
            memcpy(&kc, keys + l * d + c, sizeof kc);
            acc[l] += qc * kc;
        }
    }
    return reduce_lanes(acc);
}

/* exp of VW lanes at or below 0 (scores less their maximum), Cephes' expf: about 1 ulp, 0 below -87. The same
   arithmetic for every lane, so a score's weight never depends on where it sits. */
static inline vw exp_lanes(vw x) {
    const vw low = (vw){0} - 87.0f;   /* (masked entries come as -inf) */
    vi under = x < low;
    x = (vw)(((vi)x & ~under) | ((vi)low & under));
    vi n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vi);   /* x <= 0: truncation rounds */
    vw fn = __builtin_convertvector(n, vw);
    vw r = x - fn * 0.693359375f - fn * -2.12194440e-4f;
    vw y = 1.9875691500e-4f * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    vw scale = (vw)((n + 127) << 23);
    return (vw)((vi)(y * scale) & ~under);
}

/* silu(g) * u = g * sigmoid(g) * u lane by lane, sigmoid from e = exp(-|g|) (at or below 0, as exp_lanes takes it):
   1 / (1 + e) for g >= 0, e times that below. */
static inline vw silu_times_lanes(vw g, vw u) {
    vi negative = g < 0;
    vw e = exp_lanes((vw)((vi)g | ((vi){0} + (int)0x80000000)));   /* -|g|: the sign bit set */
    vw r = 1.0f / (1.0f + e), er = e * r;
    vw sig = (vw)(((vi)r & ~negative) | ((vi)er & negative));
    return g * sig * u;
}

/* y = silu(g) * u over n floats, VW at a time (the few left over, one lane each, by the same arithmetic). */
static void silu_times(const float *g, const float *u, float *y, long n) {
    long j = 0;
    for (; j + VW <= n; j += VW) {
        vw gv, uv;
        memcpy(&gv, g + j, sizeof gv), memcpy(&uv, u + j, sizeof uv);
        gv = silu_times_lanes(gv, uv);
        memcpy(y + j, &gv, sizeof gv);
    }
    for (; j < n; j++) {
        vw gv = {0}, uv = {0};
        gv[0] = g[j], uv[0] = u[j];
        y[j] = silu_times_lanes(gv, uv)[0];
    }
}

static float dot(const float *a, const float *b, long d) {
    /* two 8-lane partial sums, then their lanes in order: a fixed order for every call */
    v8 s0 = {0}, s1 = {0}, x, y;
    long j = 0;
    for (; j + 16 <= d; j += 16) {
        memcpy(&x, a + j, 32), memcpy(&y, b + j, 32), s0 += x * y;
        memcpy(&x, a + j + 8, 32), memcpy(&y, b + j + 8, 32), s1 += x * y;
    }
    s0 += s1;
    float s = 0.0f;
    for (int l = 0; l < 8; l++) s += s0[l];
    for (; j < d; j++) s += a[j] * b[j];
    return s;
}

static void rms_rows(const float *x, const float *w, long w_stride, float *y, long rows, long D, float eps) {
    /* y = w * (x / sqrt(mean(x^2) + eps)) per row of D; w_stride 0: one weight for every row */
    for (long i = 0; i < rows; i++) {
        const float *xi = x + i * D, *wi = w + i * w_stride;
        float r = 1.0f / sqrtf(dot(xi, xi, D) / (float)D + eps);
        for (long j = 0; j < D; j++) y[i * D + j] = wi[j] * (xi[j] * r);
    }
}

static void rotate(float *x, const float *c, const float *s, long d) {
    /* transformers' rotary embedding: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1) */
    long half = d / 2;
    float t[d];
    memcpy(t, x, d * sizeof(float));
    for (long j = 0; j < d; j++) x[j] = t[j] * c[j] + (j < half ? -t[j + half] : t[j - half]) * s[j];
}

/* Cache lines to prefetch into L2 while computing: `every` of them at each prefetch_some, from p up to end. */
typedef struct {
    const char *p, *end;
    long every;
} prefetch_run;

static inline void prefetch_some(prefetch_run *r) {
    for (long i = 0; i < r->every && r->p < r->end; i++, r->p += 64) __builtin_prefetch(r->p, 0, 2);
}

/* The weighted sums of values of m queries (weights: rows of sc) over slices slices of VW floats from j0, into outs,
   divided by each query's total weight (summed here when j0 is 0, into total, entry by entry: the order does not
   depend on where the entries it sees sit). Each query's sum runs entry by entry in the cache's order, held in
   registers; each slice of a value is loaded once for all the queries. A query's sums do not depend on the others:
   an entry it does not see adds its weight, exactly zero, times a value, which changes nothing. */
#define QUERY_CHUNK 4
#define SLICES (VW == 16 ? 4 : 2)   /* with QUERY_CHUNK sums each, as many as the registers hold */
static inline __attribute__((always_inline)) void sum_values(const float *sc, long stride, long m, long span,
                                                             const float *V, long d, long j0, long slices,
                                                             float *total, float *const outs[], prefetch_run *pf) {
    vw acc[QUERY_CHUNK][SLICES] = {{{0}}}, v;
    float p[QUERY_CHUNK], sum[QUERY_CHUNK] = {0};
    for (long e = 0; e < span; e++) {
        if (e % VW == 0) prefetch_some(pf);
        for (int r = 0; r < QUERY_CHUNK; r++) p[r] = r < m ? sc[r * stride + e] : 0.0f, sum[r] += p[r];
        for (long t = 0; t < slices; t++) {
            memcpy(&v, V + e * d + j0 + t * VW, sizeof v);
            for (int r = 0; r < QUERY_CHUNK; r++) acc[r][t] += p[r] * v;
        }
    }
    for (long r = 0; r < m; r++) {
        if (j0 == 0)
            total[r] = sum[r];
        for (long t = 0; t < slices; t++) {
            acc[r][t] /= total[r];
            memcpy(outs[r] + j0 + t * VW, &acc[r][t], sizeof acc[r][t]);
        }
    }
}

/* Up to QUERY_CHUNK queries of one KV group (the group's heads of some rows) over the cache entries each may see:
   every key and value is read once for all of them. Each query gets the same arithmetic as it would alone: its
   scores by score_block, its weights by exp_lanes, its sum of values in the entries' order. sc: QUERY_CHUNK
   rows of span + VW floats. */
static void attend(const float *const qs[], float *const outs[], const long rows_of[], long m, const float *K,
                   const float *V, float *sc, long span, long past, long n, const unsigned char *block, long d,
                   float scale, prefetch_run *pf) {
    long stride = span + VW;
    float total[QUERY_CHUNK], tail[VW * MAX_HEAD_DIM];
    vw best[QUERY_CHUNK];
    for (long r = 0; r < m; r++) best[r] = (vw){0} - INFINITY;
    for (long e0 = 0; e0 < span; e0 += VW) {
        const float *keys = K + e0 * d;
        prefetch_some(pf);
        if (e0 + VW > span) {   /* the last block: its keys past the last entry are zeros */
            memset(tail, 0, sizeof(float) * VW * d);
            memcpy(tail, keys, sizeof(float) * (span - e0) * d);
            keys = tail;
        }
        for (long r = 0; r < m; r++) {
            vw s = score_block(qs[r], keys, d) * scale;
            if (e0 + VW > past) {   /* entries of the block the row's query may not see: -inf */
                long i = rows_of[r];
                for (int l = 0; l < VW; l++) {
                    long e = e0 + l;
                    int seen = e < past || (e < span && (block ? block[i * n + (e - past)] != 0 : e - past <= i));
                    s[l] = seen ? s[l] : -INFINITY;
                }
            }
            memcpy(sc + r * stride + e0, &s, sizeof s);
            vi above = s > best[r];   /* the maximum, lane by lane: exact in any order */
            best[r] = (vw)(((vi)s & above) | ((vi)best[r] & ~above));
        }
    }
    for (long r = 0; r < m; r++) {
        float *row = sc + r * stride, top = -INFINITY;
        for (int l = 0; l < VW; l++) top = best[r][l] > top ? best[r][l] : top;
        for (long e0 = 0; e0 < span; e0 += VW) {
            vw x;
            memcpy(&x, row + e0, sizeof x);
            x = exp_lanes(x - top);
            memcpy(row + e0, &x, sizeof x);
        }
    }
    for (long j0 = 0; j0 < d; j0 += SLICES * VW)
        if (d - j0 >= SLICES * VW)
            sum_values(sc, stride, m, span, V, d, j0, SLICES, total, outs, pf);
        else
            sum_values(sc, stride, m, span, V, d, j0, (d - j0) / VW, total, outs, pf);
}

/* The rows' queries, keys and values qkv [n, (H + 2 KV) d] from their inputs x [n, Din]: projected, normed per head
   (qk_norm, Qwen3) and rotated; the keys and values written to the cache at past .. past + n - 1. A layer's first
   part (lean_layer); called alone, all a one-layer draft head needs of the committed positions before the last, whose
   outputs nothing reads (the head's catching up on skipped steps). qkv: at least n (H + 2 KV) d floats. */
void lean_layer_qkv(const float *x, const float *cos_, const float *sin_, const void *qkv_w, const float *qkv_b,
                    const float *qk_norm, float *k_cache, float *v_cache, float *qkv, long n, long Din, long H, long KV,
                    long d, long past, long cap, float eps, int threads, int weights) {
    long qkv_n = (H + 2 * KV) * d;
    linear(x, qkv_w, qkv_b, qkv, n, Din, qkv_n, threads, weights);
    for (long i = 0; i < n; i++) {
        float *row = qkv + i * qkv_n;
        if (qk_norm) rms_rows(row, qk_norm, d, row, H + KV, d, eps);
        for (long hh = 0; hh < H + KV; hh++) rotate(row + hh * d, cos_ + i * d, sin_ + i * d, d);
        for (long g = 0; g < KV; g++)
            for (long j = 0; j < d; j++) {
                k_cache[(g * cap + past + i) * d + j] = row[(H + g) * d + j];
                v_cache[(g * cap + past + i) * d + j] = row[(H + KV + g) * d + j];
            }
    }
}

/* h [n, D]: the rows' hidden states, updated in place. x_in [n, Din]: the attention's input as it is, or NULL for
   the norm of h (Din = D). cos, sin [n, d]. block [n, n] (1: row i sees row j of the
   block) or NULL for a causal block; every row sees the `past` cache entries. k_cache, v_cache: this layer's
   [KV, cap, d]; the block's keys and values are written at past .. past + n - 1. Weights packed for
   few_rows_linear, of the kind `weights` says; qkv_b, o_b: biases or NULL; qk_norm: [H + KV, d] (Qwen3) or NULL.
   scratch: at least lean_layer_scratch(...) floats. */
void lean_layer(float *h, const float *x_in, const float *cos_, const float *sin_, const unsigned char *block,
                const float *norm_in, const void *qkv_w, const float *qkv_b, const float *qk_norm,
                const void *o_w, const float *o_b, const float *norm_post, const void *gu_w, const void *down_w,
                float *k_cache, float *v_cache, float *scratch,
                long n, long D, long Din, long H, long KV, long d, long I, long past, long cap, float eps, int threads,
                int weights) {
    long qkv_n = (H + 2 * KV) * d, span = past + n, rep = H / KV;
    float *x = scratch, *qkv = x + n * D, *att = qkv + n * qkv_n, *gu = att + n * H * d, *act = gu + n * 2 * I,
          *tmp = act + n * I, *scores = tmp + n * D;
    float scale = 1.0f / sqrtf((float)d);

    if (!x_in) rms_rows(h, norm_in, 0, x, n, D, eps);
    lean_layer_qkv(x_in ? x_in : x, cos_, sin_, qkv_w, qkv_b, qk_norm, k_cache, v_cache, qkv, n, Din, H, KV, d, past,
                   cap, eps, threads, weights);
    /* queries per task: as many as QUERY_CHUNK while every thread gets a task (fewer leave a thread idle); a query's
       arithmetic does not depend on the others of its task. Each task reads its group's keys and values, so a group
       split over more tasks is read more times: on an EPYC Zen 5 a one-row step after 1,024 tokens took 3.9-4.0 ms
       with each thread given two tasks (a group's three queries split), 3.55-3.6 with whole groups */
    long per_group = n * rep, chunk = QUERY_CHUNK;
    while (chunk > 1 && KV * ((per_group + chunk - 1) / chunk) < threads) chunk--;
    long chunks = (per_group + chunk - 1) / chunk;
#pragma omp parallel num_threads(threads) if (n * H * span >= 1024)
    {
        int t = 0, T = 1;
#ifdef _OPENMP
        t = omp_get_thread_num(), T = omp_get_num_threads();
#endif
        /* memory fetches this thread's share of the output projection while the attention computes on the cache
           (on the AMX Xeon a forward of 1-16 rows 0.6 ms sooner): spread over the thread's attention, a few lines
           at each block of keys it scores or sums, so that the attention's arithmetic and the memory overlap */
        prefetch_run pf;
        if (weights >= BF16_TILES)
            bf16_tiles_share(o_w, H * d, D, t, T, &pf.p, &pf.end);
        else if (weights == Q4_1_WEIGHTS)
            few_rows_share_groups(o_w, few_rows_q4_1_bytes(H * d, 1), D, t, T, &pf.p, &pf.end);
        else
            few_rows_share(o_w, WEIGHT_BYTES[weights], H * d, D, t, T, &pf.p, &pf.end);
        long blocks = (span + VW - 1) / VW, passes = 1 + (d + SLICES * VW - 1) / (SLICES * VW);
        long stops = (KV * chunks + T - 1) / T * blocks * passes, lines = (pf.end - pf.p + 63) / 64;
        pf.every = (lines + stops - 1) / stops;
#pragma omp for schedule(static) nowait
    for (long task = 0; task < KV * chunks; task++) {
        long g = task / chunks, r0 = (task % chunks) * chunk;
        long m = per_group - r0 < chunk ? per_group - r0 : chunk;
        const float *qs[QUERY_CHUNK];
        float *outs[QUERY_CHUNK];
        long rows_of[QUERY_CHUNK];
        for (long r = 0; r < m; r++) {   /* the group's queries: row by row, the group's heads within a row */
            long i = (r0 + r) / rep, hh = g * rep + (r0 + r) % rep;
            qs[r] = qkv + i * qkv_n + hh * d, outs[r] = att + i * H * d + hh * d, rows_of[r] = i;
        }
        attend(qs, outs, rows_of, m, k_cache + g * cap * d, v_cache + g * cap * d,
               scores + t * QUERY_CHUNK * (span + VW), span, past, n, block, d, scale, &pf);
    }
        pf.every = lines;   /* what is left, before this thread waits for the others */
        prefetch_some(&pf);
    }
    linear(att, o_w, o_b, tmp, n, H * d, D, threads, weights);
    for (long j = 0; j < n * D; j++) h[j] += tmp[j];

    rms_rows(h, norm_post, 0, x, n, D, eps);
    linear(x, gu_w, 0, gu, n, D, 2 * I, threads, weights);
    for (long i = 0; i < n; i++) silu_times(gu + i * 2 * I, gu + i * 2 * I + I, act + i * I, I);
    linear(act, down_w, 0, tmp, n, I, D, threads, weights);
    for (long j = 0; j < n * D; j++) h[j] += tmp[j];
}

/* The decoder's L layers in turn on the rows h [n, D] (lean_layer for each, x_in the norm of h): layers [L][9], each
   layer's norm_in, qkv_w, qkv_b, qk_norm, o_w, o_b, norm_post, gu_w, down_w as lean_layer takes them; kv: layer i's
   keys at kv + 2 i layer_floats, its values layer_floats after. Before layer taps[t] runs, h is copied into columns
   t D .. (t + 1) D - 1 of captured [n, n_taps D]. One call a forward: thirty calls from Python, each of 29
   arguments, cost a one-row forward after 256 tokens 0.1-0.2 ms (on an EPYC Zen 5, 200 alternating: 6.26 -> 6.06 ms,
   the median). */
void lean_layers(float *h, const float *cos_, const float *sin_, const unsigned char *block, const void *const *layers,
                 long L, float *kv, long layer_floats, float *scratch, long n, long D, long H, long KV, long d, long I,
                 long past, long cap, float eps, int threads, int weights, const long *taps, long n_taps,
                 float *captured) {
    for (long i = 0; i < L; i++) {
        for (long t = 0; t < n_taps; t++)
            if (taps[t] == i)
                for (long r = 0; r < n; r++) memcpy(captured + (r * n_taps + t) * D, h + r * D, D * sizeof(float));
        const void *const *w = layers + 9 * i;
        float *keys = kv + 2 * i * layer_floats;
        lean_layer(h, 0, cos_, sin_, block, w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], keys,
                   keys + layer_floats, scratch, n, D, D, H, KV, d, I, past, cap, eps, threads, weights);
    }
}

long lean_layer_scratch(long n, long D, long H, long KV, long d, long I, long past, int threads) {
    return n * D + n * (H + 2 * KV) * d + n * H * d + n * 2 * I + n * I + n * D +
           (long)threads * QUERY_CHUNK * (past + n + VW);
}

/* The last norm over the rows: the output layer's input. */
void lean_final_norm(const float *h, const float *w, float *y, long n, long D, float eps) {
    rms_rows(h, w, 0, y, n, D, eps);
}

/* The draft head's layer input (dart_core/draft_head.py): for each of the S real positions, x = [embed_norm(embed),
   feature_norm(g)] and the residual h = g, where g is its features through fc; for each of the K mask slots after
   them x = mask (2H) and h = its first H. x [S + K, 2H], h [S + K, H]. */
void draft_input(const float *embeds, const float *g, const float *mask, const float *embed_norm,
                 const float *feature_norm, float *x, float *h, long S, long K, long H, float eps) {
    for (long i = 0; i < S; i++) {
        rms_rows(embeds + i * H, embed_norm, 0, x + i * 2 * H, 1, H, eps);
        rms_rows(g + i * H, feature_norm, 0, x + i * 2 * H + H, 1, H, eps);
        memcpy(h + i * H, g + i * H, H * sizeof(float));
    }
    for (long i = S; i < S + K; i++) {
        memcpy(x + i * 2 * H, mask, 2 * H * sizeof(float));
        memcpy(h + i * H, mask, H * sizeof(float));
    }
}
