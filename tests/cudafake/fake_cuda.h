/* fake_cuda.h - what the fake CUDA driver (fake_cuda.c, libcuda.so.1)
 * offers the other fakes of tests/cudafake (fake_cublaslt.c, fake_nccl.c):
 * device-pointer checks, work enqueued on a stream as one device op with
 * the byte ranges it reads and writes (ordered, raced and captured like a
 * kernel), and a loud stop. Device addresses are CUdeviceptr values. */
#ifndef KILN_FAKE_CUDA_H
#define KILN_FAKE_CUDA_H

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define FAKE_API __attribute__((visibility("default")))

/* A byte range [lo, hi) of device memory an op reads (write false) or
 * writes. */
typedef struct {
    uint64_t lo, hi;
    bool write;
} FakeRange;

/* Prints "fake CUDA: MESSAGE" to stderr and ends the process with status
 * 86: every error the fakes detect stops the run loudly. */
FAKE_API _Noreturn void fakecu_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Stops the process (fakecu_die) unless [p, p + bytes) lies inside one live
 * device allocation; call names the API call, what the argument. */
FAKE_API void fakecu_check_dev(uint64_t p, uint64_t bytes, const char *call, const char *what);

/* Enqueues fn(arg) on stream s as one device op called desc that accesses
 * r[0..nr) (each checked with fakecu_check_dev). Stream order, events,
 * race detection and graph capture apply as to any launch; a captured op
 * runs again on every replay with the same arg (never freed then). Returns
 * the CUresult of the enqueue (a capture error, say). */
FAKE_API CUresult fakecu_enqueue(CUstream s, const char *desc, const FakeRange *r, int nr,
                                 void (*fn)(void *arg), void *arg);

/* fakecu_enqueue for an op that waits on another process (the fake NCCL's
 * receives): the worker starts it only once gate(arg) is true, running
 * the other streams' ops meanwhile, as a GPU runs streams side by side;
 * while every op that could start is gated it polls (gate must turn true
 * by the other process's progress, or stop the process itself). */
FAKE_API CUresult fakecu_enqueue_when(CUstream s, const char *desc, const FakeRange *r, int nr,
                                      void (*fn)(void *arg), void *arg,
                                      bool (*gate)(void *arg));

/* bf16 (the top half of an f32) to f32, and f32 to bf16 rounded to nearest
 * even (a NaN stays a NaN), as the GPU converts. */
static inline float fakecu_bf2f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t fakecu_f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000)
        return 0x7fff;
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* A seeded random number for the fakes' own choices (reproducible). */
FAKE_API uint64_t fakecu_random(void);

#endif
