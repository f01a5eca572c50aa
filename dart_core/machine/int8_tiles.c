/* The output layer's int8 copy times x for M rows from its weights packed as tiles, where many rows cost about what
   one does (int8_tiles_product); a bf16 model's products from tiles are in bf16_tiles.c, what both share in tiles.h.

   On AMX tiles (16 rows of 64 int8 by 64 int8 of 16 outputs, summed into 16 x 16 int32 tiles): an fp32 product of the
   copy is bound by arithmetic from 8 rows; AMX makes 1 to 16 rows cost about the same, but both factors must be
   int8.

   These are the greedy choice's approximate logits (dart_core/greedy_output.py, few_rows_choose in few_rows.c). Each
   row of x is written as two int8 digits per input, x~_k = s (d1_k + d2_k / 254) with s = max|x| / 127, and the two
   integer sums c1 = d1 . q_j and c2 = d2 . q_j are exact (int32: at most 127 * 127 * K). The logit z_j = s_j s (c1 +
   c2 / 254) is then the copy's exact product with x~ (up to the rounding of the last few double operations, far
   below a float's), and x~ is off x by |x - x~|_2, which is returned per row: the caller widens its bound by that
   times the copy's largest row norm. A digit is within half a unit of its place, so |x - x~| <= 24 * max|x| / (2 *
   127 * 254) for K = 576: a few parts in ten thousand of |x|, against the int8 copy's own percent. Packed as tiles:
   [ceil(N / 16) output blocks][ceil(K / 64) input chunks][16][16 outputs][4 inputs].

   Where this build has no AMX, or the OS refuses this process its tiles, amx_tiles_usable() says 0 and the same sums
   are computed by plain C from the same tiles (the stand-in the tests run on every machine): the logits are the same
   bits either way (the sums are exact).

   A CPU with AVX-512 VNNI but no AMX (AMD's Zen 4, Intel's Ice Lake) computes the same sums from the same tiles by
   VPDPBUSD, 64 products an instruction where the FMAs on the widened copy make 16 (blocks_vnni): a tile's row of 16
   outputs by 4 inputs is one vector, each row of x's 4 digits one broadcast; one with AVX-VNNI and no AVX-512
   (Intel's client cores since Alder Lake) by its 256-bit form, two instructions a tile's row. VPDPBUSD multiplies
   unsigned bytes by signed ones, so the digits go in plus 128 and 128 times each output's sum of weights comes off:
   the same exact integers. Where the build has no VNNI, the same loop runs with the instruction written out in plain C
   (the tests run it on every machine). */
#include "tiles.h"

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define VNNI_BUILT 512   /* AVX-512 VNNI */
#elif defined(__AVXVNNI__) || defined(VNNI_256_STAND_IN)
/* AVX-VNNI: the same instruction on 256 bits, on CPUs without AVX-512 (Intel's since Alder Lake); VNNI_256_STAND_IN:
   its loop, the instruction written out (few_rows.py's avx2-vnni build where the CPU has no AVX-VNNI: the tests') */
#define VNNI_BUILT 256
#else
#define VNNI_BUILT 0
#endif

#define TILE_K 64                        /* inputs per chunk: 16 tile rows of 4 */
#define BASE 254.0                       /* the second digit's place: 1 / 254 of the first's */

int amx_tiles_usable(void) {
#if TILES_BUILT
    static int state = -1;   /* asked once per process: Linux lends AMX's state on request */
    if (state < 0) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return state;
#else
    return 0;
#endif
}

/* Row x [K] as its two digits (Kp bytes each, zeros past K) and their scale s; returns |x - x~|_2, rounded up, or
   INFINITY for a row with a NaN or an infinity (its digits are then zeros: the caller computes every output exactly).
   LANES inputs at a time in double vectors (rounded to the nearest integer by adding and taking away 1.5 * 2^52,
   exact below 2^51), the rest one by one by the same arithmetic. */
