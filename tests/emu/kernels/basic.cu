// Hand-written CUDA kernels for the emulator's own tests (test_emu_kernels.c).
// Each is ordinary CUDA C (NVRTC accepts it as is); the *_bad variants carry
// one deliberate bug each, which the emulator must expose.

// out[blockIdx.x] = sum of x over the block's slice of n elements.
// Warp shuffles reduce within warps, shared memory across warps.
#define BLOCK_REDUCE_BODY(SHFL_START, BARRIER)                                   \
    __shared__ float warp_sums[32];                                             \
    float v = 0.0f;                                                             \
    for (int i = threadIdx.x; i < n; i += blockDim.x)                           \
        v += x[(long long)blockIdx.x * n + i];                                  \
    for (int off = SHFL_START; off > 0; off >>= 1)                              \
        v += __shfl_down_sync(0xffffffffu, v, off);                             \
    int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;           \
    if (lane == 0)                                                              \
        warp_sums[warp] = v;                                                    \
    BARRIER;                                                                    \
    if (warp == 0) {                                                            \
        int nwarps = blockDim.x / warpSize;                                     \
        v = lane < nwarps ? warp_sums[lane] : 0.0f;                             \
        for (int off = 16; off > 0; off >>= 1)                                  \
            v += __shfl_xor_sync(0xffffffffu, v, off);                          \
        if (lane == 0)                                                          \
            out[blockIdx.x] = v;                                                \
    }

extern "C" __global__ void block_sum(const float *__restrict__ x, float *__restrict__ out, int n)
{
    BLOCK_REDUCE_BODY(16, __syncthreads())
}
// Bug: no barrier between the warp leaders' writes and warp 0's reads.
extern "C" __global__ void block_sum_nobarrier(const float *__restrict__ x, float *__restrict__ out, int n)
{
    BLOCK_REDUCE_BODY(16, (void)0)
}
// Bug: the shuffle tree starts at offset 8, so lanes 16..31 never reach lane 0.
extern "C" __global__ void block_sum_wronglane(const float *__restrict__ x, float *__restrict__ out, int n)
{
    BLOCK_REDUCE_BODY(8, __syncthreads())
}

// Classic shared-memory tree reduction (no shuffles): out[b] = sum.
extern "C" __global__ void tree_sum(const float *x, float *out, int n)
{
    __shared__ float s[256];
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        v += x[(long long)blockIdx.x * n + i];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st)
            s[threadIdx.x] += s[threadIdx.x + st];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        out[blockIdx.x] = s[0];
}
// Bug: no barrier inside the tree.
extern "C" __global__ void tree_sum_nobarrier(const float *x, float *out, int n)
{
    __shared__ float s[256];
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        v += x[(long long)blockIdx.x * n + i];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st)
            s[threadIdx.x] += s[threadIdx.x + st];
    }
    if (threadIdx.x == 0)
        out[blockIdx.x] = s[0];
}

// Softmax of each row of x (rows x cols), one block per row; the row is
// staged in dynamic shared memory (cols floats), maxima and sums reduced
// with shuffles and a static array of warp partials.
__device__ __forceinline__ float warp_max(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
__device__ __forceinline__ float warp_sum(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
template <bool GUARD> __device__ float block_allreduce(float v, bool is_max)
{
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (GUARD)
        __syncthreads(); // part[] may still be read by the previous call
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = lane < nwarps ? part[lane] : (is_max ? -__int_as_float(0x7f800000) : 0.0f);
    return is_max ? warp_max(v) : warp_sum(v);
}
template <bool GUARD> __device__ void softmax_rows_t(const float *__restrict__ x, float *__restrict__ y, int cols)
{
    extern __shared__ float row[];
    const float *xr = x + (long long)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        row[i] = xr[i];
    __syncthreads();
    float m = -__int_as_float(0x7f800000);
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        m = fmaxf(m, row[i]);
    m = block_allreduce<GUARD>(m, true);
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float e = __expf(row[i] - m);
        row[i] = e;
        s += e;
    }
    s = block_allreduce<GUARD>(s, false);
    float inv = 1.0f / s;
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        y[(long long)blockIdx.x * cols + i] = row[i] * inv;
}

extern "C" __global__ void __launch_bounds__(1024) softmax_rows(const float *__restrict__ x, float *__restrict__ y, int cols)
{
    softmax_rows_t<true>(x, y, cols);
}
// Bug: no barrier before the warp leaders overwrite part[] in the second
// reduction, which a slow thread may still be reading from the first.
extern "C" __global__ void softmax_rows_war(const float *__restrict__ x, float *__restrict__ y, int cols)
{
    softmax_rows_t<false>(x, y, cols);
}

// Elementwise, grid-stride: y = gelu_tanh(x) in bf16 (computed in f32).
extern "C" __global__ void gelu_bf16(const __nv_bfloat16 *__restrict__ x, __nv_bfloat16 *__restrict__ y, long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        float v = __bfloat162float(x[i]);
        float t = tanhf(0.7978845608f * (v + 0.044715f * v * v * v));
        y[i] = __float2bfloat16(0.5f * v * (1.0f + t));
    }
}

// Conversions: f32 -> bf16 and f16 bit patterns, and back.
extern "C" __global__ void convert16(const float *x, unsigned short *bf, unsigned short *h, float *bf_back, float *h_back, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        __nv_bfloat16 b = __float2bfloat16_rn(x[i]);
        __half hh = __float2half_rn(x[i]);
        bf[i] = __bfloat16_as_ushort(b);
        h[i] = __half_as_ushort(hh);
        bf_back[i] = __bfloat162float(b);
        h_back[i] = __half2float(hh);
    }
}

