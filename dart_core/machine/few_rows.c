/* y[M, N] = x[M, K] w^T (+ b) in fp32 for few rows M: the target's linears in a decode or verify step.

   Such a product reads every weight once and does little with it, so it is bound by memory; torch's GEMMs are built
   for many rows and leave bandwidth unused at 2-16 (docs/cpu-speed.md, section 7). Here the weight is packed once
   as [ceil(N / W), K, W], W = GROUP * VW: W consecutive outputs side by side for each k, so one vector load of the
   weight (a block of VW outputs) feeds an FMA per row with x[m, k] broadcast, no horizontal sums, and the GROUP blocks
   of a group are read as one sequential stream, each block's sums a chain of its own. Each output is summed in the
   same order (k ascending, one FMA each) whatever M is, so a row's result does not depend on the rows computed with
   it: verifying a tree gives exactly the logits plain decoding gives for the same prefix (up to attention).

   The same product reads bf16 weights too (few_rows_linear_bf16: a bf16 model's, the draft head's): each is widened
   to fp32 exactly (its 16 bits become the top half of a float) as it is loaded, so it reads half the bytes and
   computes as the fp32 product does on the widened weights. And int8 weights with a scale per output
   (few_rows_linear_i8, the draft head's where that drafts faster): a quarter of the bytes, the scale applied once to
   each output's sum.

   Built by dart_core/machine/few_rows.py with the C compiler at hand, for the CPU at hand (VW: 16 floats with
   AVX-512, else 8); threads from OpenMP (torch's own runtime, loaded first), their number passed by the caller. */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#ifdef __AVX512F__
#define VW 16
#define REGS 32
#else
#define VW 8
#define REGS 16
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
typedef unsigned int vu __attribute__((vector_size(VW * 4)));
typedef unsigned short vh __attribute__((vector_size(VW * 2)));
typedef unsigned short bf16;
typedef signed char vc __attribute__((vector_size(VW)));
typedef int vi __attribute__((vector_size(VW * 4)));

/* VW weights at p: fp32 as they are, bf16 widened (exactly: bf16 is the top half of an fp32). */
static inline vf load_f32(const float *p) { return *(const vf *)p; }
static inline vf load_bf16(const bf16 *p) {
#if defined(__AVX512F__)   /* one widening load (the generic form below compiles to two halves) */
    return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
#elif defined(__AVX2__)
    return (vf)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
#else
    vh h;
    __builtin_memcpy(&h, p, sizeof h);
    return (vf)(__builtin_convertvector(h, vu) << 16);
#endif
}

/* int8, widened to fp32 (its output's scale is applied once, to the sum). */
static inline vf load_i8(const signed char *p) {
#if defined(__AVX512F__)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif defined(__AVX2__)
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    vc c;
    __builtin_memcpy(&c, p, sizeof c);
    return __builtin_convertvector(__builtin_convertvector(c, vi), vf);
#endif
}

#define PASS_ROWS 8   /* the most rows one pass over a weight's blocks sums: more rows take several passes */
/* Blocks done together: as many as the registers hold with M accumulators each. */
#define NB_MAX(M) ((REGS - 1) / ((M) + 1))
/* Blocks of VW outputs side by side in the packed weight, a group: 3, as many as a pass of PASS_ROWS rows does
   together with AVX-512's registers (with AVX2's, passes of up to 4 rows). A product reads a group as one sequential
   stream, GROUP vectors per input, every row's GROUP sums independent chains. On an EPYC Zen 5, against blocks packed
   one after another (read one at a time, or up to 8 side by side from separate places in memory, whichever was
   faster), the decoder's linears of 1/2/4/8/16 rows 6.04/6.23/6.91/7.33/9.74 -> 5.76/5.70/5.94/6.24/8.81 ms
   (studies/ceilings.py); groups of 2 or 4 did worse from 4 rows, in the AVX-512 build and in the AVX2 build alike
   (docs/cpu-speed.md, section 20). */
#define GROUP 3
#define W (GROUP * VW)
#define NB_FOR(M) (NB_MAX(M) > GROUP ? GROUP : (NB_MAX(M) < 1 ? 1 : NB_MAX(M)))
/* Rows a pass sums where several passes share the blocks: as many as sum a whole group at a time. With AVX2's 16
   registers, passes of 4 rows (4 x 3 sums) rather than 8 (8 x 1, a weight load for every 8 FMAs besides the rows'
   8 broadcasts): on an EPYC Zen 3, the default model's verifies of 9 / 16 / 64 rows 60-64 / 75-88 / 332-345 ->
   44-49 / 65-70 / 226-259 ms, with the loop below counting instead of dividing (docs/cpu-speed.md, section 26). A
   build may set it: the tests run 32 registers' passes of 8 in an AVX2 build too (few_rows.MARCH). */
#ifndef SHARED_ROWS
#define SHARED_ROWS (NB_MAX(PASS_ROWS) >= GROUP ? PASS_ROWS : 4)
#endif
/* Passes of more rows go over a block set SPAN inputs at a time: the first pass reads the span's weights from memory,
   the others from L1, so memory stays busy (whole blocks per pass left it idle in every pass but the first: on the
   AMX Xeon 16 rows took 1.6x one row, at most 1.1x with spans). */
