/* A bf16 model's linears (lean_layer.c's BF16_TILES weights): y = bf16(x) w^T (+ b), from weights packed as tiles
   (what the output copy's int8 product shares with these: tiles.h). The weight is packed as tiles of 16 outputs by 32
   inputs, [ceil(N / 16)][ceil(K / 32)][16 input pairs][16 outputs][2] (zeros past the edges); each row of x is rounded
   to bf16 (to nearest, ties to even) and on AMX TDPBF16PS sums its products with the weights into fp32: every row of
   x alone, in the same order whatever rows come with it, so a tree's rows get what a one-row step gets. Unlike the
   FMAs on the widened weights (fp32 x), x is rounded to bf16 first, as a bf16 model's products in torch are; 16 rows
   cost hardly more than one. Where AMX is not usable the stand-in computes
   the same products in plain C, input by input in ascending order, each addition rounded, inputs and results below
   fp32's normal range taken as zero, as AMX takes them. AMX's own order of additions is not documented: its sums can
   differ from the stand-in's in the last bits (the tests bound both by fp32's rounding of the exact sum).

   A CPU with AVX512-BF16 but no AMX (AMD's Zen 4 and Zen 5) computes the same products from the same tiles by
   VDPBF16PS (bf16_blocks_dots): a tile's row of 16 outputs by an input pair is one vector, a row of x's pair one
   broadcast, 32 products an instruction where the FMAs on the widened weights make 16 (and first widen each weight).
   Each row is still summed alone, in one order whatever rows come with it. Where the build has no AVX512-BF16 the
   same loop runs with the instruction's arithmetic written out in C (the tests run it on every machine).

   (A bf16 model's linears on AMX with x as three exact bf16 parts, which would have kept their products those of fp32
   x, were tried: on the AMX Xeon no faster than the fp32 FMAs on widened bf16 weights at 1 to 16 rows, the parts'
   tiles reloaded for every block of outputs. bf16_tiles_linear rounds x to bf16 once.) */
#include "tiles.h"

#define PAIR_K 32          /* inputs per tile: 16 tile rows of 2 */
enum { BF16_AMX = 1, BF16_PLAIN = 2, BF16_DOTS = 3 };   /* the ways (amx_tiles.BF16_WAYS) */

static inline unsigned short bf16_of(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);   /* a NaN stays one */
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float flushed(float f) {   /* below the normal range: zero, its sign kept */
    unsigned u;
    memcpy(&u, &f, 4);
    if (!(u & 0x7f800000u)) u &= 0x80000000u;
    memcpy(&f, &u, 4);
    return f;
}

static inline float widened(unsigned short h) {
    unsigned u = (unsigned)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return flushed(f);
}

/* y's outputs of block blk for `rows` rows from their sums c [rows][16], plus the bias b (N floats or NULL). */
static void bf16_store(const float *c, long rows, long blk, long N, const float *b, float *y) {
    long first = blk * TILE_N, width = N - first < TILE_N ? N - first : TILE_N;
    for (long m = 0; m < rows; m++)
        for (long n = 0; n < width; n++) y[m * N + first + n] = c[m * TILE_N + n] + (b ? b[first + n] : 0.0f);
}

/* The stand-in: the rows' sums for blocks lo .. hi - 1, input by input. */
static void bf16_blocks_plain(const unsigned short *xa, long rows, long Kp, const unsigned short *tiles, long lo,
                              long hi, long N, const float *b, float *y) {
    long chunks = Kp / PAIR_K;
    for (long blk = lo; blk < hi; blk++) {
        float c[GROUP_ROWS * TILE_N] = {0};
        for (long ch = 0; ch < chunks; ch++) {
            const unsigned short *t = tiles + (blk * chunks + ch) * (TILE_BYTES / 2);
            for (long m = 0; m < rows; m++)
                for (long n = 0; n < TILE_N; n++) {
                    float acc = c[m * TILE_N + n];
                    for (long r = 0; r < PAIR_K / 2; r++)
                        for (int i = 0; i < 2; i++) {
                            float a = widened(xa[m * Kp + ch * PAIR_K + 2 * r + i]);
                            acc = flushed(acc + a * widened(t[(r * TILE_N + n) * 2 + i]));
                        }
                    c[m * TILE_N + n] = acc;
                }
        }
        bf16_store(c, rows, blk, N, b, y);
    }
}

