// Barriers between the blocks of one launch, for kernels whose blocks are all resident at once
// (cooperative launches): the one-launch epoch's grid barrier and the evaluation stitch's team
// barrier are the same code over a different set of blocks. And, on Hopper and later, the
// hardware barrier and shared-memory stores of a thread-block cluster, which the one-launch epoch
// uses instead where a member's blocks are one cluster. And the block's copy of a buffer through
// L2 with many loads in flight, with which both stage a network in shared memory.

// A barrier of `blocks` blocks sharing `bar` (two words, zero when first used, 8-byte aligned):
// arrivals counted in bar[0], the generation in bar[1], both one 64-bit word so that an arrival
// learns the generation it waits on from its own atomic add; the last arrival resets the count and
// opens the next generation with one more, so the words are ready for the next barrier and the
// next launch (of any team size). Writes made before it are seen after it by every block that
// reads them from L2 (__ldcg): the arrival releases the block's writes (after __syncthreads), the
// wait acquires the others'; the first-level caches of the blocks are not kept coherent.
__device__ void blocks_barrier(unsigned int* bar, unsigned int blocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long* word = (unsigned long long*)bar;
        unsigned long long old;
        asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;"
                     : "=l"(old) : "l"(word) : "memory");
        const unsigned int gen = (unsigned int)(old >> 32);
        if ((unsigned int)old == blocks - 1) {
            // Count back to zero and generation + 1 in one add.
            const unsigned long long open = (1ull << 32) - blocks;
            asm volatile("red.release.gpu.global.add.u64 [%0], %1;" :: "l"(word), "l"(open)
                         : "memory");
        } else {
            unsigned long long now;
            do {
                asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(now) : "l"(word)
                             : "memory");
            } while ((unsigned int)(now >> 32) == gen);
        }
    }
    __syncthreads();
}

// Blocks of this block's thread-block cluster: 1 in a launch without clusters, or before Hopper.
__device__ __forceinline__ unsigned int cluster_blocks() {
#if __CUDA_ARCH__ >= 900
    unsigned int n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
#else
    return 1;
#endif
}

// Every thread of every block of the cluster meets here (all must call it). Writes made before
// it, to global or to any block's shared memory, are seen after it by every thread of the
// cluster (release and acquire at cluster scope); global data written by another block is
// still read through L2 (__ldcg), as after blocks_barrier.
__device__ __forceinline__ void cluster_barrier() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    __trap();  // no clusters: callers check cluster_blocks() first
#endif
}

// The address of p's place (p in this block's shared memory) in the shared memory of block
// `rank` of the cluster, whose layout is this block's, for the signalling stores below.
__device__ __forceinline__ unsigned int cluster_addr(const void* p, unsigned int rank) {
    unsigned int remote = 0;
#if __CUDA_ARCH__ >= 900
    unsigned long long local;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(local) : "l"(p));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote) : "r"((unsigned int)local), "r"(rank));
#else
    __trap();
#endif
    return remote;
}

// A generic pointer to p's place (p in this block's shared memory) in the shared memory of block
// `rank` of the cluster, whose layout is this block's: plain loads and stores through it reach
// that block's memory (it must not have exited).
template <typename T>
__device__ __forceinline__ T* cluster_ptr(T* p, unsigned int rank) {
#if __CUDA_ARCH__ >= 900
    unsigned long long remote;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(remote) : "l"(p), "r"(rank));
    return (T*)remote;
#else
    __trap();
    return p;
#endif
}

// Loads per thread kept in flight by loops that read global memory through L2 (what other
// blocks wrote, or a network's parameters staged in shared memory): each such load waits a
// trip to L2, so a loop that issued one load an iteration would wait one trip an iteration.
#define IN_FLIGHT 8