#define LANES 8
typedef double vd __attribute__((vector_size(LANES * 8)));
typedef float vf8 __attribute__((vector_size(LANES * 4)));
typedef long long vl __attribute__((vector_size(LANES * 8)));
typedef int vi8 __attribute__((vector_size(LANES * 4)));
typedef signed char vc8 __attribute__((vector_size(LANES)));
#define ROUNDER 6755399441055744.0   /* 1.5 * 2^52 */

static inline vd clamp127(vd a) {
    vl high = a > 127.0, low = a < -127.0;
    vd top = (vd){} + 127.0;
    return (vd)(((vl)top & high) | ((vl)-top & low) | ((vl)a & ~(high | low)));
}

static inline double clamp127_1(double a) { return a > 127.0 ? 127.0 : a < -127.0 ? -127.0 : a; }

static float digits(const float *x, long K, long Kp, signed char *d1, signed char *d2, double *scale) {
    memset(d1, 0, Kp), memset(d2, 0, Kp);
    float big = 0.0f;
    int finite = 1;
    vf8 big_v = {};
    vi8 finite_v = (vi8){} - 1;
    long k = 0;
    for (; k + LANES <= K; k += LANES) {   /* the largest |x| and whether every x is finite, lane by lane */
        vf8 a;
        memcpy(&a, x + k, sizeof a);
        a = (vf8)((vi8)a & 0x7fffffff);
        vi8 above = a > big_v;
        finite_v &= a <= 3.0e38f;   /* (false for a NaN too) */
        big_v = (vf8)(((vi8)a & above) | ((vi8)big_v & ~above));
    }
    for (int l = 0; l < LANES; l++) finite &= finite_v[l] != 0, big = big_v[l] > big ? big_v[l] : big;
    for (; k < K; k++) {
        float a = fabsf(x[k]);
        finite &= a <= 3.0e38f;
        big = a > big ? a : big;
    }
    *scale = 0.0;
    if (!finite) return INFINITY;
    double s = big / 127.0;
    *scale = s;
    if (s == 0.0) return 0.0f;
    /* x~ = s (a + b / 254): the error is measured against it with 1 / 254 rounded, some 1e-16 off */
    double inverse = 1.0 / s, place = 1.0 / BASE, e2 = 0.0, n2 = 0.0;
    vd err = {}, norm = {};
    for (k = 0; k + LANES <= K; k += LANES) {
        vf8 xf;
        memcpy(&xf, x + k, sizeof xf);
        vd xv = __builtin_convertvector(xf, vd), v = xv * inverse;
        vd a = clamp127((v + ROUNDER) - ROUNDER);
        vd b = clamp127(((v - a) * BASE + ROUNDER) - ROUNDER);
        vd e = xv - s * (a + b * place);   /* what the digits leave out, whatever rounding made them */
        err += e * e, norm += xv * xv;
        vc8 ac = __builtin_convertvector(__builtin_convertvector(a, vi8), vc8);
        vc8 bc = __builtin_convertvector(__builtin_convertvector(b, vi8), vc8);
        memcpy(d1 + k, &ac, sizeof ac), memcpy(d2 + k, &bc, sizeof bc);
    }
    for (int l = 0; l < LANES; l++) e2 += err[l], n2 += norm[l];
    for (; k < K; k++) {
        double xv = x[k], v = xv * inverse;
        double a = clamp127_1((v + ROUNDER) - ROUNDER), b = clamp127_1(((v - a) * BASE + ROUNDER) - ROUNDER);
        double e = xv - s * (a + b * place);
        e2 += e * e, n2 += xv * xv;
        d1[k] = (signed char)a, d2[k] = (signed char)b;
    }
    /* the doubles' own rounding is some 1e-16 of |x|: one part in a million more, and a billionth of |x| */
    return nextafterf((float)(sqrt(e2) * (1.0 + 1e-6) + 1e-9 * sqrt(n2)), INFINITY);
}