#define SPAN 64
/* In one pass, each weight stream is prefetched this many vectors ahead: without it the products of 8-16 rows, busy
   computing, left the memory idle (on the AMX Xeon: 8 rows over 212 MB of weights 8.6 -> 7.0 ms, 1 row 6.3 -> 5.8 ms;
   16 or 64 ahead gained less, and the non-temporal hint made every product twice as slow). With several passes over a
   span, every pass prefetches a share of the next span (pass p of P, every P-th input, the next span's input
   (p SPAN + i) / P), so memory keeps fetching while the later passes compute from L1: prefetching in the first pass
   alone left it idle through the others (the AMX Xeon, the model's linears at 24 rows 24.3 -> 21.7 ms, 32 rows 29.6
   -> 26.3; prefetching two spans ahead, into L2 only, or spans of 32 or 128 inputs did no better). */
#define PREFETCH 32
/* How the products read their weights, as the caller measured (few_rows.Reading; setup/calibration.py:
   reading_choice): one-pass products of fewer than prefetch_rows rows do not prefetch ahead. On the AMX Xeon
   prefetching kept memory busy at every row count; on an EPYC Zen 5 the hardware's own prefetchers did as well alone
   for one row, worse from 2 (passes of more rows always prefetch). */
static long prefetch_rows = 1;
void few_rows_reading(long prefetch_from) { prefetch_rows = prefetch_from; }

/* y[n..] = v (times the outputs' scales s where the weights are int8) (+ b). Scale and bias in one fmaf: left to the
   compiler, whether they fuse would depend on the code around, and so would an output's last bit. */
static inline void store(float *restrict y, vf v, long n, long N, const float *restrict b, const float *restrict s) {
    for (int i = 0; i < VW && n + i < N; i++)
        y[n + i] = s && b ? fmaf(v[i], s[n + i], b[n + i]) : s ? v[i] * s[n + i] : b ? v[i] + b[n + i] : v[i];
}

/* A unit's M x NB sums: from zero at the first input (k0 = 0), else from `part`; at the end kept in `part` (k1 < K)
   or stored as outputs. */
#define SUMS_FROM(M, NB)                                                                                      \
    vf acc[M][NB];                                                                                            \
    _Pragma("GCC unroll 8") for (int r = 0; r < M; r++)                                                       \
        _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) acc[r][j] = k0 ? part[r * NB + j] : (vf){0};
#define SUMS_KEPT_OR_STORED(M, NB)                                                                            \
    if (k1 < K)                                                                                               \
        _Pragma("GCC unroll 8") for (int r = 0; r < M; r++)                                                   \
            _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) part[r * NB + j] = acc[r][j];                \
    else                                                                                                      \
        for (int r = 0; r < M; r++)                                                                           \
            for (int j = 0; j < NB; j++) store(y + r * N, acc[r][j], (blk + j) * VW, N, b, s);

/* M rows' sums over inputs k0 .. k1 - 1 for NB blocks from blk (within one group, whose inputs lie ks entries
   apart), pass `pass` of `passes` over them: started at zero (k0 = 0) or from `part`, kept in `part` or (k1 = K)
   stored as outputs. Each output gets one FMA per input, in ascending order, whatever M. */
#define UNIT(M, NB, LOAD)                                                                                     \
    {                                                                                                         \
        SUMS_FROM(M, NB)                                                                                      \
        const __typeof__(*w) *wb = w + blk / GROUP * K * W + blk % GROUP * VW;                                \
        long turn = pass * SPAN, due = turn % passes;   /* several passes: a prefetch every passes-th turn */ \
        long next = k0 + SPAN + (turn + due) / passes;   /* its input (counted: dividing here cost 1.1-1.6x) */ \
        for (long k = k0; k < k1; k++, turn++) {                                                              \
            vf wv[NB];                                                                                        \
            long ahead = passes > 1 ? (due == 0 ? next++ : -1) : M >= prefetch_rows ? k + PREFETCH : -1;      \
            due = due == 0 ? passes - 1 : due - 1;                                                            \
            _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) {                                            \
                if (ahead >= 0) __builtin_prefetch(wb + ahead * ks + j * VW, 0, 3);                           \
                wv[j] = LOAD(wb + k * ks + j * VW);                                                           \
            }                                                                                                 \
            _Pragma("GCC unroll 8") for (int m = 0; m < M; m++) {                                             \
                float xs = x[m * K + k];                                                                      \
                _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) acc[m][j] += xs * wv[j];                 \
            }                                                                                                 \
        }                                                                                                     \
        SUMS_KEPT_OR_STORED(M, NB)                                                                            \
    }

/* One unit of M rows (M <= PASS_ROWS) on nb blocks: NB_FOR(M) (the most M rows take), NB_FOR(SHARED_ROWS) (every
   pass's when several share the blocks) or 1 (the few left at a group's end). */
