/*
 * cuda_emu.h - the CUDA execution model on the CPU, for tests. A kernel
 * source written for NVRTC compiles unchanged with the host C++ compiler
 * when this header is force-included (g++ -x c++ -include cuda_emu.h) and is
 * linked with emu_runtime.cpp; the launcher (emu.h) runs its grid.
 *
 * What is modelled, and how:
 *   - every CUDA thread is a user-level thread with its own stack; the
 *     threads of a block run one at a time and switch only at __syncthreads,
 *     __syncwarp and warp collectives (shuffles, votes), in an order that is
 *     redrawn after every barrier; so a missing barrier, a read of shared
 *     memory before its writer ran, or a shuffle over wrong lanes gives wrong
 *     values, and a barrier not reached by every thread is reported;
 *   - __syncthreads_or/_and/_count are such barriers that also combine a
 *     predicate of every thread of the block (each thread gets the result
 *     of all, as on the hardware);
 *   - blocks run one after another; __shared__ variables (static ones and the
 *     dynamic `extern __shared__` array) are per block and are filled with
 *     the pattern 0x7fc07fc0 (NaN as f32, bf16 and f16) before each block;
 *   - warp shuffles, votes and __syncwarp exchange real values among the
 *     lanes named by the mask, which must all reach the same operation;
 *   - atomics are exact (the threads of the emulator never run at once);
 *   - bf16 and f16 with the hardware's rounding (to nearest even; NaN gives
 *     the canonical 0x7fff); arithmetic on them is exact, then rounded once;
 *   - the fast intrinsics (__expf, __fdividef, ...) are computed exactly: the
 *     emulator is at least as accurate as the hardware, never less.
 * Anything not declared here is a compile error: there is no fallback.
 * This header includes no system header, so a kernel's own typedefs (for
 * example of int64_t) do not clash with the host's.
 */
#ifndef KILN_CUDA_EMU_H
#define KILN_CUDA_EMU_H

#ifndef __cplusplus
#error "cuda_emu.h: compile CUDA sources as C++ (g++ -x c++ -include cuda_emu.h)"
#endif

/* ---- qualifiers ------------------------------------------------------- */

#define __global__ __attribute__((visibility("default"), used))
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
/* Static storage per OS thread: the emulator runs a block on one OS thread,
 * so every CUDA thread of the block sees the same instance. Also valid after
 * `extern`, where the launcher defines the name as the dynamic array. */
#define __shared__ thread_local

typedef __SIZE_TYPE__ size_t;

/* ---- built-in variables ----------------------------------------------- */

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

struct KilnEmuThread {
    uint3 tid;
};

extern "C" {
extern KilnEmuThread *kiln_emu_cur;
extern uint3 kiln_emu_block_idx;
extern dim3 kiln_emu_block_dim, kiln_emu_grid_dim;
void kiln_emu_syncthreads(const char *file, int line);
/* kinds of kiln_emu_syncthreads_vote: __syncthreads_or, _and, _count */
enum { KILN_EMU_BAR_OR = 1, KILN_EMU_BAR_AND = 2, KILN_EMU_BAR_COUNT = 3 };
/* A barrier that also votes: every live thread of the block must reach it
 * (the same kind, file and line); returns, to each, the OR (0 or 1), AND
 * (0 or 1) or count of the predicates of all of them. */
int kiln_emu_syncthreads_vote(int kind, int pred, const char *file, int line);
/* kinds of kiln_emu_warp */
enum {
    KILN_EMU_SHFL_IDX,
    KILN_EMU_SHFL_UP,
    KILN_EMU_SHFL_DOWN,
    KILN_EMU_SHFL_XOR,
    KILN_EMU_BALLOT,
    KILN_EMU_ANY,
    KILN_EMU_ALL,
    KILN_EMU_SYNCWARP,
};
/* Every lane named by mask must call it with the same kind, mask and width;
 * returns the calling lane's result (for shuffles: the source lane's v). */
unsigned long long kiln_emu_warp(int kind, unsigned int mask, unsigned long long v, int arg,
                                 int width, const char *file, int line);
int printf(const char *fmt, ...);
}

