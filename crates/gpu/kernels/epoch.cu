// foxhunt's one-launch epoch: every step of a training epoch (act, environment step and replay
// write, sample, the DQN update, the target update) in one persistent kernel (cooperative, or a
// thread-block cluster a member), for one agent or for a population of agents side by side (a
// member a row of blocks, blockIdx.y).
// Needs philox.cuh, env.cuh, env_step.cu (step_one), replay.cu (sample_row), dqn.cuh and sync.cuh
// (blocks_barrier) in the same module.
//
// Work is split by rows, not by neurons. The batch is cut into `slots` groups of rows, fixed by
// the host for a network and batch whatever the launch: group k owns batch rows [k B / S,
// (k + 1) B / S), gradient slot k, loss part k and parameter slice [k P / S, (k + 1) P / S).
// Block g of a member's G blocks (G <= S) owns environments [g n / G, (g + 1) n / G) and groups
// [g S / G, (g + 1) S / G); it keeps the whole online and target networks in its shared memory
// and runs complete forward and backward passes of its rows, `chunk` rows at a time, with no
// other block. A member's blocks meet at a grid barrier of their own only where data crosses
// between them: the replay rows every block samples from, the weight gradients (each group's
// rows summed into its slot; each parameter slice then summed over the slots in group order),
// the gradient norm, and the updated weights. Where the host launches a member's blocks as one
// thread-block cluster (Hopper and later, at most 16 blocks; the kernel epoch_steps_cluster,
// the same body as epoch_steps), they meet at the cluster's hardware barrier instead, and the
// updated weights need no barrier at all: each block sends its slice into every block's shared
// copy (one multicast bulk copy of the slice's whole float4s, its ends by signalling stores),
// every block's barrier object counts the bytes it receives, and a block waits for them only
// where it next reads the networks, instead of every block reloading all of them after a
// barrier: the same sums, in the same order, so the same bits. Every sum runs in a fixed order
// that depends on the groups, never on G or on the other members: a launch repeats itself
// exactly, one launch of S steps equals S launches of one step, and a member of a population
// equals the same agent trained alone.
//
// Data written by one block and read by another in the same launch is read through the L2 cache
// (__ldcg): the first-level caches of the blocks are not kept coherent.

// The per-step table (u64 words per step), filled by the host once per epoch.
#define ST_EPSILON 0   // f32 bits: exploration rate
#define ST_COUNTER 1   // exploration counter (window, epoch, step)
#define ST_ROW_BASE 2  // first ring slot of this step's row
#define ST_WRITTEN 3   // ring rows written after this step
#define ST_LEARN 4     // 1: an update follows the step
#define ST_DRAW 5      // the sampler's draw number
#define ST_LR 6        // f32 bits: learning rate of the update
#define ST_EPS_C2 7    // f32 bits: Adam's eps * sqrt(1 - b2^t)
#define ST_CF 8        // f32 bits: Adam's sqrt(1 - b2^t) / (1 - b1^t)
#define ST_SYNC 9      // 0 none, 1 copy the online network to the target, 2 Polyak blend
#define ST_STAT 10     // statistics row of the update
#define ST_ACT 11      // 1: the environments act and step (0: an update alone, for benchmarks)
#define ST_WORDS 12
// A member's words (u64 each; foxhunt-memory's epoch.rs writes them in this order): the buffers
// and keys that are its own. The kernel keeps them in shared memory and reads a field where it
// is used: it is at its register limit, and 36 more live values would spill.
struct Member {
    u32* t_arr;                 // [n_env] environment state: bar
    int* pos_arr;               // [n_env] position
    double* entry_arr;          // [n_env] entry price
    u32* steps_arr;             // [n_env] steps in the episode
    u32* episode_arr;           // [n_env] episode number
    unsigned char* env_actions; // [n_env] the step's actions
    float* env_obs;             // [n_env * dim] observations
    float* rewards;             // [n_env]
    unsigned char* dones;       // [n_env]
    u32* r_t;                   // the ring, [cap_rows * n_env] each
    int* r_pos;
    double* r_entry;
    unsigned char* r_action;
    float* r_reward;
    unsigned char* r_done;
    float* b_obs;               // the batch: [batch * dim]
    int* b_actions;             // [batch]
    float* b_returns;           // [batch]
    float* b_next_obs;          // [batch * dim]
    float* b_discounts;         // [batch]
    float* b_weights;           // [batch]
    float* online;              // [P] online network
    float* target;              // [P] target network
    float* m1g;                 // [P] Adam's first moments (see adam_shared)
    float* m2g;                 // [P] Adam's second moments (likewise)
    float* part;                // [slots * P4] the groups' gradient slots (P4: see below)
    float* grads;               // [P] the summed gradient (likewise)
    float* norm_part;           // [slots] the slices' sums of squares
    float* loss_part;           // [3 * slots] the groups' loss terms
    float* stats;               // [4 * rows] the updates' statistics
    const u64* table;           // [steps * ST_WORDS] the member's step table
    u32* bar;                   // [2] the member's grid barrier
    u64* times;                 // [steps * STAMPS] timestamps
    const u64* layout;          // the network's layout words (see below)
    u64 env_seed;               // episode starts' key
    u64 sample_seed;            // the replay sampler's key
    u64 explore_seed;           // the exploration draws' key
};
#define MEMBER_WORDS 37

// Timestamps per step (see epoch_steps).
#define STAMPS 8

#define MAX_HIDDEN 8

__device__ __forceinline__ float word_f32(u64 w) { return __uint_as_float((u32)w); }

__device__ __forceinline__ u64 global_time() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The network's layout words (foxhunt-dqn's fused::layout_words): [0] hidden layers L,
// [1] actions, [2] obs_dim, [3] layer norm, [4] dueling; per hidden layer: weight offset, bias
// offset, d_in, d_out, norm scale offset, norm shift offset; the head, then the value head:
// weight offset, bias offset, d_in, d_out.
#define NET_HEADER 5
#define NET_LAYER 6
#define LAYOUT_WORDS (NET_HEADER + MAX_HIDDEN * NET_LAYER + 8)
struct Layer { u64 w, b; u32 d_in, d_out; u64 g, beta; };

__device__ __forceinline__ Layer hidden_layer(const u64* lw, u32 l) {
    const u64* d = lw + NET_HEADER + (u64)l * NET_LAYER;
    Layer x = {d[0], d[1], (u32)d[2], (u32)d[3], d[4], d[5]};
    return x;
}
__device__ __forceinline__ Layer head_layer(const u64* lw, u32 k) {
    const u64* d = lw + NET_HEADER + lw[0] * NET_LAYER + 4 * (u64)k;
    Layer x = {d[0], d[1], (u32)d[2], (u32)d[3], 0, 0};
    return x;
}

// The most rows of a chunk (the host's chunk is at most this).
#define MAX_CHUNK 8

// y[r][o] = sum_i x[r][i] w[i][o] + b[o] (the eager engine's order: the inputs in order, then the
// bias) for rows x d_out outputs, shared by the block. Thread (o, g) of groups = min(blockDim /
// d_out, rows) takes output column o of rows g, g + groups, ...: R = ceil(rows / groups) rows, a
// compile-time count, so that each weight it loads serves R independent sums kept in registers
// (no predicated row slots, no per-iteration index arithmetic). A warp reads 32 neighbouring
// weights of one input row and broadcasts the x values.
template <int R>
__device__ __forceinline__ void dense_r(const float* w, const float* b, u32 d_in, u32 D,
                                        const float* x, float* y, u32 rows, u32 groups) {
    for (u32 k = threadIdx.x; k < groups * D; k += blockDim.x) {
        const u32 o = k % D, g = k / D;
        const float* xr[R];
        float acc[R];
#pragma unroll
        for (int j = 0; j < R; ++j) {
            const u32 r = g + (u32)j * groups;
            xr[j] = x + (r < rows ? r : g) * d_in;
            acc[j] = 0.0f;
        }
        const float* wp = w + o;
#pragma unroll 4
        for (u32 i = 0; i < d_in; ++i, wp += D) {
            const float wv = *wp;
#pragma unroll
            for (int j = 0; j < R; ++j) acc[j] += xr[j][i] * wv;
        }
        const float bo = b[o];
#pragma unroll
        for (int j = 0; j < R; ++j) {
            const u32 r = g + (u32)j * groups;
            if (r < rows) y[r * D + o] = acc[j] + bo;
        }
    }
}