// dst[0..n) = src[0..n) for the whole block, read through L2 (src may be written by other
// blocks of the launch), four floats a load where both are 16-byte aligned (device buffers and
// the start of dynamic shared memory are).
__device__ void load_net(float* dst, const float* src, u64 n) {
    u64 n4 = (((u64)dst | (u64)src) & 15) == 0 ? n / 4 : 0;
    const float4* s4 = (const float4*)src;
    float4* d4 = (float4*)dst;
    const u64 stride = blockDim.x;
    for (u64 i = threadIdx.x; i < n4; i += IN_FLIGHT * stride) {
        float4 v[IN_FLIGHT];
#pragma unroll
        for (int k = 0; k < IN_FLIGHT; ++k)
            if (i + k * stride < n4) v[k] = __ldcg(s4 + i + k * stride);
#pragma unroll
        for (int k = 0; k < IN_FLIGHT; ++k)
            if (i + k * stride < n4) d4[i + k * stride] = v[k];
    }
    for (u64 i = 4 * n4 + threadIdx.x; i < n; i += blockDim.x) dst[i] = __ldcg(src + i);
}

// Signals between the blocks of a cluster that carry their data (Hopper and later): a block
// stores into another block's shared memory with st.async, each store counting its bytes on a
// barrier object (an mbarrier) in the receiving block, and the receiver waits until the bytes it
// expects have come. Unlike cluster_barrier, nobody waits for blocks that send it nothing, nor
// for its own or the others' outstanding global writes to be released.

// Makes `bar` (8 bytes of this block's shared memory, 8-byte aligned) a barrier of one local
// arrival a phase. One thread, once, before the cluster barrier that precedes any block's first
// store to it.
__device__ __forceinline__ void signal_init(unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;"
                 :: "r"((unsigned int)__cvta_generic_to_shared(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    __trap();
#endif
}

// One thread of the receiving block, once a phase: the phase completes when `bytes` have come
// (before or after this call: the count may run ahead of it).
__device__ __forceinline__ void signal_expect(unsigned long long* bar, unsigned int bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"((unsigned int)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
#else
    __trap();
#endif
}

// v at p's place in the shared memory of block `rank` (not this block), counted on that
// block's `bar` (at bar's place in its shared memory).
__device__ __forceinline__ void signal_store(const float* p, unsigned int rank, float v,
                                             unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];"
                 :: "r"(cluster_addr(p, rank)), "f"(v), "r"(cluster_addr(bar, rank))
                 : "memory");
#else
    __trap();
#endif
}

// Every thread of the receiving block: returns once `bar`'s phase of the given parity (0 for its
// first completion, then alternating) has completed; what was stored for it is then visible to
// the thread.
__device__ __forceinline__ void signal_wait(unsigned long long* bar, unsigned int parity) {
#if __CUDA_ARCH__ >= 900
    unsigned int done = 0;
    while (!done)
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"((unsigned int)__cvta_generic_to_shared(bar)), "r"(parity)
                     : "memory");
#else
    __trap();
#endif
}

// One thread: copies src[0..n) (global memory, 16-byte aligned, n a multiple of 4) into the
// shared memory of every block of the cluster in `mask` at dst's place (dst in this block's
// shared memory, 16-byte aligned), each block's `bar` (at bar's place) counting the bytes it
// receives, by the Tensor Memory Accelerator: one read of L2, delivered to every block. The copy
// sees the global writes of this block's threads that each made a proxy fence
// (`fence.proxy.async.global`) before a __syncthreads that this thread has passed. ptxas advises
// that .multicast::cluster be compiled for sm_90a, as it may be slower on later architectures
// than their own targets; the modules are compiled for the device's plain architecture (sm_90 on
// Hopper, where the advice costs nothing), and a later one should be measured before it is
// trusted to gain.
__device__ __forceinline__ void bulk_multicast(float* dst, const float* src, unsigned long long n,
                                               unsigned long long* bar, unsigned short mask) {
#if __CUDA_ARCH__ >= 900
    const unsigned int bytes = (unsigned int)(n * 4);
    const unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
    const unsigned int b = (unsigned int)__cvta_generic_to_shared(bar);
    for (unsigned int off = 0; off < bytes; off += 16384u) {
        const unsigned int len = min(16384u, bytes - off);
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                     ".multicast::cluster [%0], [%1], %2, [%3], %4;"
                     :: "r"(d + off), "l"((const char*)src + off), "r"(len), "r"(b), "h"(mask)
                     : "memory");
    }
#else
    __trap();
#endif
}

// Orders this thread's generic writes to global memory before later reads of them by the
// Tensor Memory Accelerator (bulk_multicast).
__device__ __forceinline__ void proxy_fence_global() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}