/* z[m, j] for the rows of a group and outputs blk*16 .. +15, from the two digit sums c1, c2 [rows][16] */
static void combine(const int *c1, const int *c2, const double *s, const float *scales, long rows, long blk, long N,
                    float *z) {
    long first = blk * TILE_N, width = N - first < TILE_N ? N - first : TILE_N;
    const double inverse = 1.0 / BASE;   /* its rounding, like every double operation here, is far below a float's */
    for (long m = 0; m < rows; m++) {
        const int *a = c1 + m * TILE_N, *b = c2 + m * TILE_N;
        float *out = z + m * N + first;
        for (long n = 0; n < width; n++)
            out[n] = (float)((double)scales[first + n] * s[m] * ((double)a[n] + b[n] * inverse));
    }
}

/* The stand-in: the same sums in plain C, from the same tiles. */
static void blocks_plain(const signed char *d1, const signed char *d2, long rows, long Kp, const signed char *tiles,
                         long lo, long hi, const double *s, const float *scales, long N, float *z) {
    long chunks = Kp / TILE_K;
    int c1[GROUP_ROWS * TILE_N], c2[GROUP_ROWS * TILE_N];
    for (long blk = lo; blk < hi; blk++) {
        memset(c1, 0, sizeof c1), memset(c2, 0, sizeof c2);
        for (long c = 0; c < chunks; c++) {
            const signed char *t = tiles + (blk * chunks + c) * TILE_BYTES;
            for (long m = 0; m < rows; m++)
                for (long r = 0; r < TILE_K / 4; r++)
                    for (long n = 0; n < TILE_N; n++)
                        for (long i = 0; i < 4; i++) {
                            long k = c * TILE_K + r * 4 + i;
                            int q = t[(r * TILE_N + n) * 4 + i];
                            c1[m * TILE_N + n] += d1[m * Kp + k] * q, c2[m * TILE_N + n] += d2[m * Kp + k] * q;
                        }
        }
        combine(c1, c2, s, scales, rows, blk, N, z);
    }
}

/* ------------------------------------------------------------------------------------- the same sums by VNNI */


int vnni_built(void) { return VNNI_BUILT; }   /* the vectors' bits, 0 for none */

/* VPDPBUSD's integers written out, for int vectors of type VI (VU: the unsigned of the same width): acc plus, lane by
   lane, the four products of u's bytes (unsigned) by w's (signed). */
#define DOT4_WRITTEN_OUT(acc, u, w, VI, VU)                                                                  \
    for (int i = 0; i < 4; i++) acc += (VI)(((VU)(u) >> (8 * i)) & 0xff) * ((VI)((VU)(w) << (24 - 8 * i)) >> 24);

/* acc plus, lane by lane, the four products of u's bytes (unsigned) by w's (signed): VPDPBUSD, or its integers. */
static inline v16i dot4(v16i acc, v16i u, v16i w) {
#if VNNI_BUILT == 512
    return (v16i)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)u, (__m512i)w);
#else
    DOT4_WRITTEN_OUT(acc, u, w, v16i, v16u)
    return acc;
#endif
}

#define VNNI_ROWS 6   /* rows of x per pass over two blocks of outputs: 24 sums, in registers with the weights */

/* The two digits' sums of R rows (u1, u2: digits + 128, rows Kp apart) with block a's outputs (and, `two`, block
   b's), every 64 bytes of weights loaded once for all R rows: into c1a, c2a (and c1b, c2b), [R][16], plus 128 times
   each output's sum of weights. R and two are constants where it is called: the sums stay in registers. */