// The tiled passes below keep a thread's products in registers: a tile of 4 neighbouring
// columns and R rows, so that each shared-memory load (a float4) feeds 4 or R products. A sum's
// terms are split into SPLIT contiguous parts taken by the lanes 8 apart of a warp, and the parts
// are added over those lanes in a fixed grouping (tile_finish): a sum's order is fixed (the
// parts' own terms in order, then ((part 0 + part 1) + (part 2 + part 3))), so a launch repeats
// itself exactly, though it is not the eager engine's order. Products are fused multiply-adds:
// nothing in this module's learning rule is promised to equal the host bit for bit (the GPU
// tests hold it to the eager engine and the burn agent within a relative 1e-6).
#define SPLIT 4
#define MAC(acc, a, b) acc = __fmaf_rn(a, b, acc)

__device__ __forceinline__ bool aligned16(const void* p) { return ((u64)p & 15) == 0; }

// Tells the compiler that each pointer is to shared memory, so that it reads and writes them
// with shared loads and stores, not generic ones. Every caller's operands are the training
// kernel's shared buffers and networks (epoch_steps' layout); a global pointer here would be
// undefined behaviour.
template <typename... T>
__device__ __forceinline__ void assume_shared(const T*... p) {
    (__builtin_assume(__isShared(p)), ...);
}

// Adds the SPLIT lanes' parts of v (lanes l, l ^ 8, l ^ 16, l ^ 24): every one of them gets the
// same bits (a + b == b + a in floating point).
__device__ __forceinline__ float sum_split(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    v += __shfl_xor_sync(0xffffffffu, v, 16);
    return v;
}

// Rows of a tile when `groups` groups of warps share `rows` rows: R is the next compile-time
// count, the tile's rows past `rows` repeat its first and are not written.
#define TILE_ROWS(rows, groups) (((rows) + (groups) - 1) / (groups))

// A tile's R rows of a row-major matrix at `base` (rows of `width` floats): rows grp, grp +
// groups, ..., those past `rows` at row grp; and its R x 4 sums zeroed.
template <int R>
__device__ __forceinline__ void tile_start(const float* base, u64 width, u32 grp, u32 groups,
                                           u32 rows, const float* (&row)[R], float (&acc)[R][4]) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
        const u32 r = grp + (u32)j * groups;
        row[j] = base + (u64)(r < rows ? r : grp) * width;
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[j][c] = 0.0f;
    }
}

// Row groups of a tiled pass over `width` columns (8 quads of 4 a warp): as many as the block's
// warps allow, at most `rows`.
__device__ __forceinline__ u32 tile_groups(u32 width, u32 rows) {
    const u32 quads = (width / 4 + 7) / 8, warps = blockDim.x / 32;
    return max(1u, min(rows, warps / max(1u, quads)));
}

// F<R>(args...) with R the compile-time rows of a tile when `groups` row groups share `rows`
// rows.
#define TILE_CALL(rows, groups, F, ...)                         \
    switch (TILE_ROWS(rows, groups)) {                          \
    case 1: F<1>(__VA_ARGS__); break;                           \
    case 2: F<2>(__VA_ARGS__); break;                           \
    case 3: case 4: F<4>(__VA_ARGS__); break;                   \
    default: F<MAX_CHUNK>(__VA_ARGS__); break;                  \
    }

// One level of tile_finish: of each pair of slots (j, j + gap), j a multiple of 2 gap, the lane
// keeps the one `bit` selects, sends the other to the lane `mask` apart, and adds the one it
// receives (its partner's of the kept row) into slot j.
template <int R>
__device__ __forceinline__ void keep_half(float (&acc)[R][4], int gap, bool bit, u32 mask) {
#pragma unroll
    for (int j = 0; j + gap < R; j += 2 * gap)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const float send = bit ? acc[j][c] : acc[j + gap][c];
            const float keep = bit ? acc[j + gap][c] : acc[j][c];
            acc[j][c] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
        }
}

// Every sum of a tile completed on the lane of the SPLIT that writes it (tile row j's on the
// lane of part j % SPLIT), as a reduce-scatter: at lanes 8 apart each lane keeps the rows of
// its part's low bit and sends the others, at lanes 16 apart the rows of its high bit, so a
// row's sum is (own + lane ^ 8's) + (lane ^ 16's + lane ^ 24's), sum_split's order, in a third
// of its shuffles. Afterwards tile row j + part (j a multiple of 4) is in acc[j]: see
// tile_row. One row: sum_split on every lane.
template <int R> __device__ __forceinline__ void tile_finish(float (&acc)[R][4]) {
    const u32 part = (threadIdx.x % 32) / 8;
    if constexpr (R == 1) {
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[0][c] = sum_split(acc[0][c]);
    } else {
        keep_half<R>(acc, 1, part & 1, 8);
        if constexpr (R == 2) {
            // Parts 2 and 3 write nothing: theirs is sent whole.
#pragma unroll
            for (int c = 0; c < 4; ++c)
                acc[0][c] += __shfl_xor_sync(0xffffffffu, acc[0][c], 16);
        } else {
            keep_half<R>(acc, 2, part & 2, 16);
        }
    }
}

// The slots of a finished tile that hold sums (every 4th from 0; the first alone for 1 or 2
// rows), and the tile row slot j holds on this lane (tile_finish).
#define TILE_SLOT_STEP(R) ((R) >= 4 ? 4 : (R))
__device__ __forceinline__ u32 tile_row(int j) { return (u32)j + (threadIdx.x % 32) / 8; }


// y = x w + b as dense_r, for d_in and d_out multiples of 4 and 16-byte aligned x, y and w. A
// warp takes 32 columns (8 quads, lanes l and l ^ 8k sharing a quad) of the rows of its group.
template <int R>
__device__ __forceinline__ void dense_tile_r(const float* w, const float* b, u32 n, u32 D,
                                             const float* x, float* y, u32 rows, u32 groups) {
    const u32 warps = blockDim.x / 32, lane = threadIdx.x % 32, part = lane / 8;
    const u32 quads = (D / 4 + 7) / 8;  // warps a row group needs
    const u32 n4 = n / 4, per = (n4 + SPLIT - 1) / SPLIT;
    const u32 i0 = min(n4, part * per), i1 = min(n4, i0 + per);
    for (u32 task = threadIdx.x / 32; task < quads * groups; task += warps) {
        const u32 qb = task % quads, grp = task / quads;
        const u32 o = 4 * (qb * 8 + lane % 8);
        const u32 oc = o < D ? o : 0;
        const float* xr[R];
        float acc[R][4];
        tile_start<R>(x, n, grp, groups, rows, xr, acc);
        for (u32 i = i0; i < i1; ++i) {
            float4 wv[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) wv[k] = *(const float4*)(w + (u64)(4 * i + k) * D + oc);
#pragma unroll
            for (int j = 0; j < R; ++j) {
                const float4 xv = *(const float4*)(xr[j] + 4 * i);
                const float xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    MAC(acc[j][0], xs[k], wv[k].x);
                    MAC(acc[j][1], xs[k], wv[k].y);
                    MAC(acc[j][2], xs[k], wv[k].z);
                    MAC(acc[j][3], xs[k], wv[k].w);
                }
            }
        }
        tile_finish<R>(acc);
        if (o < D) {
            const float4 bv = *(const float4*)(b + o);
#pragma unroll
            for (int j = 0; j < R; j += TILE_SLOT_STEP(R)) {
                const u32 jj = tile_row(j), r = grp + jj * groups;
                if (jj < (u32)R && r < rows)
                    *(float4*)(y + (u64)r * D + o) = make_float4(
                        acc[j][0] + bv.x, acc[j][1] + bv.y, acc[j][2] + bv.z, acc[j][3] + bv.w);
            }
        }
    }
}

// y = x w + b for a narrow layer (the head): each output a team of NARROW_TEAM lanes that sums
// inputs NARROW_TEAM apart in order, then adds the lanes' sums by a fixed butterfly. The team
// is fixed, not fitted to `rows`: a row's sums must not depend on how many rows share its pass
// (a member of a population acts on more rows a block than the same agent alone).
#define NARROW_TEAM 16
__device__ void dense_narrow(const float* w, const float* b, u32 n, u32 D, const float* x,
                             float* y, u32 rows) {
    const u32 outs = rows * D, team = NARROW_TEAM;
    const u32 me = threadIdx.x % team;
    // Whole warps run the butterfly; a thread past the last output adds zeros.
    const u32 span = (outs * team + 31) / 32 * 32;
    for (u32 k = threadIdx.x; k < span; k += blockDim.x) {
        const u32 out = k / team;
        float acc = 0.0f;
        if (out < outs) {
            const u32 r = out / D, o = out % D;
            const float* xr = x + (u64)r * n;
            for (u32 i = me; i < n; i += team) MAC(acc, xr[i], w[(u64)i * D + o]);
        }
        for (u32 m = 1; m < team; m *= 2) acc += __shfl_xor_sync(0xffffffffu, acc, m);
        if (out < outs && me == 0) y[out] = acc + b[out % D];
    }
}