#define ROWS(M, WT, NAME, LOAD)                                                                               \
    static void NAME##_##M(const float *restrict x, const WT *restrict w, const float *restrict b,            \
                           const float *restrict s, float *restrict y, long K, long N, long ks, long blk,     \
                           int nb, long k0, long k1, vf *restrict part, long pass, long passes) {             \
        if (nb == NB_FOR(M)) UNIT(M, NB_FOR(M), LOAD)                                                         \
        else if (nb == NB_FOR(SHARED_ROWS)) UNIT(M, NB_FOR(SHARED_ROWS), LOAD)                                \
        else UNIT(M, 1, LOAD)                                                                                 \
    }
#define ALL_ROWS(WT, NAME, LOAD)                                                                              \
    ROWS(1, WT, NAME, LOAD) ROWS(2, WT, NAME, LOAD) ROWS(3, WT, NAME, LOAD) ROWS(4, WT, NAME, LOAD)           \
    ROWS(5, WT, NAME, LOAD) ROWS(6, WT, NAME, LOAD) ROWS(7, WT, NAME, LOAD) ROWS(8, WT, NAME, LOAD)           \
    static void (*const NAME[PASS_ROWS + 1])(const float *, const WT *, const float *, const float *, float *, \
                                            long, long, long, long, int, long, long, vf *, long, long) = {    \
        0, NAME##_1, NAME##_2, NAME##_3, NAME##_4, NAME##_5, NAME##_6, NAME##_7, NAME##_8};
ALL_ROWS(float, f32_rows, load_f32)
ALL_ROWS(bf16, bf16_rows, load_bf16)
ALL_ROWS(signed char, i8_rows, load_i8)

/* Weights that are Q4_1 blocks, read as such and computed exactly as the fp32 product computes their fp32 values.
   A model dequantized from a Q4_1 file (the default model: every decoder linear) holds in each output's run of 32
   inputs w = (d * q) + m, q in 0..15, d and m fp16 values, each operation rounded to fp32 (as gguf's dequantization
   computes it). Packed as those blocks, a weight takes 0.625 bytes an entry instead of 4: per group and block of 32
   inputs, the W outputs' d, then their m (fp16, as stored), then 16 rows of W bytes, row r holding input 2r in its
   low nibble and 2r + 1 in its high one. The product rebuilds each weight exactly (q4_weights) and sums it as the
   fp32 product does: one FMA an input, in ascending order: the same bits as few_rows_linear on the fp32 weights
   (tests/test_few_rows.py), from a sixth of its bytes. */
#define Q4_RUN 32                      /* inputs a block's d and m cover */
#define Q4_BLOCK (4 * W + Q4_RUN / 2 * W)   /* a group's bytes per block of inputs */
#define Q4_AHEAD 4                     /* blocks prefetched ahead */

/* fp16 (its bits) and fp32: exact both ways for the values a block holds (few_rows_q4_1_pack checks the round trip). */
static float from_half(unsigned short h) {
    int e = h >> 10 & 31, f = h & 1023;
    float v = e == 0 ? ldexpf((float)f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexpf((float)(f | 1024), e - 25);
    return h >> 15 ? -v : v;
}

static unsigned short to_half(float v) {
    unsigned short sign = signbit(v) ? 0x8000 : 0;
    float a = fabsf(v);
    if (!(a >= 0x1p-14f)) return sign | (unsigned short)(a * 0x1p24f);   /* zero and the subnormals */
    int e;
    float fr = frexpf(a, &e);   /* a = fr 2^e, fr in [0.5, 1) */
    return sign | (unsigned short)((e + 14) << 10) | (unsigned short)((fr * 2.0f - 1.0f) * 1024.0f);
}

/* VW fp16 values widened */
static inline vf load_f16(const unsigned short *p) {
#if defined(__AVX512F__)
    return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif defined(__F16C__)
    return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    vf v;
    for (int l = 0; l < VW; l++) v[l] = from_half(p[l]);
    return v;
#endif
}

/* The VW weights of inputs k and k + 1 (a byte each: the low and the high nibble) from q, as fp32: d * q + m. The
   product is exact (d has at most 11 significant bits, q 4), so whether the compiler fuses it with the sum or not,
   the one rounding is the sum's: the value gguf's dequantization rounds twice (few_rows_q4_1_pack checks both). */
static inline void q4_weights(const unsigned char *q, vf d, vf m, vf *w0, vf *w1) {
    vi b;
#if defined(__AVX512F__)
    b = (vi)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
#elif defined(__AVX2__)
    b = (vi)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
#else
    unsigned char c[VW];
    __builtin_memcpy(c, q, VW);
    for (int l = 0; l < VW; l++) b[l] = c[l];
#endif
    *w0 = d * __builtin_convertvector(b & 15, vf) + m, *w1 = d * __builtin_convertvector(b >> 4, vf) + m;
}

#define UNIT_Q4(M, NB)                                                                                        \
    {                                                                                                         \
        SUMS_FROM(M, NB)                                                                                      \
        const unsigned char *gb = w + blk / GROUP * (K / Q4_RUN) * Q4_BLOCK;                                  \
        long lane = blk % GROUP * VW, last = (K / Q4_RUN) * Q4_BLOCK;                                         \
        int fetch = pass == 0 && (M >= prefetch_rows || passes > 1);                                          \
        for (long k32 = k0; k32 < k1; k32 += Q4_RUN) {   /* a block: its d and m widened once */              \
            const unsigned char *bb = gb + k32 / Q4_RUN * Q4_BLOCK;                                           \
            vf d[NB], m[NB];                                                                                  \
            _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) {                                            \
                const unsigned short *dm = (const unsigned short *)bb + lane + j * VW;                        \
                d[j] = load_f16(dm), m[j] = load_f16(dm + W);                                                 \
            }                                                                                                 \
            long ahead = (k32 / Q4_RUN + Q4_AHEAD) * Q4_BLOCK;   /* the block Q4_AHEAD on, a line a pair */   \
            for (long pair = 0; pair < Q4_RUN / 2; pair++) {                                                  \
                long k = k32 + 2 * pair;                                                                      \
                if (fetch)                                                                                    \
                    for (long line = pair; line < (Q4_BLOCK + 63) / 64; line += Q4_RUN / 2)                   \
                        if (ahead + line * 64 < last) __builtin_prefetch(gb + ahead + line * 64, 0, 3);       \
                vf w0[NB], w1[NB];                                                                            \
                _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++)                                          \
                    q4_weights(bb + 4 * W + pair * W + lane + j * VW, d[j], m[j], &w0[j], &w1[j]);            \
                _Pragma("GCC unroll 8") for (int r = 0; r < M; r++) {                                         \
                    float xa = x[r * K + k], xb = x[r * K + k + 1];                                           \
                    _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) acc[r][j] += xa * w0[j];             \
                    _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) acc[r][j] += xb * w1[j];             \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
        SUMS_KEPT_OR_STORED(M, NB)                                                                            \
    }
#define ROWS_Q4(M)                                                                                            \
    static void q4_rows_##M(const float *restrict x, const unsigned char *restrict w, const float *restrict b, \
                            const float *restrict s, float *restrict y, long K, long N, long ks, long blk,     \
                            int nb, long k0, long k1, vf *restrict part, long pass, long passes) {            \
        (void)ks;                                                                                             \
        if (nb == NB_FOR(M)) UNIT_Q4(M, NB_FOR(M))                                                            \
        else if (nb == NB_FOR(SHARED_ROWS)) UNIT_Q4(M, NB_FOR(SHARED_ROWS))                                   \
        else UNIT_Q4(M, 1)                                                                                    \
    }
