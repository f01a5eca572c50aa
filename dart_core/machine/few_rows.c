/* y[M, N] = x[M, K] w^T (+ b) in fp32 for few rows M: the target's linears in a decode or verify step.

   Such a product reads every weight once and does little with it, so it is bound by memory; torch's GEMMs are built
   for many rows and leave bandwidth unused at 2-16 (docs/cpu-speed.md, section 7). Here the weight is packed once
   as [ceil(N / VW), K, VW]: VW consecutive outputs side by side for each k, so one vector load of the weight feeds an
   FMA per row with x[m, k] broadcast, no horizontal sums. Each output is summed in the same order (k ascending, one
   FMA each) whatever M is, so a row's result does not depend on the rows computed with it: verifying a tree gives
   exactly the logits plain decoding gives for the same prefix (up to attention).

   The same product reads bf16 weights too (few_rows_linear_bf16: a bf16 model's, the draft head's): each is widened
   to fp32 exactly (its 16 bits become the top half of a float) as it is loaded, so it reads half the bytes and
   computes as the fp32 product does on the widened weights. And int8 weights with a scale per output
   (few_rows_linear_i8, the draft head's where that drafts faster): a quarter of the bytes, the scale applied once to
   each output's sum.

   Built by dart_core/machine/few_rows.py with the C compiler at hand, for the CPU at hand (VW: 16 floats with
   AVX-512, else 8); threads from OpenMP (torch's own runtime, loaded first), their number passed by the caller. */
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

/* Blocks of VW outputs done together: as many as the registers hold with M accumulators each (at most 8). */
#define NB_MAX(M) ((REGS - 1) / ((M) + 1))
#define NB_FOR(M) (NB_MAX(M) > 8 ? 8 : (NB_MAX(M) < 1 ? 1 : NB_MAX(M)))
#define MAX_ROWS 8    /* rows per pass; more rows take more passes over the same blocks */
#define GROUP 16      /* blocks a thread finishes for every pass before the next: their weights stay in L2 */
/* Each weight stream is prefetched this many vectors ahead: without it the products of 8-16 rows, busy computing,
   left the memory idle (on the AMX Xeon: 8 rows over 212 MB of weights 8.6 -> 7.0 ms, 1 row 6.3 -> 5.8 ms; 16 or 64
   ahead gained less, and the non-temporal hint made every product twice as slow). */
#define PREFETCH 32

/* y[n..] = v (times the outputs' scales s where the weights are int8) (+ b) */
static inline void store(float *restrict y, vf v, long n, long N, const float *restrict b, const float *restrict s) {
    for (int i = 0; i < VW && n + i < N; i++) {
        float out = s ? v[i] * s[n + i] : v[i];
        y[n + i] = b ? out + b[n + i] : out;
    }
}

#define BLOCKS(M, NB, LOAD)                                                                                         \
    {                                                                                                         \
        vf acc[M][NB];                                                                                        \
        _Pragma("GCC unroll 8") for (int m = 0; m < M; m++)                                                   \
            _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) acc[m][j] = (vf){0};                         \
        const __typeof__(*w) *wb = w + blk * K * VW;                                                          \
        for (long k = 0; k < K; k++) {                                                                        \
            vf wv[NB];                                                                                        \
            _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) {                                            \
                __builtin_prefetch(wb + (j * K + k + PREFETCH) * VW, 0, 3);                                   \
                wv[j] = LOAD(wb + (j * K + k) * VW);                                                          \
            }                                                                                                 \
            _Pragma("GCC unroll 8") for (int m = 0; m < M; m++) {                                             \
                float xs = x[m * K + k];                                                                      \
                _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) acc[m][j] += xs * wv[j];                 \
            }                                                                                                 \
        }                                                                                                     \
        for (int m = 0; m < M; m++)                                                                           \
            for (int j = 0; j < NB; j++) store(y + m * N, acc[m][j], (blk + j) * VW, N, b, s);                \
    }

#define ROWS(M, WT, NAME, LOAD)                                                                               \
    static void NAME##_##M(const float *restrict x, const WT *restrict w, const float *restrict b,            \
                           const float *restrict s, float *restrict y, long K, long N, long first, long end) {\
        enum { NB = NB_FOR(M) };                                                                              \
        long blk = first;                                                                                     \
        for (; blk + NB <= end; blk += NB) BLOCKS(M, NB, LOAD)                                                \
        for (; blk < end; blk++) BLOCKS(M, 1, LOAD)                                                           \
    }
#define ALL_ROWS(WT, NAME, LOAD)                                                                              \
    ROWS(1, WT, NAME, LOAD) ROWS(2, WT, NAME, LOAD) ROWS(3, WT, NAME, LOAD) ROWS(4, WT, NAME, LOAD)           \
    ROWS(5, WT, NAME, LOAD) ROWS(6, WT, NAME, LOAD) ROWS(7, WT, NAME, LOAD) ROWS(8, WT, NAME, LOAD)           \
    static void (*const NAME[MAX_ROWS + 1])(const float *, const WT *, const float *, const float *, float *,  \
                                           long, long, long, long) = {0,        NAME##_1, NAME##_2, NAME##_3, \
                                                                      NAME##_4, NAME##_5, NAME##_6, NAME##_7, \
                                                                      NAME##_8};
ALL_ROWS(float, f32_rows, load_f32)
ALL_ROWS(bf16, bf16_rows, load_bf16)
ALL_ROWS(signed char, i8_rows, load_i8)

/* Each thread takes a share of the blocks and, GROUP blocks at a time, every pass of MAX_ROWS rows over them. */
#define LINEAR(BY_ROWS)                                                                                       \
    long blocks = (N + VW - 1) / VW;                                                                          \
    _Pragma("omp parallel num_threads(threads)") {                                                            \
        int t = 0, T = 1;                                                                                     \
        THREAD_IDS(t, T)                                                                                      \
        long lo = blocks * t / T, hi = blocks * (t + 1) / T;                                                  \
        for (long g = lo; g < hi; g += GROUP) {                                                               \
            long end = g + GROUP < hi ? g + GROUP : hi;                                                       \
            for (long m0 = 0; m0 < M; m0 += MAX_ROWS) {                                                       \
                long rows = M - m0 < MAX_ROWS ? M - m0 : MAX_ROWS;                                            \
                BY_ROWS[rows](x + m0 * K, w, b, s, y + m0 * N, K, N, g, end);                                 \
            }                                                                                                 \
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

/* The same with int8 weights (packed the same way), each output's scale after the blocks: ceil(N / VW) * VW floats at
   w + ceil(N / VW) * VW * K. */
void few_rows_linear_i8(const float *x, const signed char *w, const float *b, float *y, long M, long K, long N,
                        int threads) {
    const float *s = (const float *)(w + (N + VW - 1) / VW * VW * K);
    LINEAR(i8_rows)
}

int few_rows_width(void) { return VW; }