// dense, dense_grads and dense_input_grads are out of line (__noinline__): each is called from
// several places and instantiates its tiles for several row counts; inlined, they made the
// module 2.7x larger and its NVRTC compile (a run's first, before the kernel cache has it)
// about 6x longer, for no measured gain (docs/PERFORMANCE.md, #13).
__device__ __noinline__ void dense(const float* p, Layer d, const float* x, float* y, u32 rows) {
    const u32 D = d.d_out;
    // y is shared too, but told so as well the compiler narrows the pointers to 32-bit shared
    // addresses and ptxas spills in epoch_steps (60 / 96 bytes against none; PERFORMANCE.md).
    assume_shared(p, x);
    if (D <= 8) {
        dense_narrow(p + d.w, p + d.b, d.d_in, D, x, y, rows);
        return;
    }
    const float* w = p + d.w;
    const float* b = p + d.b;
    // A call takes at most MAX_CHUNK rows a group; more rows (the training pass's two chunks of
    // observations) are taken in turns. A row's sums do not depend on the rows beside it.
    if ((d.d_in | D) % 4 == 0 && aligned16(x) && aligned16(y) && aligned16(w) && aligned16(b) &&
        blockDim.x % 32 == 0) {
        const u32 groups = tile_groups(D, rows), most = MAX_CHUNK * groups;
        for (u32 r0 = 0; r0 < rows; r0 += most) {
            const u32 n = min(most, rows - r0);
            const float* xs = x + (u64)r0 * d.d_in;
            float* ys = y + (u64)r0 * D;
            TILE_CALL(n, groups, dense_tile_r, w, b, d.d_in, D, xs, ys, n, groups);
        }
        return;
    }
    u32 groups = D >= blockDim.x ? 1 : blockDim.x / D;
    groups = max(1u, min(groups, rows));
    const u32 most = MAX_CHUNK * groups;
    for (u32 r0 = 0; r0 < rows; r0 += most) {
        const u32 n = min(most, rows - r0), R = (n + groups - 1) / groups;
        const float* xs = x + (u64)r0 * d.d_in;
        float* ys = y + (u64)r0 * D;
        switch (R) {
        case 1: dense_r<1>(w, b, d.d_in, D, xs, ys, n, groups); break;
        case 2: dense_r<2>(w, b, d.d_in, D, xs, ys, n, groups); break;
        case 3: dense_r<3>(w, b, d.d_in, D, xs, ys, n, groups); break;
        case 4: dense_r<4>(w, b, d.d_in, D, xs, ys, n, groups); break;
        default: dense_r<MAX_CHUNK>(w, b, d.d_in, D, xs, ys, n, groups); break;
        }
    }
}

// The buffers of one forward pass over `chunk` rows: per hidden layer the pre-activation h
// (after the norm), the normalized input xh and 1/sigma per row (norm only), the activation a;
// the head's output (advantages when dueling), the value, the Q-values. An inference pass may
// point h, xh and a of a layer at one buffer.
struct Pass {
    float* h[MAX_HIDDEN];
    float* xh[MAX_HIDDEN];
    float* rs[MAX_HIDDEN];
    float* a[MAX_HIDDEN];
    float* head;
    float* v;
    float* q;
};

// One forward pass of forward_all: `rows` inputs x over the network p into the buffers s; `mu`
// is rows floats of scratch.
struct Fwd {
    const float* p;
    const float* x;
    u32 rows;
    const Pass* s;
    float* mu;
};

// The forward passes f[0..n) over networks of one layout, in lockstep: each stage of every pass
// (a layer's dense pass, its norm, its activation; the head) before the block's barrier, so that
// the passes share the barriers and a warp done with one pass's tiles goes on to the next's. A
// pass's sums do not depend on the passes beside it.
__device__ void forward_all(const u64* lw, int act, const Fwd* f, u32 n) {
    u32 L = (u32)lw[0];
    int use_norm = (int)lw[3];
    for (u32 l = 0; l < L; ++l) {
        Layer d = hidden_layer(lw, l);
        u32 w = d.d_out;
        for (u32 q = 0; q < n; ++q)
            dense(f[q].p, d, l == 0 ? f[q].x : f[q].s->a[l - 1], f[q].s->h[l], f[q].rows);
        __syncthreads();
        if (use_norm) {
            for (u32 q = 0; q < n; ++q) {
                const Pass& s = *f[q].s;
                for (u32 r = threadIdx.x; r < f[q].rows; r += blockDim.x)
                    norm_stats(s.h[l] + (u64)r * w, w, &f[q].mu[r], &s.rs[l][r]);
            }
            __syncthreads();
            for (u32 q = 0; q < n; ++q) {
                const Pass& s = *f[q].s;
                const float* gamma = f[q].p + d.g;
                const float* beta = f[q].p + d.beta;
                for (u32 k = threadIdx.x; k < f[q].rows * w; k += blockDim.x) {
                    u32 r = k / w, j = k % w;
                    float xh = (s.h[l][k] - f[q].mu[r]) * s.rs[l][r];
                    s.xh[l][k] = xh;
                    s.h[l][k] = xh * gamma[j] + beta[j];
                }
            }
            __syncthreads();
        }
        for (u32 q = 0; q < n; ++q) {
            const Pass& s = *f[q].s;
            assume_shared(s.h[l], s.a[l]);
            for (u32 k = threadIdx.x; k < f[q].rows * w; k += blockDim.x)
                s.a[l][k] = act_f(s.h[l][k], act);
        }
        __syncthreads();
    }
    Layer hd = head_layer(lw, 0);
    u32 A = hd.d_out;
    int dueling = (int)lw[4];
    for (u32 q = 0; q < n; ++q) {
        const Pass& s = *f[q].s;
        const float* last = L == 0 ? f[q].x : s.a[L - 1];
        dense(f[q].p, hd, last, dueling ? s.head : s.q, f[q].rows);
        if (dueling) dense(f[q].p, head_layer(lw, 1), last, s.v, f[q].rows);
    }
    __syncthreads();
    if (dueling) {
        for (u32 q = 0; q < n; ++q) {
            const Pass& s = *f[q].s;
            for (u32 r = threadIdx.x; r < f[q].rows; r += blockDim.x) {
                const float* ar = s.head + (u64)r * A;
                float mean = 0.0f;
                for (u32 j = 0; j < A; ++j) mean += ar[j];
                mean /= (float)A;
                for (u32 j = 0; j < A; ++j) s.q[(u64)r * A + j] = s.v[r] + ar[j] - mean;
            }
        }
        __syncthreads();
    }
}

// Forward pass of `rows` inputs x over the network p; `mu` is rows floats of scratch.
__device__ void forward(const float* p, const u64* lw, int act, const float* x, u32 rows,
                        const Pass& s, float* mu) {
    const Fwd f = {p, x, rows, &s, mu};
    forward_all(lw, act, &f, 1);
}

// The rows of a chunk that belong to one group of the batch: rows [r0, r1) of the chunk add
// their gradient to the group's slot (written by the group's first rows, added to after). A
// chunk holds whole groups while they fit in it, or a piece of a group larger than a chunk, so
// that a group's rows are summed in the same pieces, from the group's start, whatever else
// shares its chunk.
struct Seg {
    u32 r0, r1, grp;
    int first, last;  // the group's first rows; its last
    float* slot;
};

// t[0..4) = v (first) or t[c] + v[c]: one float4 store where t is 16-byte aligned (a slot's
// rows are, where its layer's offsets are whole float4s: the slots are P4 floats apart, in a
// whole allocation), else four. A gradient slot is written once a step, and the block's
// stores (the whole network's parameters) all go out before the member's barrier.
__device__ __forceinline__ void add_quad(float* t, float4 v, int first) {
    if (aligned16(t)) {
        if (!first) {
            const float4 o = *(const float4*)t;
            v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
        }
        *(float4*)t = v;
        return;
    }
    const float a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int c = 0; c < 4; ++c) t[c] = first ? a[c] : t[c] + a[c];
}