// Transpose through a shared tile: 2-D blocks (32 x 8), 2-D grid.
extern "C" __global__ void transpose(const float *in, float *out, int rows, int cols)
{
    __shared__ float tile[32][33];
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
    for (int j = 0; j < 32; j += blockDim.y)
        if (x < cols && y + j < rows)
            tile[threadIdx.y + j][threadIdx.x] = in[(long long)(y + j) * cols + x];
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x;
    y = blockIdx.x * 32 + threadIdx.y;
    for (int j = 0; j < 32; j += blockDim.y)
        if (x < rows && y + j < cols)
            out[(long long)(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
}

// Votes and atomics: per block, ballot of (x > 0) per warp, and a global
// histogram of x's signs and a float sum through atomics.
extern "C" __global__ void votes(const float *x, unsigned *ballots, int *anys, int *alls, int *hist, float *sum, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    unsigned b = __ballot_sync(0xffffffffu, v > 0.0f);
    int a = __any_sync(0xffffffffu, v > 0.0f);
    int l = __all_sync(0xffffffffu, v > 0.0f);
    int w = i / 32;
    if (threadIdx.x % 32 == 0) {
        ballots[w] = b;
        anys[w] = a;
        alls[w] = l;
    }
    if (i < n) {
        atomicAdd(&hist[v > 0.0f ? 1 : 0], 1);
        atomicAdd(sum, v);
    }
}

// Block-wide votes (test_emu_kernels' test_block_votes): thread i of the
// grid writes what it got from __syncthreads_or/_and/_count of p = x[i] > 0
// (0 past n), from __syncthreads_or of (its lane == 5) and, in out[6 i + 4],
// how many times it went round a loop that runs while any thread of the
// block has rounds left (lim[i] each), and out[6 i + 5] the vote that ended
// it: the attention kernels' way of skipping a tile together.
extern "C" __global__ void block_votes(const float *x, const int *lim, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int p = i < n && x[i] > 0.0f;
    int *o = out + 6 * i;
    o[0] = __syncthreads_or(p);
    o[1] = __syncthreads_and(p);
    o[2] = __syncthreads_count(p);
    o[3] = __syncthreads_or((threadIdx.x & 31) == 5);
    int k = 0, v;
    while ((v = __syncthreads_or(k < lim[i])) != 0)
        k++;
    __syncthreads();
    o[4] = k;
    o[5] = v;
}

// The order in which the threads ran: order[t] = how many threads took a
// ticket before thread t (test_emu_kernels' test_thread_order_per_kernel).
extern "C" __global__ void arrival(int *cnt, int *order)
{
    order[threadIdx.x] = atomicAdd(cnt, 1);
}

// Shuffles with width < 32 and up/idx variants: out[i] for each thread.
extern "C" __global__ void shuffles(const int *x, int *up, int *idx, int *xr8)
{
    int i = threadIdx.x;
    int v = x[i];
    up[i] = __shfl_up_sync(0xffffffffu, v, 3, 16);
    idx[i] = __shfl_sync(0xffffffffu, v, 5, 8);
    xr8[i] = __shfl_xor_sync(0xffffffffu, v, 9, 8);
}

// Execution errors the emulator must report.
extern "C" __global__ void early_return_barrier(float *x)
{
    if (threadIdx.x == 7)
        return;
    __syncthreads();
    x[threadIdx.x] = 1.0f;
}
extern "C" __global__ void divergent_barrier(float *x)
{
    if (threadIdx.x < 16) {
        x[threadIdx.x] = 1.0f;
        __syncthreads();
    } else {
        __syncthreads();
        x[threadIdx.x] = 2.0f;
    }
}
extern "C" __global__ void divergent_vote(float *x)
{
    // one line: the kind of barrier, not only its place, must agree
    if (threadIdx.x < 16) x[threadIdx.x] = (float)__syncthreads_or(1); else __syncthreads();
}
extern "C" __global__ void partial_mask(float *x)
{
    // mask names all 32 lanes, but only the first 16 call the shuffle
    if (threadIdx.x < 16)
        x[threadIdx.x] = __shfl_down_sync(0xffffffffu, x[threadIdx.x], 1);
}
extern "C" __global__ void deadlock(float *x)
{
    // lane 0 waits for lane 1 at __syncwarp; lane 1 waits at the barrier
    if (threadIdx.x == 0)
        __syncwarp(0x3u);
    __syncthreads();
    x[threadIdx.x] = 1.0f;
}
extern "C" __global__ void uninit_shared(float *out)
{
    __shared__ float s[64];
    if (threadIdx.x < 32)
        s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x]; // threads 32..63 read what nothing wrote
}

// Memory errors that the sanitizers must catch (run in a child process).
extern "C" __global__ void dyn_shared_overflow(float *out, int n)
{
    extern __shared__ float buf[];
    buf[threadIdx.x] = 1.0f; // launched with n floats of dynamic shared memory, n < blockDim.x
    __syncthreads();
    out[threadIdx.x] = buf[threadIdx.x % n];
}
extern "C" __global__ void static_shared_overflow(float *out, int k)
{
    __shared__ float s[32];
    s[threadIdx.x + k] = 1.0f; // k > 0: the last threads write past s
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}
extern "C" __global__ void global_overflow(const float *x, float *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x; // no i < n guard
    out[i] = x[i] * 2.0f;
}