static inline __attribute__((always_inline)) void vnni_pass(const int R, const int two, const unsigned char *u1,
                                                            const unsigned char *u2, long Kp, const signed char *a,
                                                            const signed char *b, const char *ahead, int *c1a,
                                                            int *c2a, int *c1b, int *c2b) {
    v16i s1a[VNNI_ROWS], s2a[VNNI_ROWS], s1b[VNNI_ROWS], s2b[VNNI_ROWS];
    for (int m = 0; m < R; m++) s1a[m] = s2a[m] = s1b[m] = s2b[m] = (v16i){0};
    for (long t = 0; t < Kp / 4; t++) {   /* a tile row: inputs 4t .. 4t + 3 of 16 outputs */
        if (ahead) __builtin_prefetch(ahead + 128 * t, 0, 3), __builtin_prefetch(ahead + 128 * t + 64, 0, 3);
        v16i wa, wb = {0};
        memcpy(&wa, a + 64 * t, sizeof wa);
        if (two) memcpy(&wb, b + 64 * t, sizeof wb);
        for (int m = 0; m < R; m++) {
            int x1, x2;
            memcpy(&x1, u1 + m * Kp + 4 * t, 4), memcpy(&x2, u2 + m * Kp + 4 * t, 4);
            v16i d1 = (v16i){0} + x1, d2 = (v16i){0} + x2;
            s1a[m] = dot4(s1a[m], d1, wa), s2a[m] = dot4(s2a[m], d2, wa);
            if (two) s1b[m] = dot4(s1b[m], d1, wb), s2b[m] = dot4(s2b[m], d2, wb);
        }
    }
    for (int m = 0; m < R; m++) {
        memcpy(c1a + m * TILE_N, &s1a[m], sizeof s1a[m]), memcpy(c2a + m * TILE_N, &s2a[m], sizeof s2a[m]);
        if (two) memcpy(c1b + m * TILE_N, &s1b[m], sizeof s1b[m]), memcpy(c2b + m * TILE_N, &s2b[m], sizeof s2b[m]);
    }
}

#define VNNI_PASS(R)                                                                                         \
    case R:                                                                                                  \
        if (two) vnni_pass(R, 1, u1, u2, Kp, a, b, ahead, c1a, c2a, c1b, c2b);                               \
        else vnni_pass(R, 0, u1, u2, Kp, a, b, ahead, c1a, c2a, c1b, c2b);                                   \
        break;

#if VNNI_BUILT == 256
typedef int v8i __attribute__((vector_size(32)));
typedef unsigned v8u __attribute__((vector_size(32)));

static inline v8i dot4_256(v8i acc, v8i u, v8i w) {   /* dot4 on 8 lanes */
#ifdef __AVXVNNI__
    return (v8i)_mm256_dpbusd_avx_epi32((__m256i)acc, (__m256i)u, (__m256i)w);
#else
    DOT4_WRITTEN_OUT(acc, u, w, v8i, v8u)
    return acc;
#endif
}

/* AVX-VNNI's 16 registers hold the sums of one row: its pass, each tile row's 64 bytes as two halves. */
static void vnni_row256(const unsigned char *u1, const unsigned char *u2, long Kp, const signed char *a,
                        const signed char *b, int two, const char *ahead, int *c1a, int *c2a, int *c1b, int *c2b) {
    v8i s[8] = {{0}};   /* [block a, b][digit 1, 2][half] */
    for (long t = 0; t < Kp / 4; t++) {
        if (ahead) __builtin_prefetch(ahead + 128 * t, 0, 3), __builtin_prefetch(ahead + 128 * t + 64, 0, 3);
        int x1, x2;
        memcpy(&x1, u1 + 4 * t, 4), memcpy(&x2, u2 + 4 * t, 4);
        v8i d1 = (v8i){0} + x1, d2 = (v8i){0} + x2, w0, w1;
        for (int blk = 0; blk < (two ? 2 : 1); blk++) {
            const signed char *w = (blk ? b : a) + 64 * t;
            memcpy(&w0, w, sizeof w0), memcpy(&w1, w + 32, sizeof w1);
            v8i *acc = s + 4 * blk;
            acc[0] = dot4_256(acc[0], d1, w0), acc[1] = dot4_256(acc[1], d1, w1);
            acc[2] = dot4_256(acc[2], d2, w0), acc[3] = dot4_256(acc[3], d2, w1);
        }
    }
    int *out[4] = {c1a, c2a, c1b, c2b};
    for (int i = 0; i < (two ? 4 : 2); i++)
        memcpy(out[i], &s[2 * i], sizeof s[0]), memcpy(out[i] + 8, &s[2 * i + 1], sizeof s[0]);
}
#endif