// Adds (or, for a group's first rows, writes) a dense layer's parameter gradients over each
// segment's rows to its slot: dw[i][o] = sum_r x[r][i] dy[r][o], db[o] = sum_r dy[r][o], the
// rows in order. One thread per (i, o); a warp reads 32 neighbouring dy values and broadcasts x.
__device__ __noinline__ void dense_grads(const Seg* segs, u32 nseg, Layer d, const float* x, const float* dy) {
    const u32 D = d.d_out, n = d.d_in;
    assume_shared(segs, x, dy);
    if ((n | D) % 4 == 0 && aligned16(x) && aligned16(dy)) {
        // Tiles of 4 inputs x 4 outputs a thread (each pair of float4 loads feeds 16 products),
        // the rows in order as above; a warp's lanes take neighbouring output quads.
        const u32 oq = D / 4, tiles = (n / 4) * oq;
        for (u32 k = threadIdx.x; k < tiles + oq; k += blockDim.x) {
            for (u32 q = 0; q < nseg; ++q) {
                const Seg sg = segs[q];
                if (k >= tiles) {
                    const u32 o = 4 * (k - tiles);
                    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    for (u32 r = sg.r0; r < sg.r1; ++r) {
                        const float4 g = *(const float4*)(dy + (u64)r * D + o);
                        acc.x += g.x; acc.y += g.y; acc.z += g.z; acc.w += g.w;
                    }
                    add_quad(sg.slot + d.b + o, acc, sg.first);
                    continue;
                }
                const u32 i = 4 * (k / oq), o = 4 * (k % oq);
                float acc[4][4];
#pragma unroll
                for (int a = 0; a < 4; ++a)
#pragma unroll
                    for (int c = 0; c < 4; ++c) acc[a][c] = 0.0f;
                for (u32 r = sg.r0; r < sg.r1; ++r) {
                    const float4 xv = *(const float4*)(x + (u64)r * n + i);
                    const float4 g = *(const float4*)(dy + (u64)r * D + o);
                    const float xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                    for (int a = 0; a < 4; ++a) {
                        MAC(acc[a][0], xs[a], g.x);
                        MAC(acc[a][1], xs[a], g.y);
                        MAC(acc[a][2], xs[a], g.z);
                        MAC(acc[a][3], xs[a], g.w);
                    }
                }
                float* gw = sg.slot + d.w;
#pragma unroll
                for (int a = 0; a < 4; ++a)
                    add_quad(gw + (u64)(i + a) * D + o,
                             make_float4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]), sg.first);
            }
        }
        return;
    }
    for (u32 k = threadIdx.x; k < (n + 1) * D; k += blockDim.x) {
        const u32 i = k / D, o = k % D;
        for (u32 q = 0; q < nseg; ++q) {
            const Seg sg = segs[q];
            float acc = 0.0f;
            if (i < n) {
                for (u32 r = sg.r0; r < sg.r1; ++r) acc += x[r * n + i] * dy[r * D + o];
                float* gw = sg.slot + d.w;
                gw[k] = sg.first ? acc : gw[k] + acc;
            } else {
                for (u32 r = sg.r0; r < sg.r1; ++r) acc += dy[r * D + o];
                float* gb = sg.slot + d.b;
                gb[o] = sg.first ? acc : gb[o] + acc;
            }
        }
    }
}

// dx[r][i] (+)= sum_o dy[r][o] w[i][o]. Thread (i, g) takes input i of R rows (as dense_r) and
// starts its sums at output i mod d_out, wrapping (a fixed order of its own): neighbouring
// threads then read neighbouring banks of the weights' row-major rows instead of one bank d_out
// floats apart, and each weight read serves R rows.
template <int R>
__device__ __forceinline__ void dense_input_grads_r(const float* w, u32 n, u32 D, const float* dy,
                                                    float* dx, u32 rows, u32 groups,
                                                    int accumulate) {
    for (u32 k = threadIdx.x; k < groups * n; k += blockDim.x) {
        const u32 i = k % n, g = k / n;
        const float* gr[R];
        float acc[R];
#pragma unroll
        for (int j = 0; j < R; ++j) {
            const u32 r = g + (u32)j * groups;
            gr[j] = dy + (r < rows ? r : g) * D;
            acc[j] = 0.0f;
        }
        const float* wi = w + i * D;
        u32 o = i % D;
#pragma unroll 4
        for (u32 m = 0; m < D; ++m) {
            const float wv = wi[o];
#pragma unroll
            for (int j = 0; j < R; ++j) acc[j] += gr[j][o] * wv;
            o = o + 1 == D ? 0 : o + 1;
        }
#pragma unroll
        for (int j = 0; j < R; ++j) {
            const u32 r = g + (u32)j * groups;
            if (r < rows) {
                float* t = dx + r * n + i;
                *t = accumulate ? *t + acc[j] : acc[j];
            }
        }
    }
}

// dx (+)= dy w^T as dense_input_grads_r, for d_in and d_out multiples of 4 and 16-byte aligned
// dy, dx and w: a thread takes 4 neighbouring inputs of R rows and one of SPLIT contiguous parts
// of the outputs, starting its part at its own quad (wrapping) so that the 8 lanes of a phase
// read the weights' rows at different banks. Sums as dense_tile_r (fixed order, fused).
template <int R>
__device__ __forceinline__ void dense_input_grads_tile_r(const float* w, u32 n, u32 D,
                                                         const float* dy, float* dx, u32 rows,
                                                         u32 groups, int accumulate) {
    const u32 warps = blockDim.x / 32, lane = threadIdx.x % 32, part = lane / 8;
    const u32 quads = (n / 4 + 7) / 8;
    const u32 d4 = D / 4, per = (d4 + SPLIT - 1) / SPLIT;
    const u32 o0 = min(d4, part * per), o1 = min(d4, o0 + per), len = o1 - o0;
    for (u32 task = threadIdx.x / 32; task < quads * groups; task += warps) {
        const u32 qb = task % quads, grp = task / quads;
        const u32 iq = qb * 8 + lane % 8;
        const u32 i = 4 * iq, ic = i < n ? i : 0;
        const float* gr[R];
        float acc[R][4];
        tile_start<R>(dy, D, grp, groups, rows, gr, acc);
        u32 oq = len ? o0 + iq % len : o0;
        for (u32 m = 0; m < len; ++m) {
            float4 wv[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) wv[k] = *(const float4*)(w + (u64)(ic + k) * D + 4 * oq);
#pragma unroll
            for (int j = 0; j < R; ++j) {
                const float4 g = *(const float4*)(gr[j] + 4 * oq);
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    MAC(acc[j][k], g.x, wv[k].x);
                    MAC(acc[j][k], g.y, wv[k].y);
                    MAC(acc[j][k], g.z, wv[k].z);
                    MAC(acc[j][k], g.w, wv[k].w);
                }
            }
            oq = oq + 1 == o1 ? o0 : oq + 1;
        }
        tile_finish<R>(acc);
        if (i < n) {
#pragma unroll
            for (int j = 0; j < R; j += TILE_SLOT_STEP(R)) {
                const u32 jj = tile_row(j), r = grp + jj * groups;
                if (jj < (u32)R && r < rows) {
                    float4* t = (float4*)(dx + (u64)r * n + i);
                    float4 v = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
                    if (accumulate) {
                        const float4 o = *t;
                        v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
                    }
                    *t = v;
                }
            }
        }
    }
}

__device__ __noinline__ void dense_input_grads(const float* p, Layer d, const float* dy, float* dx, u32 rows,
                                  int accumulate) {
    const u32 n = d.d_in;
    assume_shared(p, dy, dx);
    if ((n | d.d_out) % 4 == 0 && aligned16(dy) && aligned16(dx) && aligned16(p + d.w) &&
        blockDim.x % 32 == 0) {
        const u32 groups = tile_groups(n, rows);
        const float* w = p + d.w;
        TILE_CALL(rows, groups, dense_input_grads_tile_r, w, n, d.d_out, dy, dx, rows, groups,
                  accumulate);
        return;
    }
    u32 groups = n >= blockDim.x ? 1 : blockDim.x / n;
    groups = max(1u, min(groups, rows));
    const u32 R = (rows + groups - 1) / groups;
    const float* w = p + d.w;
    switch (R) {
    case 1: dense_input_grads_r<1>(w, n, d.d_out, dy, dx, rows, groups, accumulate); break;
    case 2: dense_input_grads_r<2>(w, n, d.d_out, dy, dx, rows, groups, accumulate); break;
    case 3: dense_input_grads_r<3>(w, n, d.d_out, dy, dx, rows, groups, accumulate); break;
    case 4: dense_input_grads_r<4>(w, n, d.d_out, dy, dx, rows, groups, accumulate); break;
    default:
        dense_input_grads_r<MAX_CHUNK>(w, n, d.d_out, dy, dx, rows, groups, accumulate);
        break;
    }
}