ROWS_Q4(1) ROWS_Q4(2) ROWS_Q4(3) ROWS_Q4(4) ROWS_Q4(5) ROWS_Q4(6) ROWS_Q4(7) ROWS_Q4(8)
static void (*const q4_rows[PASS_ROWS + 1])(const float *, const unsigned char *, const float *, const float *,
                                            float *, long, long, long, long, int, long, long, vf *, long, long) = {
    0, q4_rows_1, q4_rows_2, q4_rows_3, q4_rows_4, q4_rows_5, q4_rows_6, q4_rows_7, q4_rows_8};

/* fp16's spacing at |v| (fp16 has 11 significant bits; below 2^-14 its spacing stays 2^-24). */
static float half_spacing(float v) {
    int e;
    frexpf(fabsf(v), &e);
    float u = ldexpf(1.0f, e - 11);
    return u > 0x1p-24f ? u : 0x1p-24f;
}

/* Whether d and m rebuild the run's n values exactly, with their q in 0..15 written to q: each value d * q + m both
   as gguf's dequantization computes it (the product rounded, then the sum) and fused, as the product may compute it
   (the two agree where d * q is exact, as it is for an fp16 d). */
static int q4_fits(const float *v, long n, float d, float m, unsigned char *q) {
    for (long i = 0; i < n; i++) {
        float t = d > 0.0f ? rintf((v[i] - m) / d) : 0.0f;
        if (!(t >= 0.0f && t <= 15.0f)) return 0;
        volatile float p = d * t;   /* rounded before the sum */
        float twice = p + m, fused = fmaf(d, t, m);
        if (__builtin_memcmp(&twice, v + i, 4) != 0 || __builtin_memcmp(&fused, v + i, 4) != 0) return 0;
        q[i] = (unsigned char)t;
    }
    return 1;
}

/* d and m (fp16 values) and q for one output's run of 32 inputs, or 0 where no such block gives them exactly: m is the
   run's least value (q = 0 gives it exactly), d near (largest - m) / q_top for the largest value's q. */
static int q4_block_of(const float *v, float *d, float *m, unsigned char *q) {
    float lo = v[0], hi = v[0];
    for (long i = 1; i < Q4_RUN; i++) lo = v[i] < lo ? v[i] : lo, hi = v[i] > hi ? v[i] : hi;
    if (!(lo == lo && hi == hi) || fabsf(lo) > 65504.0f || fabsf(hi) > 65504.0f) return 0;
    if (rintf(lo / half_spacing(lo)) * half_spacing(lo) != lo) return 0;   /* m must be an fp16 value */
    *m = lo;
    if (hi == lo) {
        *d = 0.0f;
        return q4_fits(v, Q4_RUN, 0.0f, lo, q);
    }
    for (int top = 15; top >= 12; top--) {
        float guess = (hi - lo) / (float)top, u = half_spacing(guess), base = rintf(guess / u) * u;
        for (int step = 0; step <= 4; step++) {
            float c = base + (float)((step + 1) / 2 * (step % 2 ? 1 : -1)) * u;
            if (c > 0.0f && c <= 65504.0f && q4_fits(v, Q4_RUN, c, lo, q)) return *d = c, 1;
        }
    }
    return 0;
}