static void vnni_rows(int R, int two, const unsigned char *u1, const unsigned char *u2, long Kp, const signed char *a,
                      const signed char *b, const char *ahead, int *c1a, int *c2a, int *c1b, int *c2b) {
#if VNNI_BUILT == 256
    for (int m = 0; m < R; m++)
        vnni_row256(u1 + m * Kp, u2 + m * Kp, Kp, a, b, two, m ? NULL : ahead, c1a + m * TILE_N, c2a + m * TILE_N,
                    c1b + m * TILE_N, c2b + m * TILE_N);
#else
    switch (R) { VNNI_PASS(1) VNNI_PASS(2) VNNI_PASS(3) VNNI_PASS(4) VNNI_PASS(5) VNNI_PASS(6) }
#endif
}

/* The blocks lo .. hi - 1 for the rows of a group (u1, u2: their digits + 128), two blocks at a time; sums: each
   output's sum of weights (amx_tiles.tile_sums), what the digits' 128 added, taken off exactly. */
static void blocks_vnni(const unsigned char *u1, const unsigned char *u2, long rows, long Kp, const signed char *tiles,
                        const int *sums, long lo, long hi, const double *s, const float *scales, long N, float *z) {
    long chunks = Kp / TILE_K;
    int c[4][GROUP_ROWS * TILE_N];
    for (long blk = lo; blk < hi; blk += 2) {
        int two = blk + 1 < hi;
        const signed char *a = tiles + blk * chunks * TILE_BYTES, *b = a + chunks * TILE_BYTES;
        /* the first pass fetches the next two blocks while it computes (the rest read these from the caches) */
        const char *next = blk + 2 < hi ? (const char *)(a + 2 * chunks * TILE_BYTES) : NULL;
        for (long m0 = 0; m0 < rows; m0 += VNNI_ROWS) {
            int R = rows - m0 < VNNI_ROWS ? (int)(rows - m0) : VNNI_ROWS;
            long at = m0 * TILE_N;
            vnni_rows(R, two, u1 + m0 * Kp, u2 + m0 * Kp, Kp, a, b, m0 ? NULL : next, c[0] + at, c[1] + at,
                      c[2] + at, c[3] + at);
        }
        for (int p = 0; p < (two ? 2 : 1); p++) {
            const int *sum = sums + (blk + p) * TILE_N;
            for (long m = 0; m < rows; m++)
                for (int n = 0; n < TILE_N; n++)
                    c[2 * p][m * TILE_N + n] -= 128 * sum[n], c[2 * p + 1][m * TILE_N + n] -= 128 * sum[n];
            combine(c[2 * p], c[2 * p + 1], s, scales, rows, blk + p, N, z);
        }
    }
}