// Backward pass of the training forward `s` over `rows` rows from dq (rows x actions), adding
// the parameter gradients to the slots of the chunk's segments. bufa, bufb: rows x widest scratch; dadv rows x
// actions; dv, m1, m2: rows.
__device__ void backward(const float* p, const u64* lw, int act, const float* x, u32 rows,
                         const Pass& s, const float* dq, float* dadv, float* dv, float* bufa,
                         float* bufb, float* m1, float* m2, const Seg* segs, u32 nseg) {
    u32 L = (u32)lw[0];
    int use_norm = (int)lw[3];
    int dueling = (int)lw[4];
    Layer hd = head_layer(lw, 0);
    u32 A = hd.d_out;
    const float* head_dy = dq;
    if (dueling) {
        for (u32 r = threadIdx.x; r < rows; r += blockDim.x) {
            const float* g = dq + (u64)r * A;
            float sum = 0.0f;
            for (u32 j = 0; j < A; ++j) sum += g[j];
            dv[r] = sum;
            float mean = sum / (float)A;
            for (u32 j = 0; j < A; ++j) dadv[(u64)r * A + j] = g[j] - mean;
        }
        __syncthreads();
        head_dy = dadv;
    }
    const float* last = L == 0 ? x : s.a[L - 1];
    dense_grads(segs, nseg, hd, last, head_dy);
    if (dueling) dense_grads(segs, nseg, head_layer(lw, 1), last, dv);
    if (L == 0) { __syncthreads(); return; }
    dense_input_grads(p, hd, head_dy, bufa, rows, 0);
    __syncthreads();
    if (dueling) {
        dense_input_grads(p, head_layer(lw, 1), dv, bufa, rows, 1);
        __syncthreads();
    }
    for (int l = (int)L - 1; l >= 0; --l) {
        Layer d = hidden_layer(lw, (u32)l);
        u32 w = d.d_out;
        // bufa: gradient at the activation's output; bufb: at the norm's output, then at the
        // dense output.
        assume_shared(s.h[l], bufa, bufb);
        for (u32 k = threadIdx.x; k < rows * w; k += blockDim.x)
            bufb[k] = bufa[k] * act_d(s.h[l][k], act);
        __syncthreads();
        if (use_norm) {
            const float* gamma = p + d.g;
            for (u32 r = threadIdx.x; r < rows; r += blockDim.x) {
                float a1 = 0.0f, a2 = 0.0f;
                for (u32 j = 0; j < w; ++j) {
                    float g = bufb[(u64)r * w + j] * gamma[j];
                    a1 += g;
                    a2 += g * s.xh[l][(u64)r * w + j];
                }
                m1[r] = a1 / (float)w;
                m2[r] = a2 / (float)w;
            }
            // The norm's parameters: dgamma[j] = sum_r dh xhat, dbeta[j] = sum_r dh.
            for (u32 j = threadIdx.x; j < w; j += blockDim.x) {
                for (u32 q = 0; q < nseg; ++q) {
                    const Seg seg = segs[q];
                    float ga = 0.0f, be = 0.0f;
                    for (u32 r = seg.r0; r < seg.r1; ++r) {
                        float dd = bufb[(u64)r * w + j];
                        ga += dd * s.xh[l][(u64)r * w + j];
                        be += dd;
                    }
                    float* sg = seg.slot + d.g + j;
                    float* sb = seg.slot + d.beta + j;
                    *sg = seg.first ? ga : *sg + ga;
                    *sb = seg.first ? be : *sb + be;
                }
            }
            __syncthreads();
            for (u32 k = threadIdx.x; k < rows * w; k += blockDim.x) {
                u32 r = k / w, j = k % w;
                bufb[k] = s.rs[l][r] * (bufb[k] * gamma[j] - m1[r] - s.xh[l][k] * m2[r]);
            }
            __syncthreads();
        }
        const float* xin = l == 0 ? x : s.a[l - 1];
        dense_grads(segs, nseg, d, xin, bufb);
        if (l > 0) dense_input_grads(p, d, bufb, bufa, rows, 0);
        __syncthreads();
    }
}