#if TILES_BUILT
/* Tiles 0, 1: two blocks' sums; 4: the rows' inputs of a chunk; 6, 7: the two blocks' weights. */
static void bf16_blocks_amx(const unsigned short *xa, long rows, long Kp, const unsigned short *tiles, long lo,
                            long hi, long N, const float *b, float *y) {
    long chunks = Kp / PAIR_K;
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = (t < 2 || t == 4) ? (unsigned char)rows : 16;
    _tile_loadconfig(&cfg);
    float c[2][GROUP_ROWS * TILE_N];
    const char *next = (const char *)(tiles + lo * chunks * (TILE_BYTES / 2));
    const char *end = (const char *)(tiles + hi * chunks * (TILE_BYTES / 2));
    for (long l = 0; l < AHEAD && next + l < end; l += 64) __builtin_prefetch(next + l, 0, 3);
    next += AHEAD;
    for (long blk = lo; blk < hi; blk += 2) {
        int two = blk + 1 < hi;
        const unsigned short *wa = tiles + blk * chunks * (TILE_BYTES / 2), *wb = wa + chunks * (TILE_BYTES / 2);
        _tile_zero(0);
        _tile_zero(1);
        for (long k = 0; k < chunks; k++) {
            for (int l = 0; l < (two ? 2 : 1) * TILE_BYTES; l += 64) __builtin_prefetch(next + l, 0, 3);
            next += (two ? 2 : 1) * TILE_BYTES;
            _tile_loadd(4, xa + k * PAIR_K, Kp * 2);
            _tile_loadd(6, wa + k * (TILE_BYTES / 2), 64);
            _tile_dpbf16ps(0, 4, 6);
            if (two) {
                _tile_loadd(7, wb + k * (TILE_BYTES / 2), 64);
                _tile_dpbf16ps(1, 4, 7);
            }
        }
        _tile_stored(0, c[0], 64);
        if (two) _tile_stored(1, c[1], 64);
        for (int p = 0; p < (two ? 2 : 1); p++) bf16_store(c[p], rows, blk + p, N, b, y);
    }
    _tile_release();
}
#endif

/* ---------------------------------------------------------------------- the same products by AVX512-BF16 */

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define DOTS_BUILT 1
#else
#define DOTS_BUILT 0
#endif

int bf16_dots_built(void) { return DOTS_BUILT; }

typedef float v16f __attribute__((vector_size(64)));

#if !DOTS_BUILT
static inline v16f flushed16(v16f f) {   /* flushed, lane by lane */
    v16u u = (v16u)f;
    return (v16f)(u & ((v16u)((u & 0x7f800000u) != 0) | 0x80000000u));
}
#endif

/* acc plus, lane by lane, the two products of x's bf16 pair with w's: VDPBF16PS, or its arithmetic written out as
   Intel's manual gives it (the pair's second product first, each addition rounded once, inputs and results below
   fp32's normal range taken as zero; a product of two bf16 is exact in fp32). */
static inline v16f dot2(v16f acc, v16u x, v16u w) {
#if DOTS_BUILT
    return (v16f)_mm512_dpbf16_ps((__m512)acc, (__m512bh)x, (__m512bh)w);
#else
    for (int second = 1; second >= 0; second--) {
        v16u xs = second ? x & 0xffff0000u : x << 16, ws = second ? w & 0xffff0000u : w << 16;
        acc = flushed16(acc + flushed16((v16f)xs) * flushed16((v16f)ws));
    }
    return acc;
#endif
}

#define DOT_ROWS 8   /* rows of x per pass over two blocks of outputs: 16 sums, in registers with the weights */

/* The sums of R rows (x: their bf16 pairs, `pairs` apart) with block a's outputs (and, `two`, block b's), each
   tile row's 64 bytes loaded once for all R rows: into ca (and cb), [R][16]. R and two are constants where it is
   called: the sums stay in registers. */
static inline __attribute__((always_inline)) void dots_pass(const int R, const int two, const unsigned *x, long pairs,
                                                            const unsigned *a, const unsigned *b, const char *ahead,
                                                            float *ca, float *cb) {
    v16f sa[DOT_ROWS], sb[DOT_ROWS];
    for (int m = 0; m < R; m++) sa[m] = sb[m] = (v16f){0};
    for (long t = 0; t < pairs; t++) {   /* a tile row: input pair t of 16 outputs */
        if (ahead) __builtin_prefetch(ahead + 128 * t, 0, 3), __builtin_prefetch(ahead + 128 * t + 64, 0, 3);
        v16u wa, wb = {0};
        memcpy(&wa, a + TILE_N * t, sizeof wa);
        if (two) memcpy(&wb, b + TILE_N * t, sizeof wb);
        for (int m = 0; m < R; m++) {
            v16u xv = (v16u){0} + x[m * pairs + t];
            sa[m] = dot2(sa[m], xv, wa);
            if (two) sb[m] = dot2(sb[m], xv, wb);
        }
    }
    for (int m = 0; m < R; m++) {
        memcpy(ca + m * TILE_N, &sa[m], sizeof sa[m]);
        if (two) memcpy(cb + m * TILE_N, &sb[m], sizeof sb[m]);
    }
}