#if TILES_BUILT
/* Tiles 0-3: the sums of two blocks by each digit; 4, 5: the digits of a chunk; 6, 7: the two blocks' weights. */
static void blocks_amx(const signed char *d1, const signed char *d2, long rows, long Kp, const signed char *tiles,
                       long lo, long hi, const double *s, const float *scales, long N, float *z) {
    long chunks = Kp / TILE_K;
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = t < 6 ? (unsigned char)rows : 16;
    _tile_loadconfig(&cfg);
    int c[4][GROUP_ROWS * TILE_N];
    const char *next = (const char *)(tiles + lo * chunks * TILE_BYTES);
    const char *end = (const char *)(tiles + hi * chunks * TILE_BYTES);
    for (long l = 0; l < AHEAD && next + l < end; l += 64) __builtin_prefetch(next + l, 0, 3);   /* the start */
    next += AHEAD;
    for (long blk = lo; blk < hi; blk += 2) {
        int two = blk + 1 < hi;
        const signed char *a = tiles + blk * chunks * TILE_BYTES, *b = a + chunks * TILE_BYTES;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (long k = 0; k < chunks; k++) {
            for (int l = 0; l < (two ? 2 : 1) * TILE_BYTES; l += 64) __builtin_prefetch(next + l, 0, 3);
            next += (two ? 2 : 1) * TILE_BYTES;
            _tile_loadd(4, d1 + k * TILE_K, Kp);
            _tile_loadd(5, d2 + k * TILE_K, Kp);
            _tile_loadd(6, a + k * TILE_BYTES, 64);
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 5, 6);
            if (two) {
                _tile_loadd(7, b + k * TILE_BYTES, 64);
                _tile_dpbssd(2, 4, 7);
                _tile_dpbssd(3, 5, 7);
            }
        }
        _tile_stored(0, c[0], 64);
        _tile_stored(1, c[1], 64);
        combine(c[0], c[1], s, scales, rows, blk, N, z);
        if (two) {
            _tile_stored(2, c[2], 64);
            _tile_stored(3, c[3], 64);
            combine(c[2], c[3], s, scales, rows, blk + 1, N, z);
        }
    }
    _tile_release();
}
#endif

/* z [M, N] = the copy's logits for x [M, K] (fp32) by two digits per input, from `tiles` (packed as above) and the
   copy's scales [N]; err [M]: |x - x~|_2 per row, rounded up. mode: TILES_AMX (AMX where usable, else the stand-in),
   TILES_PLAIN (the stand-in) or TILES_VNNI (by VNNI, which reads sums: each output's sum of weights). */
enum { TILES_AMX = 1, TILES_PLAIN = 2, TILES_VNNI = 3 };   /* amx_tiles.MODES */

void int8_tiles_product(const float *x, const signed char *tiles, const int *sums, const float *scales, long M,
                        long K, long N, int threads, int mode, float *z, float *err) {
    long Kp = (K + TILE_K - 1) / TILE_K * TILE_K, blocks = (N + TILE_N - 1) / TILE_N;
    signed char *d = malloc(2 * M * Kp);
    double *s = malloc(M * sizeof(double));
    if (!d || !s) {   /* no memory for a few kilobytes: every output is then computed exactly */
        for (long m = 0; m < M; m++) err[m] = INFINITY;
        memset(z, 0, M * N * sizeof(float));
        free(d), free(s);
        return;
    }
    signed char *d1 = d, *d2 = d + M * Kp;
    for (long m = 0; m < M; m++) err[m] = digits(x + m * K, K, Kp, d1 + m * Kp, d2 + m * Kp, s + m);
    if (mode == TILES_VNNI)   /* the digits as unsigned bytes, plus 128 */
        for (long i = 0; i < 2 * M * Kp; i++) d[i] = (signed char)((unsigned char)d[i] ^ 0x80);
    int amx = mode == TILES_AMX && amx_tiles_usable();
    _Pragma("omp parallel num_threads(threads)") {
        THREAD_SHARE(blocks, lo, hi)
        for (long m0 = 0; m0 < M; m0 += GROUP_ROWS) {
            long rows = M - m0 < GROUP_ROWS ? M - m0 : GROUP_ROWS;
            const signed char *g1 = d1 + m0 * Kp, *g2 = d2 + m0 * Kp;
            if (mode == TILES_VNNI) {
                blocks_vnni((const unsigned char *)g1, (const unsigned char *)g2, rows, Kp, tiles, sums, lo, hi,
                            s + m0, scales, N, z + m0 * N);
                continue;
            }
#if TILES_BUILT
            if (amx) {
                blocks_amx(g1, g2, rows, Kp, tiles, lo, hi, s + m0, scales, N, z + m0 * N);
                continue;
            }
#endif
            blocks_plain(g1, g2, rows, Kp, tiles, lo, hi, s + m0, scales, N, z + m0 * N);
        }
    }
    (void)amx;
    free(d), free(s);
}
