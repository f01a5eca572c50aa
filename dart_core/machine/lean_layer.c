/* One decoder layer of the lean forward (Llama / Qwen2 / Qwen3 / Mistral) for few rows, in fp32, in one call.

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

typedef float v8 __attribute__((vector_size(32)));

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

/* h [n, D]: the rows' hidden states, updated in place. cos, sin [n, d]. block [n, n] (1: row i sees row j of the
   block) or NULL for a causal block; every row sees the `past` cache entries. k_cache, v_cache: this layer's
   [KV, cap, d]; the block's keys and values are written at past .. past + n - 1. Weights packed for
   few_rows_linear; qkv_b, o_b: biases or NULL; qk_norm: [H + KV, d] (Qwen3) or NULL. scratch: at least
   lean_layer_scratch(...) floats. */
void lean_layer(float *h, const float *cos_, const float *sin_, const unsigned char *block,
                const float *norm_in, const float *qkv_w, const float *qkv_b, const float *qk_norm,
                const float *o_w, const float *o_b, const float *norm_post, const float *gu_w, const float *down_w,
                float *k_cache, float *v_cache, float *scratch,
                long n, long D, long H, long KV, long d, long I, long past, long cap, float eps, int threads) {
    long qkv_n = (H + 2 * KV) * d, span = past + n, rep = H / KV;
    float *x = scratch, *qkv = x + n * D, *att = qkv + n * qkv_n, *gu = att + n * H * d, *act = gu + n * 2 * I,
          *tmp = act + n * I, *scores = tmp + n * D;
    float scale = 1.0f / sqrtf((float)d);

    rms_rows(h, norm_in, 0, x, n, D, eps);
    few_rows_linear(x, qkv_w, qkv_b, qkv, n, D, qkv_n, threads);
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
#pragma omp parallel for num_threads(threads) schedule(static) if (n * H * span >= 1024)
    for (long task = 0; task < n * H; task++) {
        long i = task / H, hh = task % H, g = hh / rep;
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        float *sc = scores + t * span, *out = att + i * H * d + hh * d;
        const float *q = qkv + i * qkv_n + hh * d, *K = k_cache + g * cap * d, *V = v_cache + g * cap * d;
        float best = -INFINITY;
        for (long e = 0; e < span; e++) {
            int seen = e < past || (block ? block[i * n + (e - past)] != 0 : e - past <= i);
            sc[e] = seen ? dot(q, K + e * d, d) * scale : -INFINITY;
            if (sc[e] > best) best = sc[e];
        }
        float total = 0.0f;
        for (long j = 0; j < d; j++) out[j] = 0.0f;
        for (long e = 0; e < span; e++) {
            if (sc[e] == -INFINITY) continue;
            float p = expf(sc[e] - best);
            total += p;
            for (long j = 0; j < d; j++) out[j] += p * V[e * d + j];
        }
        for (long j = 0; j < d; j++) out[j] /= total;
    }
    few_rows_linear(att, o_w, o_b, tmp, n, H * d, D, threads);
    for (long j = 0; j < n * D; j++) h[j] += tmp[j];

    rms_rows(h, norm_post, 0, x, n, D, eps);
    few_rows_linear(x, gu_w, 0, gu, n, D, 2 * I, threads);
    for (long i = 0; i < n; i++)
        for (long j = 0; j < I; j++) {
            float g = gu[i * 2 * I + j];
            act[i * I + j] = g / (1.0f + expf(-g)) * gu[i * 2 * I + I + j];
        }
    few_rows_linear(act, down_w, 0, tmp, n, I, D, threads);
    for (long j = 0; j < n * D; j++) h[j] += tmp[j];
}

long lean_layer_scratch(long n, long D, long H, long KV, long d, long I, long past, int threads) {
    return n * D + n * (H + 2 * KV) * d + n * H * d + n * 2 * I + n * I + n * D + (long)threads * (past + n);
}

/* The last norm over the rows: the output layer's input. */
void lean_final_norm(const float *h, const float *w, float *y, long n, long D, float eps) {
    rms_rows(h, w, 0, y, n, D, eps);
}