static inline uint3 kiln_emu_thread_idx() { return kiln_emu_cur->tid; }
#define threadIdx (kiln_emu_thread_idx())
#define blockIdx (static_cast<const uint3>(kiln_emu_block_idx))
#define blockDim (static_cast<const dim3>(kiln_emu_block_dim))
#define gridDim (static_cast<const dim3>(kiln_emu_grid_dim))
constexpr int warpSize = 32;

/* ---- synchronisation -------------------------------------------------- */

#define __syncthreads() kiln_emu_syncthreads(__FILE__, __LINE__)
/* variadic: a predicate may hold the commas of template arguments */
#define __syncthreads_or(...) \
    kiln_emu_syncthreads_vote(KILN_EMU_BAR_OR, (__VA_ARGS__) != 0, __FILE__, __LINE__)
#define __syncthreads_and(...) \
    kiln_emu_syncthreads_vote(KILN_EMU_BAR_AND, (__VA_ARGS__) != 0, __FILE__, __LINE__)
#define __syncthreads_count(...) \
    kiln_emu_syncthreads_vote(KILN_EMU_BAR_COUNT, (__VA_ARGS__) != 0, __FILE__, __LINE__)
#define __syncwarp(...) kiln_emu_syncwarp(__FILE__, __LINE__, ##__VA_ARGS__)
static inline void kiln_emu_syncwarp(const char *file, int line, unsigned int mask = 0xffffffffu)
{
    kiln_emu_warp(KILN_EMU_SYNCWARP, mask, 0, 0, 32, file, line);
}
/* Fences order memory between threads that run at once; the emulator's
 * threads never do, so a fence only has to stop the compiler. */
static inline void __threadfence() { __asm__ __volatile__("" ::: "memory"); }
static inline void __threadfence_block() { __asm__ __volatile__("" ::: "memory"); }
/* __trap(): ends the launch with an error naming the thread and the line. */
extern "C" void kiln_emu_trap(const char *file, int line);
#define __trap() kiln_emu_trap(__FILE__, __LINE__)

/* ---- half and bf16 ---------------------------------------------------- */

static inline unsigned int kiln_emu_f2u(float f)
{
    unsigned int u;
    __builtin_memcpy(&u, &f, 4);
    return u;
}
static inline float kiln_emu_u2f(unsigned int u)
{
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}
/* d rounded to float toward zero, then the lowest bit set if inexact
 * ("round to odd"): rounding that float to fewer than 23 bits of mantissa
 * gives the correctly rounded result of d. */
static inline float kiln_emu_d2f_odd(double d)
{
    float f = (float)d;
    if (f != f || (double)f == d || __builtin_isinf(f))
        return f;
    unsigned int u = kiln_emu_f2u(f);
    if (__builtin_fabs((double)f) > __builtin_fabs(d))
        u -= 1; /* rounded away from zero: step back toward zero */
    return kiln_emu_u2f(u | 1u);
}
static inline unsigned short kiln_emu_f2bf_rn(float f)
{
    unsigned int u = kiln_emu_f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fff;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
static inline unsigned short kiln_emu_f2bf_rz(float f)
{
    unsigned int u = kiln_emu_f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fff;
    return (unsigned short)(u >> 16);
}
static inline float kiln_emu_bf2f(unsigned short h) { return kiln_emu_u2f((unsigned int)h << 16); }
static inline unsigned short kiln_emu_f2h_rn(float f)
{
    unsigned int x = kiln_emu_f2u(f);
    unsigned int sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x > 0x7f800000u)
        return 0x7fff;
    if (x >= 0x477ff000u) /* >= 65520: rounds to infinity */
        return (unsigned short)(sign | 0x7c00u);
    if (x >= 0x38800000u) { /* normal half */
        unsigned int h = (x - 0x38000000u) >> 13, rem = x & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            h++;
        return (unsigned short)(sign | h);
    }
    if (x < 0x33000000u) /* below half the smallest subnormal (ties to 0) */
        return (unsigned short)sign;
    unsigned int e = x >> 23, m = (x & 0x7fffffu) | 0x800000u, shift = 126 - e;
    unsigned int h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u)))
        h++;
    return (unsigned short)(sign | h);
}
static inline float kiln_emu_h2f(unsigned short h)
{
    unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return kiln_emu_u2f(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f); /* m * 2^-24, exact */
        return sign ? -v : v;
    }
    return kiln_emu_u2f(sign | ((e + 112) << 23) | (m << 13));
}

struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(kiln_emu_f2bf_rn(f)) {}
    __nv_bfloat16(double d) : __x(kiln_emu_f2bf_rn(kiln_emu_d2f_odd(d))) {}
    operator float() const { return kiln_emu_bf2f(__x); }
};
struct __half {
    unsigned short __x;
    __half() = default;
    __half(float f) : __x(kiln_emu_f2h_rn(f)) {}
    __half(double d) : __x(kiln_emu_f2h_rn(kiln_emu_d2f_odd(d))) {}
    operator float() const { return kiln_emu_h2f(__x); }
};
typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;
struct __align__(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
struct __align__(4) __half2 {
    __half x, y;
};
typedef __half2 half2;
typedef __nv_bfloat162 nv_bfloat162;

/* bf16 and f16 arithmetic: exact in double, rounded once. */
#define KILN_EMU_H16_OPS(T)                                                                    \
    static inline T operator+(T a, T b) { return T((double)(float)a + (double)(float)b); }     \
    static inline T operator-(T a, T b) { return T((double)(float)a - (double)(float)b); }     \
    static inline T operator*(T a, T b) { return T((double)(float)a * (double)(float)b); }     \
    static inline T operator/(T a, T b) { return T((float)a / (float)b); }                     \
    static inline T operator-(T a) { T r = a; r.__x ^= 0x8000u; return r; }                   \
    static inline T &operator+=(T &a, T b) { return a = a + b; }                               \
    static inline T &operator-=(T &a, T b) { return a = a - b; }                               \
    static inline T &operator*=(T &a, T b) { return a = a * b; }                               \
    static inline T &operator/=(T &a, T b) { return a = a / b; }                               \
    static inline bool operator==(T a, T b) { return (float)a == (float)b; }                   \
    static inline bool operator!=(T a, T b) { return (float)a != (float)b; }                   \
    static inline bool operator<(T a, T b) { return (float)a < (float)b; }                     \
    static inline bool operator<=(T a, T b) { return (float)a <= (float)b; }                   \
    static inline bool operator>(T a, T b) { return (float)a > (float)b; }                     \
    static inline bool operator>=(T a, T b) { return (float)a >= (float)b; }                   \
    static inline T __hadd(T a, T b) { return a + b; }                                         \
    static inline T __hsub(T a, T b) { return a - b; }                                         \
    static inline T __hmul(T a, T b) { return a * b; }                                         \
    static inline T __hdiv(T a, T b) { return a / b; }                                         \
    static inline T __hneg(T a) { return -a; }                                                \
    static inline T __habs(T a) { T r = a; r.__x &= 0x7fffu; return r; }                       \
    static inline T __hfma(T a, T b, T c)                                                      \
    {                                                                                          \
        return T((double)(float)a * (double)(float)b + (double)(float)c);                      \
    }                                                                                          \
    static inline T __hmax(T a, T b) { return T(__builtin_fmaxf((float)a, (float)b)); }        \
    static inline T __hmin(T a, T b) { return T(__builtin_fminf((float)a, (float)b)); }        \
    static inline bool __heq(T a, T b) { return a == b; }                                      \
    static inline bool __hne(T a, T b) { return a != b; }                                      \
    static inline bool __hlt(T a, T b) { return a < b; }                                       \
    static inline bool __hle(T a, T b) { return a <= b; }                                      \
    static inline bool __hgt(T a, T b) { return a > b; }                                       \
    static inline bool __hge(T a, T b) { return a >= b; }                                      \
    static inline bool __hisnan(T a) { return (float)a != (float)a; }
KILN_EMU_H16_OPS(__nv_bfloat16)
KILN_EMU_H16_OPS(__half)
#undef KILN_EMU_H16_OPS

static inline __nv_bfloat16 kiln_emu_bf(unsigned short x)
{
    __nv_bfloat16 r;
    r.__x = x;
    return r;
}
static inline __half kiln_emu_h(unsigned short x)
{
    __half r;
    r.__x = x;
    return r;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return kiln_emu_bf(kiln_emu_f2bf_rn(f)); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rz(float f) { return kiln_emu_bf(kiln_emu_f2bf_rz(f)); }
static inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
static inline float __bfloat162float(__nv_bfloat16 h) { return kiln_emu_bf2f(h.__x); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) { return kiln_emu_bf(x); }
static inline __half __float2half(float f) { return kiln_emu_h(kiln_emu_f2h_rn(f)); }
static inline __half __float2half_rn(float f) { return __float2half(f); }
static inline __half __double2half(double d) { return __half(d); }
static inline float __half2float(__half h) { return kiln_emu_h2f(h.__x); }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __ushort_as_half(unsigned short x) { return kiln_emu_h(x); }

static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
    return __nv_bfloat162{__float2bfloat16(a), __float2bfloat16(b)};
}
static inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b)
{
    return __nv_bfloat162{a, b};
}
static inline __half2 __floats2half2_rn(float a, float b)
{
    return __half2{__float2half(a), __float2half(b)};
}
static inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
static inline float __low2float(__nv_bfloat162 v) { return (float)v.x; }
static inline float __high2float(__nv_bfloat162 v) { return (float)v.y; }
static inline float __low2float(__half2 v) { return (float)v.x; }
static inline float __high2float(__half2 v) { return (float)v.y; }
static inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 v) { return v.x; }
static inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 v) { return v.y; }
static inline __half __low2half(__half2 v) { return v.x; }
static inline __half __high2half(__half2 v) { return v.y; }

