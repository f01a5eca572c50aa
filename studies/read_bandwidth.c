/* The machine's read bandwidth, the ceiling of a one-row product: `bytes` bytes summed by `threads` threads, each its
   share in one pass of vector loads, as our few-row kernel reads the weights; on huge pages where `huge` (as
   dart_core/machine/huge_pages.py asks for them). Built and run by studies/ceilings.py. Returns the best seconds of
   `rounds` passes after one warm-up. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef float vf __attribute__((vector_size(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

double read_seconds(long bytes, int threads, int rounds, int huge, float *checksum) {
    long n = bytes / sizeof(vf), page = 2L << 20, size = (n * (long)sizeof(vf) + page - 1) / page * page;
    vf *a = aligned_alloc(page, size);
    if (!a) return -1.0;
    if (huge) madvise(a, size, MADV_HUGEPAGE);
    memset(a, 0, n * sizeof(vf));
    double best = 1e30;
    float total = 0.0f;
    for (int r = 0; r <= rounds; r++) {
        double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            long t = omp_get_thread_num(), T = omp_get_num_threads(), lo = n * t / T, hi = n * (t + 1) / T;
            vf acc[4] = {{0}};   /* four independent sums: the loads, not the additions, set the pace */
            for (long i = lo; i + 4 <= hi; i += 4)
                for (int j = 0; j < 4; j++) acc[j] += a[i + j];
            vf s = acc[0] + acc[1] + acc[2] + acc[3];
            for (int l = 0; l < 16; l++) total += s[l];
        }
        double dt = now() - t0;
        if (r && dt < best) best = dt;
    }
    free(a);
    *checksum = total;
    return best;
}