/* The packed bytes of a weight [N, K] (row-major fp32) of Q4_1 blocks: ceil(N / W) groups of K / 32 blocks. */
long few_rows_q4_1_bytes(long K, long N) { return (N + W - 1) / W * (K / Q4_RUN) * Q4_BLOCK; }

/* Packs w [N, K] into out (few_rows_q4_1_bytes of them) as above; 1 where every output's every run of 32 inputs is a
   Q4_1 block rebuilt exactly, else 0 (out then undefined). K must be a multiple of 32. Outputs past N: zeros. */
int few_rows_q4_1_pack(const float *w, long N, long K, unsigned char *out) {
    if (K % Q4_RUN) return 0;
    long runs = K / Q4_RUN, groups = (N + W - 1) / W;
    int ok = 1;
    _Pragma("omp parallel for schedule(dynamic, 4) reduction(&& : ok)")
    for (long g = 0; g < groups; g++) {
        unsigned char q[Q4_RUN];
        for (long r = 0; r < runs && ok; r++) {
            unsigned char *blk = out + (g * runs + r) * Q4_BLOCK;
            unsigned short *d = (unsigned short *)blk, *m = d + W;
            unsigned char *nib = blk + 4 * W;
            for (long l = 0; l < W; l++) {
                long j = g * W + l;
                float dj = 0.0f, mj = 0.0f;
                if (j < N && !q4_block_of(w + j * K + r * Q4_RUN, &dj, &mj, q)) {
                    ok = 0;
                    break;
                }
                if (j >= N) __builtin_memset(q, 0, sizeof q);
                d[l] = to_half(dj), m[l] = to_half(mj);
                if (from_half(d[l]) != dj || from_half(m[l]) != mj) {   /* (not fp16 values after all) */
                    ok = 0;
                    break;
                }
                for (long p = 0; p < Q4_RUN / 2; p++) nib[p * W + l] = (unsigned char)(q[2 * p] | q[2 * p + 1] << 4);
            }
        }
    }
    return ok;
}

/* Thread t of T computes blocks lo .. hi - 1 of every product (few_rows_share gives its bytes): a group at the
   boundary between two threads' shares is read in part by each. */
#define SHARE(blocks, t, T, lo, hi) long lo = (blocks) * (t) / (T), hi = (blocks) * ((t) + 1) / (T);

/* Each thread takes a share of the blocks, a block set within a group at a time. Rows that fit one pass go over each
   set once; more rows go over it a span at a time, every pass per span, each pass's sums kept in `part` between
   spans. */
#define LINEAR(BY_ROWS)                                                                                       \
    long blocks = (N + VW - 1) / VW, passes = M <= PASS_ROWS ? 1 : (M + SHARED_ROWS - 1) / SHARED_ROWS;       \
    _Pragma("omp parallel num_threads(threads)") {                                                            \
        int t = 0, T = 1;                                                                                     \
        THREAD_IDS(t, T)                                                                                      \
        vf part[passes > 1 ? passes * SHARED_ROWS * NB_FOR(SHARED_ROWS) : 1];                                 \
        int full = passes > 1 ? NB_FOR(SHARED_ROWS) : NB_FOR(M);                                              \
        long span = passes > 1 ? SPAN : K;                                                                    \
        SHARE(blocks, t, T, lo, hi)                                                                           \
        for (long blk = lo; blk < hi;) {                                                                      \
            long room = GROUP - blk % GROUP < hi - blk ? GROUP - blk % GROUP : hi - blk;                      \
            int nb = full <= room ? full : 1;                                                                 \
            for (long k0 = 0; k0 < K; k0 += span) {                                                           \
                long k1 = k0 + span < K ? k0 + span : K;                                                      \
                for (long p = 0; p < passes; p++) {                                                           \
                    long m0 = p * SHARED_ROWS, rows = passes == 1 ? M                                         \
                                                  : M - m0 < SHARED_ROWS ? M - m0 : SHARED_ROWS;              \
                    BY_ROWS[rows](x + m0 * K, w, b, s, y + m0 * N, K, N, W, blk, nb, k0, k1,                  \
                                  part + p * SHARED_ROWS * NB_FOR(SHARED_ROWS), p, passes);                   \
                }                                                                                             \
            }                                                                                                 \
            blk += nb;                                                                                        \
        }                                                                                                     \
    }
#ifdef _OPENMP
#define THREAD_IDS(t, T) t = omp_get_thread_num(), T = omp_get_num_threads();
#else
#define THREAD_IDS(t, T)
#endif

/* w: packed as above, zeros past N; b: N floats or NULL; x, y: contiguous. */
void few_rows_linear(const float *x, const float *w, const float *b, float *y, long M, long K, long N, int threads) {
    const float *s = 0;
    LINEAR(f32_rows)
}

/* The same with bf16 weights (packed the same way). */
void few_rows_linear_bf16(const float *x, const bf16 *w, const float *b, float *y, long M, long K, long N,
                          int threads) {
    const float *s = 0;
    LINEAR(bf16_rows)
}

