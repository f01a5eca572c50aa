/* y[M, N] = x[M, K] w^T (+ b) in fp32 for few rows M: the target's linears in a decode or verify step.

   Such a product reads every weight once and does little with it, so it is bound by memory; torch's GEMMs are built
   for many rows and leave bandwidth unused at 2-16 (docs/cpu-speed.md, section 7). Here the weight is packed once
   as [ceil(N / VW), K, VW]: VW consecutive outputs side by side for each k, so one vector load of the weight feeds an
   FMA per row with x[m, k] broadcast, no horizontal sums. Each output is summed in the same order (k ascending, one
   FMA each) whatever M is, so a row's result does not depend on the rows computed with it: verifying a tree gives
   exactly the logits plain decoding gives for the same prefix (up to attention).

   Built by dart_core/machine/few_rows.py with the C compiler at hand, for the CPU at hand (VW: 16 floats with
   AVX-512, else 8); threads from OpenMP (torch's own runtime, loaded first), their number passed by the caller. */
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef __AVX512F__
#define VW 16
#define REGS 32
#else
#define VW 8
#define REGS 16
#endif
typedef float vf __attribute__((vector_size(VW * 4)));

/* Blocks of VW outputs done together: as many as the registers hold with M accumulators each (at most 8). */
#define NB_MAX(M) ((REGS - 1) / ((M) + 1))
#define NB_FOR(M) (NB_MAX(M) > 8 ? 8 : (NB_MAX(M) < 1 ? 1 : NB_MAX(M)))
#define MAX_ROWS 8    /* rows per pass; more rows take more passes over the same blocks */
#define GROUP 16      /* blocks a thread finishes for every pass before the next: their weights stay in L2 */
/* Each weight stream is prefetched this many vectors ahead: without it the products of 8-16 rows, busy computing,
   left the memory idle (on the AMX Xeon: 8 rows over 212 MB of weights 8.6 -> 7.0 ms, 1 row 6.3 -> 5.8 ms; 16 or 64
   ahead gained less, and the non-temporal hint made every product twice as slow). */
#define PREFETCH 32

static inline void store(float *restrict y, vf v, long n, long N, const float *restrict b) {
    for (int i = 0; i < VW && n + i < N; i++) y[n + i] = b ? v[i] + b[n + i] : v[i];
}

#define BLOCKS(M, NB)                                                                                         \
    {                                                                                                         \
        vf acc[M][NB];                                                                                        \
        _Pragma("GCC unroll 8") for (int m = 0; m < M; m++)                                                   \
            _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) acc[m][j] = (vf){0};                         \
        const float *wb = w + blk * K * VW;                                                                   \
        for (long k = 0; k < K; k++) {                                                                        \
            vf wv[NB];                                                                                        \
            _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) {                                            \
                __builtin_prefetch(wb + (j * K + k + PREFETCH) * VW, 0, 3);                                   \
                wv[j] = *(const vf *)(wb + (j * K + k) * VW);                                                 \
            }                                                                                                 \
            _Pragma("GCC unroll 8") for (int m = 0; m < M; m++) {                                             \
                float xs = x[m * K + k];                                                                      \
                _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) acc[m][j] += xs * wv[j];                 \
            }                                                                                                 \
        }                                                                                                     \
        for (int m = 0; m < M; m++)                                                                           \
            for (int j = 0; j < NB; j++) store(y + m * N, acc[m][j], (blk + j) * VW, N, b);                   \
    }

#define ROWS(M)                                                                                               \
    static void rows_##M(const float *restrict x, const float *restrict w, const float *restrict b,          \
                         float *restrict y, long K, long N, long first, long end) {                           \
        enum { NB = NB_FOR(M) };                                                                              \
        long blk = first;                                                                                     \
        for (; blk + NB <= end; blk += NB) BLOCKS(M, NB)                                                      \
        for (; blk < end; blk++) BLOCKS(M, 1)                                                                 \
    }
ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8)

typedef void (*rows_fn)(const float *, const float *, const float *, float *, long, long, long, long);
static const rows_fn BY_ROWS[MAX_ROWS + 1] = {0, rows_1, rows_2, rows_3, rows_4, rows_5, rows_6, rows_7, rows_8};

/* w: packed as above, zeros past N; b: N floats or NULL; x, y: contiguous. */
void few_rows_linear(const float *x, const float *w, const float *b, float *y, long M, long K, long N, int threads) {
    long blocks = (N + VW - 1) / VW;
#pragma omp parallel num_threads(threads)
    {
        int t = 0, T = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        T = omp_get_num_threads();
#endif
        long lo = blocks * t / T, hi = blocks * (t + 1) / T;
        for (long g = lo; g < hi; g += GROUP) {
            long end = g + GROUP < hi ? g + GROUP : hi;
            for (long m0 = 0; m0 < M; m0 += MAX_ROWS) {
                long rows = M - m0 < MAX_ROWS ? M - m0 : MAX_ROWS;
                BY_ROWS[rows](x + m0 * K, w, b, y + m0 * N, K, N, g, end);
            }
        }
    }
}

int few_rows_width(void) { return VW; }