/* ---- vector types ----------------------------------------------------- */

#define KILN_EMU_VEC2(T, N, A)                                                                 \
    struct __align__(A) N##2 { T x, y; };                                                      \
    static inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define KILN_EMU_VEC3(T, N)                                                                    \
    struct N##3 { T x, y, z; };                                                                \
    static inline N##3 make_##N##3(T x, T y, T z) { return N##3{x, y, z}; }
#define KILN_EMU_VEC4(T, N, A)                                                                 \
    struct __align__(A) N##4 { T x, y, z, w; };                                                \
    static inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
KILN_EMU_VEC2(float, float, 8)
KILN_EMU_VEC3(float, float)
KILN_EMU_VEC4(float, float, 16)
KILN_EMU_VEC2(int, int, 8)
KILN_EMU_VEC3(int, int)
KILN_EMU_VEC4(int, int, 16)
KILN_EMU_VEC2(unsigned int, uint, 8)
static inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return uint3{x, y, z}; }
KILN_EMU_VEC4(unsigned int, uint, 16)
KILN_EMU_VEC2(double, double, 16)
KILN_EMU_VEC2(short, short, 4)
KILN_EMU_VEC2(unsigned short, ushort, 4)
KILN_EMU_VEC4(signed char, char, 4)
KILN_EMU_VEC4(unsigned char, uchar, 4)
#undef KILN_EMU_VEC2
#undef KILN_EMU_VEC3
#undef KILN_EMU_VEC4
static inline float2 __bfloat1622float2(__nv_bfloat162 v) { return float2{(float)v.x, (float)v.y}; }
static inline float2 __half22float2(__half2 v) { return float2{(float)v.x, (float)v.y}; }
static inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return __floats2bfloat162_rn(v.x, v.y); }
static inline __half2 __float22half2_rn(float2 v) { return __floats2half2_rn(v.x, v.y); }

/* ---- warp shuffles and votes ------------------------------------------ */

template <class T> struct kiln_emu_shfl_type {
    static const bool ok = false;
};
#define KILN_EMU_SHFL_OK(T)                                                                    \
    template <> struct kiln_emu_shfl_type<T> {                                                 \
        static const bool ok = true;                                                           \
    };