/* The same with Q4_1 blocks (few_rows_q4_1_pack): the bits of few_rows_linear on their fp32 values. */
void few_rows_linear_q4_1(const float *x, const unsigned char *w, const float *b, float *y, long M, long K, long N,
                          int threads) {
    const float *s = 0;
    LINEAR(q4_rows)
}

/* The scales of int8 weights packed for these products: ceil(N / W) * W floats after the blocks. */
static inline const float *i8_scales(const signed char *w, long K, long N) {
    return (const float *)(w + (N + W - 1) / W * W * K);
}

/* The same with int8 weights (packed the same way), each output's scale after the blocks (i8_scales). */
void few_rows_linear_i8(const float *x, const signed char *w, const float *b, float *y, long M, long K, long N,
                        int threads) {
    const float *s = i8_scales(w, K, N);
    LINEAR(i8_rows)
}

/* The bytes [*start, *end) of a packed weight, `group_bytes` a group, that thread t of T reads in the products
   above: a caller with other work to do first (lean_layer.c's attention) prefetches them meanwhile. */
void few_rows_share_groups(const void *w, long group_bytes, long N, int t, int T, const char **start,
                           const char **end) {
    long blocks = (N + VW - 1) / VW;
    SHARE(blocks, t, T, lo, hi)
    long first = lo / GROUP, last = hi > lo ? (hi - 1) / GROUP + 1 : first;   /* the groups its blocks lie in */
    *start = (const char *)w + first * group_bytes, *end = (const char *)w + last * group_bytes;
}

/* The same for a weight [K -> N] packed `size` bytes an entry. */
void few_rows_share(const void *w, long size, long K, long N, int t, int T, const char **start, const char **end) {
    few_rows_share_groups(w, K * W * size, N, t, T, start, end);
}

/* The index of each of M rows' largest entry in y [M, N], as torch's max picks it: the first of equal maxima, and a
   NaN above every number (the first NaN). Thread t of T scans the columns it computed in the products above, still in
   its caches; the threads' bests are merged in column order. Indices travel as floats: exact for N < 2^24. */
typedef struct { float value; long index, nan; } row_best;   /* index -1: none yet; nan: the first NaN's, or -1 */

static row_best best_in(const float *row, long lo, long hi) {
    row_best b = {-INFINITY, -1, -1};
    long j = lo;
    if (hi - lo >= VW) {
        vf best, at, idx, nan;
        __builtin_memcpy(&best, row + lo, sizeof best);   /* rows need not be aligned */
        for (int l = 0; l < VW; l++) at[l] = (float)l;
        idx = at, nan = (vf)(best != best);
        for (j = lo + VW; j + VW <= hi; j += VW) {
            vf v;
            __builtin_memcpy(&v, row + j, sizeof v);
            vi above = v > best;   /* strictly: a later equal one leaves the first */
            best = (vf)(((vi)v & above) | ((vi)best & ~above));
            idx = (vf)(((vi)(at + (float)(j - lo)) & above) | ((vi)idx & ~above));
            nan = (vf)((vi)nan | (v != v));
        }
        for (int l = 0; l < VW; l++)
            if (((vi)nan)[l]) {   /* rare: the first NaN, in order */
                for (long i = lo; i < j; i++)
                    if (row[i] != row[i]) return (row_best){0, i, i};
            }
        for (int l = 0; l < VW; l++) {
            long i = lo + (long)idx[l];
            if (b.index < 0 || best[l] > b.value || (best[l] == b.value && i < b.index)) b.value = best[l], b.index = i;
        }
    }
    for (; j < hi; j++) {
        if (row[j] != row[j]) return (row_best){0, j, j};
        if (b.index < 0 || row[j] > b.value) b.value = row[j], b.index = j;
    }
    return b;
}

/* The best of b and then c, whose columns come after b's: c wins by a larger value only, or by a NaN where b has none. */
static row_best then(row_best b, row_best c) {
    return b.nan < 0 && (c.nan >= 0 || (c.index >= 0 && (b.index < 0 || c.value > b.value))) ? c : b;
}

/* Thread t of T's columns c0 .. c1 - 1 of N outputs: those it computed in the products above. */
#define COLUMN_SHARE(N, t, T, c0, c1)                                                                         \
    SHARE(((N) + VW - 1) / VW, t, T, lo_, hi_)                                                                \
    long c0 = lo_ * VW, c1 = hi_ * VW < (N) ? hi_ * VW : (N);                                                 \
    c1 = c1 > c0 ? c1 : c0;

void few_rows_argmax(const float *y, long M, long N, int threads, long *out) {
    int most = threads > 0 ? threads : 1, used = 1;
    row_best bests[most][M];
    _Pragma("omp parallel num_threads(most)") {
        int t = 0, T = 1;
        THREAD_IDS(t, T)
        COLUMN_SHARE(N, t, T, c0, c1)
        for (long m = 0; m < M; m++) bests[t][m] = best_in(y + m * N, c0, c1);
        if (t == 0) used = T;
    }
    for (long m = 0; m < M; m++) {
        row_best b = {-INFINITY, -1, -1};
        for (int t = 0; t < used; t++) b = then(b, bests[t][m]);   /* the shares in column order */
        out[m] = b.index;
    }
}