// A sum of squares in a fixed order: each thread's own sum `acc` (of its elements, thread
// strides), a butterfly within each warp, then the warps' sums in order; red holds a float a
// warp. The block's thread 0 gets the result.
__device__ float block_sum_lanes(float acc, float* red) {
    for (u32 m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = acc;
    __syncthreads();
    float out = 0.0f;
    if (threadIdx.x == 0)
        for (u32 w = 0; w < (blockDim.x + 31) / 32; ++w) out += red[w];
    __syncthreads();
    return out;
}

// out[j] = sum over h in [0, G) of part[h * stride + j], h in order, for j in [j0, j1): one
// thread a j, SLOTS_IN_FLIGHT slots' loads issued before they are added: an agent alone has 16
// slots, so a parameter's sum waits one trip to L2 (8 at a time measured 0.8 us an update
// slower on the H200, docs/PERFORMANCE.md, #13). Returns the thread's sum of the squares of its
// out[j], in j order: block_sum_lanes's `acc` for the range, without reading out back.
#define SLOTS_IN_FLIGHT 16
__device__ float sum_slots(const float* part, u64 stride, u32 G, u64 j0, u64 j1, float* out) {
    float sq = 0.0f;
    for (u64 j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        float acc = 0.0f;
        for (u32 h = 0; h < G; h += SLOTS_IN_FLIGHT) {
            float v[SLOTS_IN_FLIGHT];
#pragma unroll
            for (int k = 0; k < SLOTS_IN_FLIGHT; ++k)
                if (h + k < G) v[k] = __ldcg(part + (u64)(h + k) * stride + j);
#pragma unroll
            for (int k = 0; k < SLOTS_IN_FLIGHT; ++k)
                if (h + k < G) acc += v[k];
        }
        out[j] = acc;
        sq += acc * acc;
    }
    return sq;
}

// sum over h in [0, G) of v[h], h in order, the same value in every thread of the block: the
// block loads blockDim.x terms at once into `red` (blockDim.x floats), then every thread adds
// them.
__device__ float sum_parts(const float* v, u32 G, float* red) {
    float total = 0.0f;
    for (u32 h0 = 0; h0 < G; h0 += blockDim.x) {
        const u32 n = min(blockDim.x, G - h0);
        if (threadIdx.x < n) red[threadIdx.x] = __ldcg(v + (u64)(h0 + threadIdx.x));
        __syncthreads();
        for (u32 h = 0; h < n; ++h) total += red[h];
        __syncthreads();
    }
    return total;
}

// A member's blocks meet: at their cluster's barrier where they are one cluster, else at their
// grid barrier.
__device__ __forceinline__ void member_barrier(u32* bar, u32 G, bool clustered) {
    if (clustered)
        cluster_barrier();
    else
        blocks_barrier(bar, G);
}

// Threads a block: foxhunt-memory reads the launch bounds back from the compiled kernel. More
// threads a block hide more latency on the multiprocessor a block has to itself, but cap the
// registers a thread (65,536 a multiprocessor).
#define EPOCH_THREADS 256

#define EPOCH_PARAMS                                                                              \
    const float* features, const double* open, const double* close, const u32* session,          \
        const u32* contract, u32 cols, u32 split_start, u32 split_end, u32 lookback,             \
        int max_position, float upnl_scale, double tick_size, double multiplier,                 \
        double cost_per_side, double slippage_price, u32 episode_steps, double reward_scale,     \
        double risk_penalty, int flatten_at_close, u32 n_env, u64 cap_rows, u32 nstep,           \
        float gamma, u32 batch, u64 n_params, int act, int double_dqn,                           \
        int loss_kind, float delta, float clip, float b1, float b2, float weight_decay,          \
        float tau, u32 steps, u32 chunk, u32 slots, u32 adam_shared, const u64 *members

#define EPOCH_ARGS                                                                                \
    features, open, close, session, contract, cols, split_start, split_end, lookback,            \
        max_position, upnl_scale, tick_size, multiplier, cost_per_side, slippage_price,          \
        episode_steps, reward_scale, risk_penalty, flatten_at_close, n_env, cap_rows, nstep,     \
        gamma, batch, n_params, act, double_dqn, loss_kind, delta, clip, b1, b2, weight_decay,   \
        tau, steps, chunk, slots, adam_shared, members

// The block's shared memory besides the networks and the chunk's buffers (each kernel's static
// shared memory, which foxhunt-memory reads back).
struct EpochShared {
    float red[EPOCH_THREADS];
    float lsum[3];
    Drawn drawn[MAX_CHUNK];
    Seg segs[MAX_CHUNK];
    // The barrier object that counts the bytes of the updated networks a block receives.
    __align__(8) u64 nets_bar;
    // The member's words and the layout words: every pass reads the layout, layer by layer.
    Member mb;
    u64 lws[LAYOUT_WORDS];
    // Where Adam's moments and the summed gradient live between launches, while mb's point at
    // the block's shared copies of its slice (adam_shared).
    float* slice_home[3];
};
__shared__ EpochShared epoch_sm;

// The kernels' body: `clustered` where the member's blocks are one thread-block cluster
// (blockIdx.x is then the block's rank in it), else they meet at the grid barrier.
template <bool clustered>
__device__ __forceinline__ void epoch_body(EPOCH_PARAMS) {
    EpochShared& sm = epoch_sm;
    extern __shared__ float sh[];
    float* red = sm.red;
    float* lsum = sm.lsum;
    Drawn* drawn = sm.drawn;
    Seg* segs = sm.segs;
    u64& nets_bar = sm.nets_bar;
    Member& mb = sm.mb;
    u64* lws = sm.lws;
    const u32 G = gridDim.x, g = blockIdx.x;
    const u64 P = n_params;
    for (u32 k = threadIdx.x; k < MEMBER_WORDS; k += blockDim.x)
        ((u64*)&mb)[k] = members[(u64)blockIdx.y * MEMBER_WORDS + k];
    __syncthreads();
    const u64* lw = lws;
    {
        const u64* from = mb.layout;
        const u32 words = NET_HEADER + (u32)from[0] * NET_LAYER + 4 * (1 + (u32)(from[4] != 0));
        for (u32 k = threadIdx.x; k < words; k += blockDim.x) lws[k] = from[k];
        __syncthreads();
    }
    const u32 L = (u32)lw[0];
    const u32 A = (u32)lw[1];
    const u32 dim = (u32)lw[2];
    const u32 C = chunk;
    const Market mk = {features, open, close, session, contract, cols};
    u32 widest = A + 1;
    for (u32 l = 0; l < L; ++l) widest = max(widest, hidden_layer(lw, l).d_out);

    // Shared memory (foxhunt-memory's shared_bytes counts it, adam_slice_floats the slice's
    // arrays): the online and target networks, Adam's operands of the block's slice where they
    // fit, then the chunk's buffers, those of whole rows first so that they stay 16-byte aligned
    // (the tiled passes need it). Each network padded to whole float4s: P4 floats, also the
    // distance between the gradient slots in global memory (foxhunt-memory's epoch.rs allocates
    // slots * P4), so that a slot's rows are 16-byte aligned as well.
    const u64 P4 = (P + 3) & ~(u64)3;
    const int use_norm = (int)lw[3];
    float* wo = sh;
    float* wt = wo + P4;
    // Where the host found room (adam_shared floats each, from the float4 the block's parameter
    // slice starts in; 0: none), Adam's moments and the summed gradient of the slice are kept
    // here for the launch, and Adam reads the parameters from the networks' shared copies: a
    // step's Adam then makes no trip to L2 before its arithmetic, and stores only the networks.
    float* kept = wt + P4;
    float* cur = kept + 3 * (u64)adam_shared;
    auto take = [&](u64 n) { float* at = cur; cur += n; return at; };
    // The training pass: a chunk's observations and, right after its rows, its next
    // observations (the online network's Q of them, for double DQN, in the same pass: each
    // weight loaded serves both), kept for the backward pass over the first rows.
    const u64 T = 2 * (u64)C;
    float* x = take(T * dim);
    Pass tr;
    for (u32 l = 0; l < L; ++l) {
        u32 w = hidden_layer(lw, l).d_out;
        tr.h[l] = take(T * w);
        tr.xh[l] = use_norm ? take(T * w) : tr.h[l];
        tr.a[l] = take(T * w);
    }
    float* t0 = take((u64)C * widest);
    float* t1 = take((u64)C * widest);
    for (u32 l = 0; l < L; ++l) tr.rs[l] = take(T);
    tr.head = take(T * A);
    tr.v = take(T);
    tr.q = take(T * A);
    Pass inf;  // inference passes: every layer in ping-pong scratch
    for (u32 l = 0; l < L; ++l) {
        float* b = (l % 2 == 0) ? t0 : t1;
        inf.h[l] = b; inf.xh[l] = b; inf.a[l] = b; inf.rs[l] = take(C);
    }
    inf.head = take((u64)C * A);
    inf.v = take(C);
    float* q_nt = take((u64)C * A);
    float* dq = take((u64)C * A);
    float* dadv = take((u64)C * A);
    float* dv = take(C);
    float* mu = take(T);
    float* mm1 = take(C);
    float* mm2 = take(C);
    // The backward pass's scratch: the inference passes are done with t0 and t1 by then.
    float* bufa = t0;
    float* bufb = t1;

    load_net(wo, mb.online, P);
    load_net(wt, mb.target, P);
    // A cluster's blocks hand out their updated slices by multicast bulk copies and signalling
    // stores (sync.cuh), each counted on the receiving block's nets_bar, and a block waits for
    // the networks' bytes where it next reads them (nets_ready), not at a barrier. Measured
    // against the cluster stores and barrier before it: docs/PERFORMANCE.md, #13.
    if (clustered && threadIdx.x == 0) signal_init(&nets_bar);
    __syncthreads();
    bool nets_pending = false;  // updated weights still coming (the block's threads agree)
    u32 nets_parity = 0;
    auto nets_ready = [&]() {
        if (nets_pending) {
            signal_wait(&nets_bar, nets_parity);
            nets_parity ^= 1;
            nets_pending = false;
        }
    };

    const u32 e0 = (u32)((u64)g * n_env / G), e1 = (u32)((u64)(g + 1) * n_env / G);
    // The block's groups of batch rows, and the parameters of their slices.
    const u32 k0 = (u32)((u64)g * slots / G), k1 = (u32)((u64)(g + 1) * slots / G);
    const u64 p0 = (u64)k0 * P / slots, p1 = (u64)k1 * P / slots;
    if (adam_shared) {
        // The slice in (the gradient too: a launch whose steps do not learn leaves it as it
        // was); then the member's words point at the shared copies (generic pointers: every use
        // reads them from there), the global arrays' addresses kept to write the slice back when
        // the launch ends.
        float** at[3] = {&mb.m1g, &mb.m2g, &mb.grads};
        const u64 pq = p0 & ~(u64)3;
        for (u64 i = p0 + threadIdx.x; i < p1; i += blockDim.x)
            for (u32 k = 0; k < 3; ++k) kept[k * (u64)adam_shared + i - pq] = (*at[k])[i];
        __syncthreads();
        if (threadIdx.x == 0)
            for (u32 k = 0; k < 3; ++k) {
                sm.slice_home[k] = *at[k];
                *at[k] = (float*)((u64)(kept + k * (u64)adam_shared) - 4 * pq);
            }
        __syncthreads();
    }

    // Timestamps of step s (the member's block 0's view): times[STAMPS * s + k], k = 0 start, 1
    // the ring rows of every block written, 2 the first chunk sampled, 3 its forward passes and
    // TD terms done, 4 every chunk's backward done, 5 the gradient summed and its norm known, 6
    // Adam and the target update done on the block's slices, 7 every block holding the new
    // networks (in a cluster: the block's sends of them issued; the wait for their arrival comes
    // where they are next read, in the next step's acting or forward passes).
    auto stamp = [&](u32 s, u32 k) {
        if (g == 0 && threadIdx.x == 0) mb.times[STAMPS * (u64)s + k] = global_time();
    };
    for (u32 s = 0; s < steps; ++s) {
        const u64* st = mb.table + (u64)s * ST_WORDS;
        stamp(s, 0);
        if (st[ST_ACT]) {
            // Act: the block's environments, the training pass's 2 C rows at a time, greedy on
            // the online network with the exploration draws of step counter ST_COUNTER.
            float eps = word_f32(st[ST_EPSILON]);
            for (u32 c0 = e0; c0 < e1; c0 += (u32)T) {
                u32 rows = min((u32)T, e1 - c0);
                for (u32 k = threadIdx.x; k < rows * dim; k += blockDim.x)
                    x[k] = mb.env_obs[(u64)c0 * dim + k];
                __syncthreads();
                nets_ready();
                forward(wo, lw, act, x, rows, tr, mu);
                for (u32 r = threadIdx.x; r < rows; r += blockDim.x)
                    mb.env_actions[c0 + r] = (unsigned char)select_action(
                        tr.q + (u64)r * A, A, eps, mb.explore_seed, st[ST_COUNTER], c0 + r);
                __syncthreads();
            }
            // Step: one thread per environment; the step's replay row into the ring.
            Ring ring = {mb.r_t,      mb.r_pos,  mb.r_entry,       mb.r_action,
                         mb.r_reward, mb.r_done, st[ST_ROW_BASE]};
            for (u32 e = e0 + threadIdx.x; e < e1; e += blockDim.x)
                step_one(features, open, close, session, contract, cols, split_start, split_end,
                         lookback, max_position, upnl_scale, tick_size, mb.env_seed, multiplier,
                         cost_per_side, slippage_price, episode_steps, reward_scale, risk_penalty,
                         flatten_at_close, mb.t_arr, mb.pos_arr, mb.entry_arr, mb.steps_arr,
                         mb.episode_arr, mb.env_actions, mb.env_obs, mb.rewards, mb.dones, e,
                         &ring, false);
            // Their next observations, by the whole block: a team of lanes an environment
            // (env.cuh's observe, what step_one would write, from the environments' new state
            // read back from memory). Inline: out of line it measured slower.
            __syncthreads();
            const u32 envs = e1 - e0, lanes = max(1u, blockDim.x / max(1u, envs));
            for (u32 k = threadIdx.x; k < envs * lanes; k += blockDim.x) {
                const u32 e = e0 + k / lanes;
                observe(mk, lookback, max_position, upnl_scale, tick_size, mb.t_arr[e],
                        mb.pos_arr[e], mb.entry_arr[e], mb.env_obs + (u64)e * dim, k % lanes,
                        lanes);
            }
        }
        if (!st[ST_LEARN]) {
            __syncthreads();
            for (u32 k = 1; k < STAMPS; ++k) stamp(s, k);
            continue;
        }
        // The ring rows of every block are written before any block samples.
        member_barrier(mb.bar, G, clustered);
        stamp(s, 1);

        // The block's groups of batch rows, chunk by chunk (whole groups while they fit, a
        // larger group in pieces: see Seg): sampled (the draws one thread per row, the
        // observations by the whole block, into shared memory and the batch buffers), then
        // learned from into the groups' slots.
        const u64 written = st[ST_WRITTEN], draw = st[ST_DRAW];
        bool none = true;  // no chunk in the block yet
        auto first_row = [&](u32 grp) { return (u32)((u64)grp * batch / slots); };
        for (u32 grp = k0; grp < k1; ++grp) {
            if (first_row(grp + 1) > first_row(grp)) continue;
            // A group without rows (a batch smaller than the groups): its slot adds nothing.
            float* slot = mb.part + (u64)grp * P4;
            for (u64 i = threadIdx.x; i < P; i += blockDim.x) slot[i] = 0.0f;
            if (threadIdx.x < 3) mb.loss_part[3 * grp + threadIdx.x] = 0.0f;
        }
        // The next group, and its rows already learned from.
        u32 gnext = k0, done = 0;
        while (true) {
            while (gnext < k1 && first_row(gnext + 1) == first_row(gnext)) ++gnext;
            if (gnext >= k1) break;
            const u32 c0 = first_row(gnext) + done;
            u32 rows = 0, nseg = 0;
            while (gnext < k1 && rows < C) {
                const u32 size = first_row(gnext + 1) - first_row(gnext), left = size - done;
                const u32 take = min(left, C - rows);
                if (left == 0) {
                    ++gnext;
                    continue;
                }
                // A group that does not fit whole starts the gnext chunk (or, larger than a
                // chunk, is cut into pieces from its start).
                if (take < left && rows > 0) break;
                if (threadIdx.x == 0)
                    segs[nseg] = Seg{rows, rows + take, gnext, done == 0, take == left,
                                     mb.part + (u64)gnext * P4};
                ++nseg;
                rows += take;
                done += take;
                if (done == size) {
                    ++gnext;
                    done = 0;
                }
            }
            float* nx = x + (u64)rows * dim;
            if (threadIdx.x < rows)
                drawn[threadIdx.x] = sample_draw<true>(
                    mb.r_t, mb.r_pos, mb.r_entry, mb.r_action, mb.r_reward, mb.r_done, n_env,
                    cap_rows, written, nstep, gamma, mb.sample_seed, draw, mb.b_actions,
                    mb.b_returns, mb.b_discounts, mb.b_weights, c0 + threadIdx.x);
            __syncthreads();
            // The observations of every row of the chunk at once (one trip to memory for all).
            const u32 feats = lookback * cols;
            for (u32 k = threadIdx.x; k < 2 * rows * (feats + 1); k += blockDim.x) {
                const u32 r = k / (2 * (feats + 1)), rest = k % (2 * (feats + 1));
                const u32 next = rest / (feats + 1), e = rest % (feats + 1);
                const Drawn d = drawn[r];
                if (!d.ok) continue;
                float* out = (next ? nx : x) + (u64)r * dim;
                const u32 t = next ? d.t1 : d.t0;
                if (e < feats)
                    out[e] = lookback_feature(mk, lookback, t, e);
                else if (next)
                    observe_state(mk, max_position, upnl_scale, tick_size, t, d.p1, d.e1,
                                  out + feats);
                else
                    observe_state(mk, max_position, upnl_scale, tick_size, t, d.p0, d.e0,
                                  out + feats);
            }
            __syncthreads();
            if (none) stamp(s, 2);
            for (u32 k = threadIdx.x; k < rows * dim; k += blockDim.x) {
                mb.b_obs[(u64)c0 * dim + k] = x[k];
                mb.b_next_obs[(u64)c0 * dim + k] = nx[k];
            }
            // The online network on the chunk's observations (and, for double DQN, on the next
            // ones right after them), and the target network on the next ones, in lockstep
            // (mm1, free until the backward pass, is the target pass's norm scratch).
            inf.q = q_nt;
            const Fwd passes[2] = {{wo, x, double_dqn ? 2 * rows : rows, &tr, mu},
                                   {wt, nx, rows, &inf, mm1}};
            nets_ready();
            forward_all(lw, act, passes, 2);
            const float* q_no = tr.q + (u64)rows * A;
            // TD loss per row.
            for (u32 r = threadIdx.x; r < rows; r += blockDim.x) {
                u32 b = c0 + r;
                float terms[3];
                td_row(tr.q + (u64)r * A, mb.b_actions[b], q_no + (u64)r * A,
                       q_nt + (u64)r * A, mb.b_returns[b], mb.b_discounts[b], mb.b_weights[b],
                       batch, A, double_dqn, loss_kind, delta, dq + (u64)r * A, terms);
                bufa[3 * r] = terms[0];
                bufa[3 * r + 1] = terms[1];
                bufa[3 * r + 2] = terms[2];
            }
            __syncthreads();
            // Each group's loss terms summed in row order by one thread, over its pieces.
            if (threadIdx.x == 0)
                for (u32 q = 0; q < nseg; ++q) {
                    const Seg sg = segs[q];
                    if (sg.first) lsum[0] = lsum[1] = lsum[2] = 0.0f;
                    for (u32 r = sg.r0; r < sg.r1; ++r)
                        for (u32 k = 0; k < 3; ++k) lsum[k] += bufa[3 * r + k];
                    if (sg.last)
                        for (u32 k = 0; k < 3; ++k) mb.loss_part[3 * sg.grp + k] = lsum[k];
                }
            __syncthreads();
            if (none) stamp(s, 3);
            backward(wo, lw, act, x, rows, tr, dq, dadv, dv, bufa, bufb, mm1, mm2, segs, nseg);
            none = false;
        }
        if (none) {
            stamp(s, 2);
            stamp(s, 3);
        }
        // Every block has its last step's networks whole before this barrier (a block without
        // rows has not waited yet), so no block's next sends can count towards a phase of the
        // barrier object that is still waiting for this step's bytes.
        nets_ready();
        stamp(s, 4);
        member_barrier(mb.bar, G, clustered);

        // The block's slices of the parameters: gradients summed over the slots in group
        // order, and each slice's sum of squares (a block of one group, as an agent alone has,
        // squares its sums as it makes them; its slice is the block's range, so each thread
        // meets the same elements in the same order either way).
        const float sq_own = sum_slots(mb.part, P4, slots, p0, p1, mb.grads);
        __syncthreads();
        if (k1 == k0 + 1) {
            const float sq = block_sum_lanes(sq_own, red);
            if (threadIdx.x == 0) mb.norm_part[k0] = sq;
        } else {
            for (u32 grp = k0; grp < k1; ++grp) {
                const u64 q0 = (u64)grp * P / slots, q1 = (u64)(grp + 1) * P / slots;
                float acc = 0.0f;
                for (u64 i = q0 + threadIdx.x; i < q1; i += blockDim.x)
                    acc += mb.grads[i] * mb.grads[i];
                const float sq = block_sum_lanes(acc, red);
                if (threadIdx.x == 0) mb.norm_part[grp] = sq;
            }
        }
        member_barrier(mb.bar, G, clustered);

        // The norm from the slices' parts in group order; Adam and the target update on the
        // block's slices.
        float norm = sqrtf(sum_parts(mb.norm_part, slots, red));
        stamp(s, 5);
        if (g == 0) {
            // The loss terms, groups interleaved (3 a group), loaded a third of the block's
            // threads' worth of groups a trip to L2 (an agent alone: 16 groups, one trip), each
            // term summed in group order as sum_parts sums it. Not sum_parts made generic over
            // interleaved series: that measured 0.3-0.5 us an update slower (docs/PERFORMANCE.md,
            // #13, twenty-first session).
            float l[3] = {0.0f, 0.0f, 0.0f};
            const u32 per_trip = blockDim.x / 3;
            for (u32 h0 = 0; h0 < slots; h0 += per_trip) {
                const u32 n = min(per_trip, slots - h0);
                if (threadIdx.x < 3 * n)
                    red[threadIdx.x] = __ldcg(mb.loss_part + 3 * h0 + threadIdx.x);
                __syncthreads();
                if (threadIdx.x == 0)
                    for (u32 h = 0; h < n; ++h)
                        for (u32 k = 0; k < 3; ++k) l[k] += red[3 * h + k];
                __syncthreads();
            }
            if (threadIdx.x == 0) {
                float* out = mb.stats + 4 * st[ST_STAT];
                out[0] = l[0] / (float)batch;
                out[1] = l[1] / (float)batch;
                out[2] = l[2] / (float)batch;
                out[3] = norm;
            }
        }
        float lr = word_f32(st[ST_LR]), eps_c2 = word_f32(st[ST_EPS_C2]), cf = word_f32(st[ST_CF]);
        const u64 sync = st[ST_SYNC];
        const u64 stride = blockDim.x;
        // One parameter's Adam step and target update.
        auto update = [&](float& pv, float gv, float& mv, float& vv, float& tv) {
            adam_one(&pv, gv, &mv, &vv, norm, clip, lr, b1, b2, eps_c2, cf, weight_decay);
            if (sync == 2) tv = polyak_one(pv, tv, tau);
            else if (sync == 1) tv = pv;
        };
        // The slice's parameters outside its whole float4s [a0, a1) (at most 3 at each end), one
        // a thread. The agent's buffers are whole allocations, 16-byte aligned (as the host
        // promises); a loop here instead of the test raised the kernel's spills from 16 bytes to
        // 140.
        const u64 a0 = min((p0 + 3) & ~(u64)3, p1);
        const u64 a1 = max(p1 & ~(u64)3, a0);
        // Every block's whole float4s come by multicast, the other blocks' ends by signalling
        // stores; this block writes its own ends.
        if (clustered && threadIdx.x == 0)
            signal_expect(&nets_bar, (u32)(4 * (P - ((a0 - p0) + (p1 - a1))) * (sync ? 2 : 1)));
        // The parameters as the passes read them: the block's shared copies hold this step's
        // values (its own slice came back by the last hand-out, or was reloaded after the grid
        // barrier).
        const float* on = adam_shared ? wo : mb.online;
        const float* tg = adam_shared ? wt : mb.target;
        if (threadIdx.x < (a0 - p0) + (p1 - a1)) {
            const u64 e = threadIdx.x, i = e < a0 - p0 ? p0 + e : a1 + (e - (a0 - p0));
            float pv = on[i], mv = mb.m1g[i], vv = mb.m2g[i];
            float tv = sync == 2 ? tg[i] : 0.0f;
            update(pv, mb.grads[i], mv, vv, tv);
            mb.online[i] = pv;
            mb.m1g[i] = mv;
            mb.m2g[i] = vv;
            if (sync) mb.target[i] = tv;
            if (clustered) {
                wo[i] = pv;
                if (sync) wt[i] = tv;
                for (u32 r = 0; r < G; ++r)
                    if (r != g) {
                        signal_store(wo + i, r, pv, &nets_bar);
                        if (sync) signal_store(wt + i, r, tv, &nets_bar);
                    }
            }
        }
        // Whole float4s, one a thread at a time: four parameters a load and a store (two float4s
        // a thread loaded before their updates, or eight single parameters, measured slower:
        // docs/PERFORMANCE.md, #13). The cluster's copies get them by the multicast below.
        for (u64 i = a0 + 4 * threadIdx.x; i < a1; i += 4 * stride) {
            float4 pv = *(const float4*)(on + i);
            const float4 gv = *(const float4*)(mb.grads + i);
            float4 mv = *(const float4*)(mb.m1g + i);
            float4 vv = *(const float4*)(mb.m2g + i);
            float4 tv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (sync == 2) tv = *(const float4*)(tg + i);
            update(pv.x, gv.x, mv.x, vv.x, tv.x);
            update(pv.y, gv.y, mv.y, vv.y, tv.y);
            update(pv.z, gv.z, mv.z, vv.z, tv.z);
            update(pv.w, gv.w, mv.w, vv.w, tv.w);
            *(float4*)(mb.online + i) = pv;
            *(float4*)(mb.m1g + i) = mv;
            *(float4*)(mb.m2g + i) = vv;
            if (sync) *(float4*)(mb.target + i) = tv;
        }
        // The slice's stores, then the copy engine's reads of them: each writer's proxy fence,
        // then the block's barrier, then the copy.
        if (clustered) proxy_fence_global();
        __syncthreads();
        if (clustered && threadIdx.x == 0 && a1 > a0) {
            const unsigned short all = (unsigned short)((1u << G) - 1);
            bulk_multicast(wo + a0, mb.online + a0, a1 - a0, &nets_bar, all);
            if (sync) bulk_multicast(wt + a0, mb.target + a0, a1 - a0, &nets_bar, all);
        }
        stamp(s, 6);
        if (clustered) {
            nets_pending = true;
        } else {
            member_barrier(mb.bar, G, false);
            load_net(wo, mb.online, P);
            if (sync) load_net(wt, mb.target, P);
            __syncthreads();
        }
        stamp(s, 7);
    }
    // Nothing may still be copied into this block's memory when it exits.
    nets_ready();
    if (adam_shared) {
        __syncthreads();
        const u64 pq = p0 & ~(u64)3;
        for (u64 i = p0 + threadIdx.x; i < p1; i += blockDim.x)
            for (u32 k = 0; k < 3; ++k) sm.slice_home[k][i] = kept[k * (u64)adam_shared + i - pq];
    }
}

// The body compiled as two kernels, so that neither path carries the other's code: where a
// kernel holds any mbarrier instruction (the cluster's hand-out of the networks), ptxas puts a
// CTA-scope memory barrier before every release in it, the grid barrier's included (seen in
// NVRTC 12.9's CUBIN), which cost the grid path 1.5-1.8 us an update on an H100
// (docs/PERFORMANCE.md, #13). The host launches epoch_steps cooperatively, its blocks meeting
// at grid barriers, and epoch_steps_cluster with each member's blocks one cluster.
extern "C" __global__ void __launch_bounds__(EPOCH_THREADS, 1) epoch_steps(EPOCH_PARAMS) {
    epoch_body<false>(EPOCH_ARGS);
}

extern "C" __global__ void __launch_bounds__(EPOCH_THREADS, 1)
    epoch_steps_cluster(EPOCH_PARAMS) {
    if (cluster_blocks() != gridDim.x) __trap();  // the host's error: a member is one cluster
    epoch_body<true>(EPOCH_ARGS);
}