KILN_EMU_SHFL_OK(int)
KILN_EMU_SHFL_OK(unsigned int)
KILN_EMU_SHFL_OK(long)
KILN_EMU_SHFL_OK(unsigned long)
KILN_EMU_SHFL_OK(long long)
KILN_EMU_SHFL_OK(unsigned long long)
KILN_EMU_SHFL_OK(float)
KILN_EMU_SHFL_OK(double)
KILN_EMU_SHFL_OK(__half)
KILN_EMU_SHFL_OK(__half2)
KILN_EMU_SHFL_OK(__nv_bfloat16)
KILN_EMU_SHFL_OK(__nv_bfloat162)
#undef KILN_EMU_SHFL_OK

template <class T>
static inline T kiln_emu_shfl(int kind, const char *file, int line, unsigned int mask, T v,
                              int arg, int width = 32)
{
    static_assert(kiln_emu_shfl_type<T>::ok, "cuda_emu.h: warp shuffle of a type CUDA has no "
                                             "overload for");
    unsigned long long bits = 0;
    __builtin_memcpy(&bits, &v, sizeof v);
    bits = kiln_emu_warp(kind, mask, bits, arg, width, file, line);
    T r;
    __builtin_memcpy(&r, &bits, sizeof r);
    return r;
}
#define __shfl_sync(...) kiln_emu_shfl(KILN_EMU_SHFL_IDX, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) kiln_emu_shfl(KILN_EMU_SHFL_UP, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) kiln_emu_shfl(KILN_EMU_SHFL_DOWN, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) kiln_emu_shfl(KILN_EMU_SHFL_XOR, __FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, pred)                                                              \
    ((unsigned int)kiln_emu_warp(KILN_EMU_BALLOT, (mask), (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(mask, pred)                                                                 \
    ((int)kiln_emu_warp(KILN_EMU_ANY, (mask), (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __all_sync(mask, pred)                                                                 \
    ((int)kiln_emu_warp(KILN_EMU_ALL, (mask), (pred) != 0, 0, 32, __FILE__, __LINE__))

/* ---- atomics ---------------------------------------------------------- */

#define KILN_EMU_ATOMIC(name, T, expr)                                                         \
    static inline T name(T *p, T v)                                                            \
    {                                                                                          \
        T o = *p;                                                                              \
        *p = (expr);                                                                           \
        return o;                                                                              \
    }
KILN_EMU_ATOMIC(atomicAdd, int, o + v)
KILN_EMU_ATOMIC(atomicAdd, unsigned int, o + v)
KILN_EMU_ATOMIC(atomicAdd, unsigned long long, o + v)
KILN_EMU_ATOMIC(atomicAdd, float, o + v)
KILN_EMU_ATOMIC(atomicAdd, double, o + v)
KILN_EMU_ATOMIC(atomicAdd, __nv_bfloat16, o + v)
KILN_EMU_ATOMIC(atomicAdd, __half, o + v)
KILN_EMU_ATOMIC(atomicSub, int, o - v)
KILN_EMU_ATOMIC(atomicSub, unsigned int, o - v)
KILN_EMU_ATOMIC(atomicExch, int, v)
KILN_EMU_ATOMIC(atomicExch, unsigned int, v)
KILN_EMU_ATOMIC(atomicExch, unsigned long long, v)
KILN_EMU_ATOMIC(atomicExch, float, v)
KILN_EMU_ATOMIC(atomicMax, int, o > v ? o : v)
KILN_EMU_ATOMIC(atomicMax, unsigned int, o > v ? o : v)
KILN_EMU_ATOMIC(atomicMax, long long, o > v ? o : v)
KILN_EMU_ATOMIC(atomicMax, unsigned long long, o > v ? o : v)
KILN_EMU_ATOMIC(atomicMin, int, o < v ? o : v)
KILN_EMU_ATOMIC(atomicMin, unsigned int, o < v ? o : v)
KILN_EMU_ATOMIC(atomicMin, long long, o < v ? o : v)
KILN_EMU_ATOMIC(atomicMin, unsigned long long, o < v ? o : v)
KILN_EMU_ATOMIC(atomicAnd, int, o & v)
KILN_EMU_ATOMIC(atomicAnd, unsigned int, o & v)
KILN_EMU_ATOMIC(atomicAnd, unsigned long long, o & v)
KILN_EMU_ATOMIC(atomicOr, int, o | v)
KILN_EMU_ATOMIC(atomicOr, unsigned int, o | v)
KILN_EMU_ATOMIC(atomicOr, unsigned long long, o | v)
KILN_EMU_ATOMIC(atomicXor, int, o ^ v)
KILN_EMU_ATOMIC(atomicXor, unsigned int, o ^ v)
KILN_EMU_ATOMIC(atomicXor, unsigned long long, o ^ v)
KILN_EMU_ATOMIC(atomicInc, unsigned int, o >= v ? 0u : o + 1u)
KILN_EMU_ATOMIC(atomicDec, unsigned int, (o == 0u || o > v) ? v : o - 1u)
#undef KILN_EMU_ATOMIC
#define KILN_EMU_CAS(T)                                                                        \
    static inline T atomicCAS(T *p, T cmp, T v)                                                \
    {                                                                                          \
        T o = *p;                                                                              \
        if (o == cmp)                                                                          \
            *p = v;                                                                            \
        return o;                                                                              \
    }
KILN_EMU_CAS(int)
KILN_EMU_CAS(unsigned int)
KILN_EMU_CAS(unsigned long long)
KILN_EMU_CAS(unsigned short)
#undef KILN_EMU_CAS

/* ---- loads ------------------------------------------------------------ */

template <class T> static inline T __ldg(const T *p) { return *p; }

/* ---- math ------------------------------------------------------------- */

extern "C" {
#define KILN_EMU_F1(fn) float fn##f(float) noexcept; double fn(double) noexcept;
#define KILN_EMU_F2(fn) float fn##f(float, float) noexcept; double fn(double, double) noexcept;
KILN_EMU_F1(exp) KILN_EMU_F1(exp2) KILN_EMU_F1(expm1) KILN_EMU_F1(log) KILN_EMU_F1(log2)
KILN_EMU_F1(log10) KILN_EMU_F1(log1p) KILN_EMU_F1(sqrt) KILN_EMU_F1(cbrt) KILN_EMU_F1(sin)
KILN_EMU_F1(cos) KILN_EMU_F1(tan) KILN_EMU_F1(asin) KILN_EMU_F1(acos) KILN_EMU_F1(atan)
KILN_EMU_F1(sinh) KILN_EMU_F1(cosh) KILN_EMU_F1(tanh) KILN_EMU_F1(asinh) KILN_EMU_F1(acosh)
KILN_EMU_F1(atanh) KILN_EMU_F1(erf) KILN_EMU_F1(erfc) KILN_EMU_F1(fabs) KILN_EMU_F1(floor)
KILN_EMU_F1(ceil) KILN_EMU_F1(trunc) KILN_EMU_F1(round) KILN_EMU_F1(rint)
KILN_EMU_F1(nearbyint) KILN_EMU_F1(lgamma) KILN_EMU_F1(tgamma)
KILN_EMU_F2(pow) KILN_EMU_F2(fmod) KILN_EMU_F2(atan2) KILN_EMU_F2(fmax) KILN_EMU_F2(fmin)
KILN_EMU_F2(copysign) KILN_EMU_F2(hypot) KILN_EMU_F2(remainder) KILN_EMU_F2(fdim)
float fmaf(float, float, float) noexcept;
double fma(double, double, double) noexcept;
#undef KILN_EMU_F1
#undef KILN_EMU_F2
}
/* CUDA's float overloads of the double names. */
#define KILN_EMU_O1(fn) static inline float fn(float x) { return fn##f(x); }
#define KILN_EMU_O2(fn) static inline float fn(float x, float y) { return fn##f(x, y); }
KILN_EMU_O1(exp) KILN_EMU_O1(exp2) KILN_EMU_O1(expm1) KILN_EMU_O1(log) KILN_EMU_O1(log2)
KILN_EMU_O1(log10) KILN_EMU_O1(log1p) KILN_EMU_O1(sqrt) KILN_EMU_O1(cbrt) KILN_EMU_O1(sin)
KILN_EMU_O1(cos) KILN_EMU_O1(tan) KILN_EMU_O1(tanh) KILN_EMU_O1(erf) KILN_EMU_O1(fabs)
KILN_EMU_O1(floor) KILN_EMU_O1(ceil) KILN_EMU_O1(trunc) KILN_EMU_O1(round)
KILN_EMU_O2(pow) KILN_EMU_O2(fmod) KILN_EMU_O2(atan2) KILN_EMU_O2(fmax) KILN_EMU_O2(fmin)
KILN_EMU_O2(copysign)
#undef KILN_EMU_O1
#undef KILN_EMU_O2
static inline float fma(float a, float b, float c) { return fmaf(a, b, c); }
static inline float rsqrtf(float x) { return (float)(1.0 / sqrt((double)x)); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float rcbrtf(float x) { return (float)(1.0 / cbrt((double)x)); }
static inline float exp10f(float x) { return powf(10.0f, x); }
static inline float fdividef(float a, float b) { return a / b; }
static inline float __expf(float x) { return expf(x); }
static inline float __exp10f(float x) { return exp10f(x); }
static inline float __logf(float x) { return logf(x); }
static inline float __log2f(float x) { return log2f(x); }
static inline float __log10f(float x) { return log10f(x); }
static inline float __sinf(float x) { return sinf(x); }
static inline float __cosf(float x) { return cosf(x); }
static inline float __tanf(float x) { return tanf(x); }
static inline float __powf(float x, float y) { return powf(x, y); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __frsqrt_rn(float x) { return rsqrtf(x); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline bool isnan(float x) { return __builtin_isnan(x); }
static inline bool isnan(double x) { return __builtin_isnan(x); }
static inline bool isinf(float x) { return __builtin_isinf(x); }
static inline bool isinf(double x) { return __builtin_isinf(x); }
static inline bool isfinite(float x) { return __builtin_isfinite(x); }
static inline bool isfinite(double x) { return __builtin_isfinite(x); }
static inline bool signbit(float x) { return __builtin_signbit(x); }
static inline int __float_as_int(float x) { return (int)kiln_emu_f2u(x); }
static inline unsigned int __float_as_uint(float x) { return kiln_emu_f2u(x); }
static inline float __int_as_float(int x) { return kiln_emu_u2f((unsigned int)x); }
static inline float __uint_as_float(unsigned int x) { return kiln_emu_u2f(x); }
static inline long long __double_as_longlong(double d)
{
    long long r;
    __builtin_memcpy(&r, &d, 8);
    return r;
}
static inline double __longlong_as_double(long long x)
{
    double r;
    __builtin_memcpy(&r, &x, 8);
    return r;
}
static inline int __float2int_rn(float x) { return (int)rintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __float2int_rd(float x) { return (int)floorf(x); }
static inline int __float2int_ru(float x) { return (int)ceilf(x); }
static inline float __int2float_rn(int x) { return (float)x; }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned int)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned int __brev(unsigned int x)
{
    unsigned int r = 0;
    for (int i = 0; i < 32; i++)
        r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
static inline int __mul24(int a, int b) { return (int)((long long)(a << 8 >> 8) * (b << 8 >> 8)); }
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
static inline unsigned int __umulhi(unsigned int a, unsigned int b)
{
    return (unsigned int)(((unsigned long long)a * b) >> 32);
}

/* CUDA's min and max: integer overloads, and fminf/fmaxf for floats. */
#define KILN_EMU_MINMAX(T)                                                                     \
    static inline T min(T a, T b) { return a < b ? a : b; }                                    \
    static inline T max(T a, T b) { return a > b ? a : b; }
KILN_EMU_MINMAX(int)
KILN_EMU_MINMAX(unsigned int)
KILN_EMU_MINMAX(long)
KILN_EMU_MINMAX(unsigned long)
KILN_EMU_MINMAX(long long)
KILN_EMU_MINMAX(unsigned long long)
#undef KILN_EMU_MINMAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

#endif
