// Barriers between the blocks of one launch, for kernels whose blocks are all resident at once
// (cooperative launches): the one-launch epoch's grid barrier and the evaluation stitch's team
// barrier are the same code over a different set of blocks.

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
