/* What the products from weights packed as tiles share (int8_tiles.c: the output copy's integer product; bf16_tiles.c:
   a bf16 model's products): the tiles' shape, the threads' shares, whether this build has AMX, AMX's configuration. */
#ifndef TILES_H
#define TILES_H
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define TILES_BUILT 1
#else
#define TILES_BUILT 0
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

/* Thread t of T (this parallel region's) computes blocks lo .. hi - 1 of a product. */
#ifdef _OPENMP
#define THREAD_SHARE(blocks, lo, hi)                                                                         \
    long lo = (blocks) * omp_get_thread_num() / omp_get_num_threads(),                                       \
         hi = (blocks) * (omp_get_thread_num() + 1) / omp_get_num_threads();
#else
#define THREAD_SHARE(blocks, lo, hi) long lo = 0, hi = (blocks);
#endif

#define TILE_N 16                        /* outputs per block */
#define TILE_BYTES 1024                  /* one packed tile of weights */
#define GROUP_ROWS 16                    /* rows of x per pass over the weights: a tile's rows */
#define AHEAD (8 * TILE_BYTES)           /* how far ahead of the tiles read the weights are prefetched */

typedef int v16i __attribute__((vector_size(64)));
typedef unsigned v16u __attribute__((vector_size(64)));

/* Whether this CPU, the build and the OS let this process use AMX (int8_tiles.c). */
int amx_tiles_usable(void);

#if TILES_BUILT
typedef struct {
    unsigned char palette, start_row, reserved[14];
    unsigned short colsb[16];
    unsigned char rows[16];
} tile_config;
#endif
#endif
