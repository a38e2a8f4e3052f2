// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator, so any thread draws its numbers from (key, counter) without shared
// state. foxhunt-gpu's philox.rs is the same function on the host; tests compare them.

struct Philox4 { unsigned int v[4]; };

__device__ __forceinline__ Philox4 philox4x32_10(unsigned int c0, unsigned int c1, unsigned int c2,
                                                 unsigned int c3, unsigned int k0, unsigned int k1) {
    const unsigned int M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    for (int r = 0; r < 10; ++r) {
        unsigned int hi0 = __umulhi(M0, c0), lo0 = M0 * c0;
        unsigned int hi1 = __umulhi(M1, c2), lo1 = M1 * c2;
        unsigned int n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += W0; k1 += W1;
    }
    Philox4 out = {{c0, c1, c2, c3}};
    return out;
}