/* The greedy choice of an output layer y = x w^T (no bias) for M rows, exactly as the argmax of the fp32 product above
   (few_rows_linear, first of equal maxima), without computing every fp32 logit: the product is computed from a copy of
   w in fewer bytes (`approx`, packed bf16 or int8, of the kind `approx_kind`), and only the outputs that copy cannot
   rule out are computed exactly. `bound` [N] holds, per output j, an upper bound of |w_j - approx_j|_2 plus the
   rounding of both products over K terms (dart_core/greedy_output.py); times |x|_2 it bounds |y_j - approx y_j|. Every
   j whose approximate logit plus its bound reaches the largest approximate logit less its bound is a candidate; the
   argmax is among them, and they are computed by this file's fp32 product (the same arithmetic, so the same bits) from
   w's own rows (w: [N, K] row-major, fp32, or bf16 (w_kind 1), widened exactly as the bf16 product widens them).
   scratch: M * N floats. A row with a NaN or an infinity anywhere takes every output exactly. candidates (may be
   NULL): how many outputs each row computed exactly. With tiles_mode 1 (AMX), 2 (its stand-in) or 3 (VNNI) an int8
   copy's product is computed from the same copy packed as tiles (int8_tiles.c; tiles_sums: each output's sum of
   weights, which VNNI reads), x written as two int8 digits per input; each row's bound then widens by |x - x~|_2
   times tiles_norm, the copy's largest row norm (rounded up). */
/* Entry `at` of a weight in fp32, or in bf16 (kind 1) widened exactly, as load_bf16 widens it. */
static inline float weight_at(const void *w, int kind, long at) {
    if (kind != 1) return ((const float *)w)[at];
    union { unsigned int u; float f; } v = {(unsigned int)((const bf16 *)w)[at] << 16};
    return v.f;
}

/* The larger of a and b in each lane, as `a > b ? a : b` (b where a is a NaN). */
static inline vf larger(vf a, vf b) {
    vi above = a > b;
    return (vf)(((vi)a & above) | ((vi)b & ~above));
}

/* The lanes of v at least f, as bits (a NaN is not). */
static inline unsigned at_least(vf v, float f) {
#if defined(__AVX512F__)
    return _mm512_cmp_ps_mask((__m512)v, _mm512_set1_ps(f), _CMP_GE_OQ);
#elif defined(__AVX2__)
    return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps((__m256)v, _mm256_set1_ps(f), _CMP_GE_OQ));
#else
    unsigned bits = 0;
    for (int l = 0; l < VW; l++) bits |= (unsigned)(v[l] >= f) << l;
    return bits;
#endif
}

/* The best of `count` outputs (indices `at`, ascending) of x . w_j computed exactly, as the fp32 product computes them:
   their rows of w, each read along, packed as the products read them. */
static row_best exact_best(const float *x, const void *w, int w_kind, long K, const long *at, int count) {
    float block[K * VW], exact[VW];
    vf part[1];
    __builtin_memset(block, 0, sizeof block);
    for (int l = 0; l < count; l++)
        for (long k = 0; k < K; k++) block[k * VW + l] = weight_at(w, w_kind, at[l] * K + k);
    f32_rows_1(x, block, 0, 0, exact, K, count, VW, 0, 1, 0, K, part, 0, 1);   /* one block, VW apart */
    row_best c = best_in(exact, 0, count);
    c.index = at[c.index], c.nan = c.nan >= 0 ? c.index : -1;
    return c;
}

/* A row's approximate logits z over columns c0 .. c1 - 1: the largest z_j less its bound, and the scale of the
   numbers for the rounding margin. VW columns at a time (a max is the same in any order: a NaN is never taken). */
typedef struct { float floor_, big, widest; int finite; } row_scan;

static row_scan scan(const float *z, const float *bound, long c0, long c1, float xn, float wide) {
    vf floor_v = (vf){} - INFINITY, big_v = (vf){}, widest_v = (vf){};
    vi finite_v = (vi){} - 1;
    long j = c0;
    for (; j + VW <= c1; j += VW) {
        vf zj, bj;
        __builtin_memcpy(&zj, z + j, sizeof zj), __builtin_memcpy(&bj, bound + j, sizeof bj);
        vf lo = zj - (xn * bj + wide), mag = (vf)((vi)zj & 0x7fffffff);
        finite_v &= mag <= 3.0e38f;   /* (false for a NaN too) */
        floor_v = larger(lo, floor_v), big_v = larger(mag, big_v), widest_v = larger(bj, widest_v);
    }
    row_scan r = {-INFINITY, 0.0f, 0.0f, xn <= 3.0e38f && wide <= 3.0e38f};
    for (int l = 0; l < VW; l++) {
        r.finite &= finite_v[l] != 0;
        r.floor_ = floor_v[l] > r.floor_ ? floor_v[l] : r.floor_;
        r.big = big_v[l] > r.big ? big_v[l] : r.big, r.widest = widest_v[l] > r.widest ? widest_v[l] : r.widest;
    }
    for (; j < c1; j++) {
        float lo = z[j] - (xn * bound[j] + wide), mag = fabsf(z[j]);
        r.finite &= mag <= 3.0e38f;
        r.floor_ = lo > r.floor_ ? lo : r.floor_;
        r.big = mag > r.big ? mag : r.big, r.widest = bound[j] > r.widest ? bound[j] : r.widest;
    }
    return r;
}