#define DOTS_PASS(R)                                                                                         \
    case R:                                                                                                  \
        if (two) dots_pass(R, 1, x, pairs, a, b, ahead, ca, cb);                                             \
        else dots_pass(R, 0, x, pairs, a, b, ahead, ca, cb);                                                 \
        break;

/* The blocks lo .. hi - 1 for the rows of a group (xa: their inputs in bf16), two blocks at a time. */
static void bf16_blocks_dots(const unsigned short *xa, long rows, long Kp, const unsigned short *tiles, long lo,
                             long hi, long N, const float *bias, float *y) {
    long chunks = Kp / PAIR_K, pairs = Kp / 2, block = chunks * (TILE_BYTES / 2);
    float c[2][GROUP_ROWS * TILE_N];
    for (long blk = lo; blk < hi; blk += 2) {
        int two = blk + 1 < hi;
        const unsigned *a = (const unsigned *)(tiles + blk * block), *b = (const unsigned *)(tiles + (blk + 1) * block);
        /* the first pass fetches the next two blocks while it computes (the rest read these from the caches) */
        const char *next = blk + 2 < hi ? (const char *)(tiles + (blk + 2) * block) : NULL;
        for (long m0 = 0; m0 < rows; m0 += DOT_ROWS) {
            int R = rows - m0 < DOT_ROWS ? (int)(rows - m0) : DOT_ROWS;
            const unsigned *x = (const unsigned *)(xa + m0 * Kp);
            const char *ahead = m0 ? NULL : next;
            float *ca = c[0] + m0 * TILE_N, *cb = c[1] + m0 * TILE_N;
            switch (R) { DOTS_PASS(1) DOTS_PASS(2) DOTS_PASS(3) DOTS_PASS(4) DOTS_PASS(5) DOTS_PASS(6) DOTS_PASS(7)
                         DOTS_PASS(8) }
        }
        for (int p = 0; p < (two ? 2 : 1); p++) bf16_store(c[p], rows, blk + p, N, bias, y);
    }
}

/* y [M, N] = bf16(x) [M, K] times the tiles' weight (+ b: N floats or NULL), the way `way` says: BF16_AMX (on AMX
   where usable, else by the stand-in), BF16_PLAIN (the stand-in) or BF16_DOTS (by AVX512-BF16, its arithmetic
   written out where the build has none). x, y contiguous. */
void bf16_tiles_linear(const float *x, const unsigned short *tiles, const float *b, float *y, long M, long K, long N,
                       int threads, int way) {
    long Kp = (K + PAIR_K - 1) / PAIR_K * PAIR_K, blocks = (N + TILE_N - 1) / TILE_N;
    unsigned short *xa = malloc(M * Kp * sizeof(unsigned short));
    if (!xa) {   /* no memory for a few kilobytes: the outputs are NaN, not what was in y */
        for (long i = 0; i < M * N; i++) y[i] = NAN;
        return;
    }
    for (long m = 0; m < M; m++)
        for (long k = 0; k < Kp; k++) xa[m * Kp + k] = k < K ? bf16_of(x[m * K + k]) : 0;
    int amx = way == BF16_AMX && amx_tiles_usable();
    _Pragma("omp parallel num_threads(threads)") {
        THREAD_SHARE(blocks, lo, hi)
        for (long m0 = 0; m0 < M; m0 += GROUP_ROWS) {
            long rows = M - m0 < GROUP_ROWS ? M - m0 : GROUP_ROWS;
            if (way == BF16_DOTS) {
                bf16_blocks_dots(xa + m0 * Kp, rows, Kp, tiles, lo, hi, N, b, y + m0 * N);
                continue;
            }
#if TILES_BUILT
            if (amx) {
                bf16_blocks_amx(xa + m0 * Kp, rows, Kp, tiles, lo, hi, N, b, y + m0 * N);
                continue;
            }
#endif
            bf16_blocks_plain(xa + m0 * Kp, rows, Kp, tiles, lo, hi, N, b, y + m0 * N);
        }
    }
    free(xa);
}

/* The bytes [*start, *end) of a tiles' weight [K -> N] that thread t of T reads in bf16_tiles_linear. */
void bf16_tiles_share(const void *tiles, long K, long N, int t, int T, const char **start, const char **end) {
    long chunks = (K + PAIR_K - 1) / PAIR_K, blocks = (N + TILE_N - 1) / TILE_N;
    long lo = blocks * t / T, hi = blocks * (t + 1) / T;
    *start = (const char *)tiles + lo * chunks * TILE_BYTES, *end = (const char *)tiles + hi * chunks * TILE_BYTES;
}
