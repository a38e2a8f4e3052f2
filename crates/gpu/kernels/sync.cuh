// Barriers between the blocks of one launch, for kernels whose blocks are all resident at once
// (cooperative launches): the one-launch epoch's grid barrier and the evaluation stitch's team
// barrier are the same code over a different set of blocks.

// A barrier of `blocks` blocks sharing `bar` (two words, zero when first used): arrivals counted
// in bar[0], the generation in bar[1]; the last arrival resets the count and opens the next
// generation, so the words are ready for the next barrier and the next launch. Writes made
// before it are seen after it by every block that reads them from L2 (__ldcg): the first-level
// caches of the blocks are not kept coherent.
__device__ void blocks_barrier(unsigned int* bar, unsigned int blocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned int* gen = bar + 1;
        unsigned int g = *gen;
        __threadfence();
        if (atomicAdd(bar, 1u) == blocks - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (*gen == g) {}
        }
        __threadfence();
    }
    __syncthreads();
}