static row_scan merged(row_scan a, row_scan b) {
    return (row_scan){a.floor_ > b.floor_ ? a.floor_ : b.floor_, a.big > b.big ? a.big : b.big,
                      a.widest > b.widest ? a.widest : b.widest, a.finite && b.finite};
}

/* The best of a row's candidates among columns c0 .. c1 - 1, in ascending order, computed exactly VW at a time: every
   column whose z_j plus its bound reaches the whole row's floor (all of them in a row that is not finite). */
static row_best candidates_best(const float *x, const float *z, const float *bound, const void *w, int w_kind, long K,
                                long c0, long c1, float xn, float wide, row_scan all, long *seen) {
    const float margin = 8.0f / 16777216.0f;   /* 8 units of fp32 rounding: the float arithmetic here, and more */
    float slack = margin * (all.big + xn * all.widest + wide) * 2.0f;
    row_best b = {-INFINITY, -1, -1};
    long pending[VW];
    int count = 0;
    *seen = 0;
    for (long j = c0; j < c1; j += VW) {
        long width = c1 - j < VW ? c1 - j : VW;
        vf zj = {}, bj = {};
        if (width == VW)   /* a whole vector: one load each (a copy of a variable size is a loop) */
            __builtin_memcpy(&zj, z + j, sizeof zj), __builtin_memcpy(&bj, bound + j, sizeof bj);
        else
            __builtin_memcpy(&zj, z + j, width * 4), __builtin_memcpy(&bj, bound + j, width * 4);
        unsigned in = all.finite ? at_least(zj + (xn * bj + wide) + slack, all.floor_) : ~0u;
        for (in &= width == VW ? ~0u : (1u << width) - 1; in; in &= in - 1) {   /* rare: each lane set */
            pending[count++] = j + __builtin_ctz(in), ++*seen;
            if (count == VW) b = then(b, exact_best(x, w, w_kind, K, pending, count)), count = 0;
        }
    }
    if (count) b = then(b, exact_best(x, w, w_kind, K, pending, count));
    return b;
}

void int8_tiles_product(const float *x, const signed char *tiles, const int *sums, const float *scales, long M,
                        long K, long N, int threads, int mode, float *z, float *err);

void few_rows_choose(const float *x, const void *approx, int approx_kind, const float *bound, const void *w,
                     int w_kind, long M, long K, long N, int threads, float *scratch, long *out, long *candidates,
                     const signed char *tiles, const int *tiles_sums, float tiles_norm, int tiles_mode) {
    float widened[M];   /* what the tiles' digits add to every output's bound, per row */
    if (tiles_mode) {
        int8_tiles_product(x, tiles, tiles_sums, i8_scales(approx, K, N), M, K, N, threads, tiles_mode, scratch,
                           widened);
        for (long m = 0; m < M; m++) widened[m] = nextafterf(widened[m] * tiles_norm, INFINITY);
    } else {
        for (long m = 0; m < M; m++) widened[m] = 0.0f;
        if (approx_kind == 1)
            few_rows_linear_bf16(x, approx, 0, scratch, M, K, N, threads);
        else
            few_rows_linear_i8(x, approx, 0, scratch, M, K, N, threads);
    }
    float xn[M];
    for (long m = 0; m < M; m++) {
        double sq = 0.0;
        for (long k = 0; k < K; k++) sq += (double)x[m * K + k] * x[m * K + k];
        xn[m] = (float)(sqrt(sq) * (1.0 + 1e-6));
    }
    /* Each thread scans the columns it computed (still in its caches) for every row; the threads' scans are merged,
       then each finds and computes its columns' candidates, and their bests are merged in column order. */
    int most = threads > 0 ? threads : 1, used = 1;
    row_scan scans[most][M];
    row_best bests[most][M];
    long seen[most][M];
    _Pragma("omp parallel num_threads(most)") {
        int t = 0, T = 1;
        THREAD_IDS(t, T)
        COLUMN_SHARE(N, t, T, c0, c1)
        for (long m = 0; m < M; m++) scans[t][m] = scan(scratch + m * N, bound, c0, c1, xn[m], widened[m]);
        _Pragma("omp barrier")
        for (long m = 0; m < M; m++) {
            row_scan all = scans[0][m];
            for (int u = 1; u < T; u++) all = merged(all, scans[u][m]);
            bests[t][m] = candidates_best(x + m * K, scratch + m * N, bound, w, w_kind, K, c0, c1, xn[m], widened[m],
                                          all, &seen[t][m]);
        }
        if (t == 0) used = T;
    }
    for (long m = 0; m < M; m++) {
        row_best b = {-INFINITY, -1, -1};
        long count = 0;
        for (int t = 0; t < used; t++) b = then(b, bests[t][m]), count += seen[t][m];
        out[m] = b.index;
        if (candidates) candidates[m] = count;
    }
}

/* Outputs side by side in a packed weight (few_rows.py packs them so). */
int few_rows_width(void) { return W; }
