// foxhunt's one-launch epoch: every step of a training epoch (act, environment step and replay
// write, sample, the DQN update, the target update) in one persistent cooperative kernel.
// Needs philox.cuh, env.cuh, env_step.cu (step_one), replay.cu (sample_row), dqn.cuh and sync.cuh
// (blocks_barrier) in the same module.
//
// Work is split by rows, not by neurons: block g of G owns environments [g n / G, (g + 1) n / G)
// and batch rows [g B / G, (g + 1) B / G), keeps the whole online and target networks in its
// shared memory, and runs complete forward and backward passes of its own rows, `chunk` rows at
// a time, with no other block. Blocks meet at a grid barrier only where data crosses between
// them: the replay rows every block samples from, the weight gradients (each block writes its
// partial sums to a slot of its own; block g then sums parameter slice g over the slots in block
// order), the gradient norm, and the updated weights. Every sum runs in a fixed order: a launch
// repeats itself exactly, and one launch of S steps equals S launches of one step.
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

__device__ void dense(const float* p, Layer d, const float* x, float* y, u32 rows) {
    const u32 D = d.d_out;
    u32 groups = D >= blockDim.x ? 1 : blockDim.x / D;
    groups = max(1u, min(groups, rows));
    const u32 R = (rows + groups - 1) / groups;
    const float* w = p + d.w;
    const float* b = p + d.b;
    switch (R) {
    case 1: dense_r<1>(w, b, d.d_in, D, x, y, rows, groups); break;
    case 2: dense_r<2>(w, b, d.d_in, D, x, y, rows, groups); break;
    case 3: dense_r<3>(w, b, d.d_in, D, x, y, rows, groups); break;
    case 4: dense_r<4>(w, b, d.d_in, D, x, y, rows, groups); break;
    default: dense_r<MAX_CHUNK>(w, b, d.d_in, D, x, y, rows, groups); break;
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

// Forward pass of `rows` inputs x over the network p; `mu` is rows floats of scratch.
__device__ void forward(const float* p, const u64* lw, int act, const float* x, u32 rows,
                        const Pass& s, float* mu) {
    u32 L = (u32)lw[0];
    int use_norm = (int)lw[3];
    for (u32 l = 0; l < L; ++l) {
        Layer d = hidden_layer(lw, l);
        u32 w = d.d_out;
        dense(p, d, l == 0 ? x : s.a[l - 1], s.h[l], rows);
        __syncthreads();
        if (use_norm) {
            for (u32 r = threadIdx.x; r < rows; r += blockDim.x) {
                const float* zr = s.h[l] + (u64)r * w;
                float mean = 0.0f;
                for (u32 j = 0; j < w; ++j) mean += zr[j];
                mean /= (float)w;
                float var = 0.0f;
                for (u32 j = 0; j < w; ++j) { float dd = zr[j] - mean; var += dd * dd; }
                var /= (float)w;
                mu[r] = mean;
                s.rs[l][r] = 1.0f / sqrtf(var + 1e-5f);
            }
            __syncthreads();
            const float* gamma = p + d.g;
            const float* beta = p + d.beta;
            for (u32 k = threadIdx.x; k < rows * w; k += blockDim.x) {
                u32 r = k / w, j = k % w;
                float xh = (s.h[l][k] - mu[r]) * s.rs[l][r];
                s.xh[l][k] = xh;
                s.h[l][k] = xh * gamma[j] + beta[j];
            }
            __syncthreads();
        }
        for (u32 k = threadIdx.x; k < rows * w; k += blockDim.x) s.a[l][k] = act_f(s.h[l][k], act);
        __syncthreads();
    }
    const float* last = L == 0 ? x : s.a[L - 1];
    Layer hd = head_layer(lw, 0);
    u32 A = hd.d_out;
    int dueling = (int)lw[4];
    dense(p, hd, last, dueling ? s.head : s.q, rows);
    if (dueling) dense(p, head_layer(lw, 1), last, s.v, rows);
    __syncthreads();
    if (dueling) {
        for (u32 r = threadIdx.x; r < rows; r += blockDim.x) {
            const float* ar = s.head + (u64)r * A;
            float mean = 0.0f;
            for (u32 j = 0; j < A; ++j) mean += ar[j];
            mean /= (float)A;
            for (u32 j = 0; j < A; ++j) s.q[(u64)r * A + j] = s.v[r] + ar[j] - mean;
        }
        __syncthreads();
    }
}

// Adds (or, for the first chunk, writes) a dense layer's parameter gradients over `rows` rows to
// the block's slot: dw[i][o] = sum_r x[r][i] dy[r][o], db[o] = sum_r dy[r][o]. One thread per
// (i, o); a warp reads 32 neighbouring dy values and broadcasts x.
__device__ void dense_grads(float* slot, Layer d, const float* x, const float* dy, u32 rows,
                            int first) {
    const u32 D = d.d_out, n = d.d_in;
    float* gw = slot + d.w;
    float* gb = slot + d.b;
    for (u32 k = threadIdx.x; k < (n + 1) * D; k += blockDim.x) {
        const u32 i = k / D, o = k % D;
        float acc = 0.0f;
        if (i < n) {
            for (u32 r = 0; r < rows; ++r) acc += x[r * n + i] * dy[r * D + o];
            gw[k] = first ? acc : gw[k] + acc;
        } else {
            for (u32 r = 0; r < rows; ++r) acc += dy[r * D + o];
            gb[o] = first ? acc : gb[o] + acc;
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

__device__ void dense_input_grads(const float* p, Layer d, const float* dy, float* dx, u32 rows,
                                  int accumulate) {
    const u32 n = d.d_in;
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
// the parameter gradients to the block's slot. bufa, bufb: rows x widest scratch; dadv rows x
// actions; dv, m1, m2: rows.
__device__ void backward(const float* p, const u64* lw, int act, const float* x, u32 rows,
                         const Pass& s, const float* dq, float* dadv, float* dv, float* bufa,
                         float* bufb, float* m1, float* m2, float* slot, int first) {
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
    dense_grads(slot, hd, last, head_dy, rows, first);
    if (dueling) dense_grads(slot, head_layer(lw, 1), last, dv, rows, first);
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
                float ga = 0.0f, be = 0.0f;
                for (u32 r = 0; r < rows; ++r) {
                    float dd = bufb[(u64)r * w + j];
                    ga += dd * s.xh[l][(u64)r * w + j];
                    be += dd;
                }
                float* sg = slot + d.g + j;
                float* sb = slot + d.beta + j;
                *sg = first ? ga : *sg + ga;
                *sb = first ? be : *sb + be;
            }
            __syncthreads();
            for (u32 k = threadIdx.x; k < rows * w; k += blockDim.x) {
                u32 r = k / w, j = k % w;
                bufb[k] = s.rs[l][r] * (bufb[k] * gamma[j] - m1[r] - s.xh[l][k] * m2[r]);
            }
            __syncthreads();
        }
        const float* xin = l == 0 ? x : s.a[l - 1];
        dense_grads(slot, d, xin, bufb, rows, first);
        if (l > 0) dense_input_grads(p, d, bufb, bufa, rows, 0);
        __syncthreads();
    }
}

// Sum of squares of v[0..n), in a fixed order (thread strides, then a fixed tree); red holds
// blockDim.x floats. The block's thread 0 gets the result.
__device__ float block_sumsq(const float* v, u64 n, float* red) {
    float acc = 0.0f;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) acc += v[i] * v[i];
    red[threadIdx.x] = acc;
    __syncthreads();
    for (u32 k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    float out = red[0];
    __syncthreads();
    return out;
}

// dst[0..n) = src[0..n) for the whole block, read through L2 (src is written by other blocks of
// the launch), four floats a load where both are 16-byte aligned (device buffers and the start
// of dynamic shared memory are).
__device__ void load_net(float* dst, const float* src, u64 n) {
    u64 n4 = (((u64)dst | (u64)src) & 15) == 0 ? n / 4 : 0;
    const float4* s4 = (const float4*)src;
    float4* d4 = (float4*)dst;
    for (u64 i = threadIdx.x; i < n4; i += blockDim.x) d4[i] = __ldcg(s4 + i);
    for (u64 i = 4 * n4 + threadIdx.x; i < n; i += blockDim.x) dst[i] = __ldcg(src + i);
}

#define EPOCH_PARAMS                                                                              \
    const float* features, const double* open, const double* close, const u32* session,          \
        const u32* contract, u32 cols, u32 split_start, u32 split_end, u32 lookback,             \
        int max_position, float upnl_scale, double tick_size, u64 env_seed, double multiplier,   \
        double cost_per_side, double slippage_price, u32 episode_steps, double reward_scale,     \
        double risk_penalty, int flatten_at_close, u32 *t_arr, int *pos_arr, double *entry_arr,  \
        u32 *steps_arr, u32 *episode_arr, unsigned char *env_actions, float *env_obs,             \
        float *rewards, unsigned char *dones, u32 n_env, u32 *r_t, int *r_pos, double *r_entry,  \
        unsigned char *r_action, float *r_reward, unsigned char *r_done, u64 cap_rows, u32 nstep, \
        float gamma, u64 sample_seed, float *b_obs, int *b_actions, float *b_returns,            \
        float *b_next_obs, float *b_discounts, float *b_weights, u32 batch, const u64 *lw,       \
        u64 n_params, float *online, float *target, float *m1g, float *m2g, float *part,         \
        float *grads, float *norm_part, float *loss_part, float *stats, int act, int double_dqn,  \
        int loss_kind, float delta, float clip, float b1, float b2, float weight_decay,          \
        float tau, u64 explore_seed, const u64 *table, u32 steps, u32 chunk, u32 *bar, u64 *times

extern "C" __global__ void __launch_bounds__(256) epoch_steps(EPOCH_PARAMS) {
    extern __shared__ float sh[];
    __shared__ float red[256];
    __shared__ float lsum[3];
    __shared__ Drawn drawn[MAX_CHUNK];
    const u32 G = gridDim.x, g = blockIdx.x;
    const u64 P = n_params;
    const u32 L = (u32)lw[0];
    const u32 A = (u32)lw[1];
    const u32 dim = (u32)lw[2];
    const u32 C = chunk;
    const Market mk = {features, open, close, session, contract, cols};
    u32 widest = A + 1;
    for (u32 l = 0; l < L; ++l) widest = max(widest, hidden_layer(lw, l).d_out);

    // Shared memory: the online and target networks, then the chunk's buffers.
    // Each network padded to whole float4s, so that both are 16-byte aligned.
    const u64 P4 = (P + 3) & ~(u64)3;
    float* wo = sh;
    float* wt = wo + P4;
    float* cur = wt + P4;
    auto take = [&](u64 n) { float* at = cur; cur += n; return at; };
    float* x = take((u64)C * dim);
    float* nx = take((u64)C * dim);
    Pass tr;  // the training pass, kept for the backward pass
    for (u32 l = 0; l < L; ++l) {
        u32 w = hidden_layer(lw, l).d_out;
        tr.h[l] = take((u64)C * w);
        tr.xh[l] = take((u64)C * w);
        tr.a[l] = take((u64)C * w);
        tr.rs[l] = take(C);
    }
    tr.head = take((u64)C * A);
    tr.v = take(C);
    tr.q = take((u64)C * A);
    float* t0 = take((u64)C * widest);
    float* t1 = take((u64)C * widest);
    Pass inf;  // inference passes: every layer in ping-pong scratch
    for (u32 l = 0; l < L; ++l) {
        float* b = (l % 2 == 0) ? t0 : t1;
        inf.h[l] = b; inf.xh[l] = b; inf.a[l] = b; inf.rs[l] = take(C);
    }
    inf.head = take((u64)C * A);
    inf.v = take(C);
    float* q_no = take((u64)C * A);
    float* q_nt = take((u64)C * A);
    float* dq = take((u64)C * A);
    float* dadv = take((u64)C * A);
    float* dv = take(C);
    float* bufa = take((u64)C * widest);
    float* bufb = take((u64)C * widest);
    float* mu = take(C);
    float* mm1 = take(C);
    float* mm2 = take(C);
    int* acts = (int*)take(C);

    load_net(wo, online, P);
    load_net(wt, target, P);
    __syncthreads();

    const u32 e0 = (u32)((u64)g * n_env / G), e1 = (u32)((u64)(g + 1) * n_env / G);
    const u32 b0 = (u32)((u64)g * batch / G), b1r = (u32)((u64)(g + 1) * batch / G);
    float* slot = part + (u64)g * P;

    // Timestamps of step s (block 0's view): times[STAMPS * s + k], k = 0 start, 1 the ring rows
    // of every block written, 2 the first chunk sampled, 3 its forward passes and TD terms done,
    // 4 every chunk's backward done, 5 the gradient summed and its norm known, 6 Adam done, 7 the
    // target updated and every block holding the new networks.
    auto stamp = [&](u32 s, u32 k) {
        if (g == 0 && threadIdx.x == 0) times[STAMPS * (u64)s + k] = global_time();
    };
    for (u32 s = 0; s < steps; ++s) {
        const u64* st = table + (u64)s * ST_WORDS;
        stamp(s, 0);
        if (st[ST_ACT]) {
            // Act: the block's environments, chunk by chunk, greedy on the online network with
            // the exploration draws of step counter ST_COUNTER.
            float eps = word_f32(st[ST_EPSILON]);
            for (u32 c0 = e0; c0 < e1; c0 += C) {
                u32 rows = min(C, e1 - c0);
                for (u32 k = threadIdx.x; k < rows * dim; k += blockDim.x)
                    x[k] = env_obs[(u64)c0 * dim + k];
                __syncthreads();
                inf.q = tr.q;
                forward(wo, lw, act, x, rows, inf, mu);
                for (u32 r = threadIdx.x; r < rows; r += blockDim.x)
                    env_actions[c0 + r] = (unsigned char)select_action(
                        inf.q + (u64)r * A, A, eps, explore_seed, st[ST_COUNTER], c0 + r);
                __syncthreads();
            }
            // Step: one thread per environment; the step's replay row into the ring.
            Ring ring = {r_t, r_pos, r_entry, r_action, r_reward, r_done, st[ST_ROW_BASE]};
            for (u32 e = e0 + threadIdx.x; e < e1; e += blockDim.x)
                step_one(features, open, close, session, contract, cols, split_start, split_end,
                         lookback, max_position, upnl_scale, tick_size, env_seed, multiplier,
                         cost_per_side, slippage_price, episode_steps, reward_scale, risk_penalty,
                         flatten_at_close, t_arr, pos_arr, entry_arr, steps_arr, episode_arr,
                         env_actions, env_obs, rewards, dones, e, &ring);
        }
        if (!st[ST_LEARN]) {
            __syncthreads();
            for (u32 k = 1; k < STAMPS; ++k) stamp(s, k);
            continue;
        }
        // The ring rows of every block are written before any block samples.
        blocks_barrier(bar, G);
        stamp(s, 1);

        // The block's batch rows, chunk by chunk: sampled (the draws one thread per row, the
        // observations by the whole block, into shared memory and the batch buffers), then
        // learned from.
        const u64 written = st[ST_WRITTEN], draw = st[ST_DRAW];
        if (threadIdx.x < 3) lsum[threadIdx.x] = 0.0f;
        int first = 1;
        for (u32 c0 = b0; c0 < b1r; c0 += C) {
            u32 rows = min(C, b1r - c0);
            if (threadIdx.x < rows)
                drawn[threadIdx.x] = sample_draw<true>(
                    r_t, r_pos, r_entry, r_action, r_reward, r_done, n_env, cap_rows, written,
                    nstep, gamma, sample_seed, draw, b_actions, b_returns, b_discounts,
                    b_weights, c0 + threadIdx.x);
            __syncthreads();
            for (u32 r = 0; r < rows; ++r) {
                const Drawn d = drawn[r];
                if (!d.ok) continue;
                observe(mk, lookback, max_position, upnl_scale, tick_size, d.t0, d.p0, d.e0,
                        x + (u64)r * dim, threadIdx.x, blockDim.x);
                observe(mk, lookback, max_position, upnl_scale, tick_size, d.t1, d.p1, d.e1,
                        nx + (u64)r * dim, threadIdx.x, blockDim.x);
            }
            __syncthreads();
            if (c0 == b0) stamp(s, 2);
            for (u32 k = threadIdx.x; k < rows * dim; k += blockDim.x) {
                b_obs[(u64)c0 * dim + k] = x[k];
                b_next_obs[(u64)c0 * dim + k] = nx[k];
            }
            forward(wo, lw, act, x, rows, tr, mu);
            if (double_dqn) {
                inf.q = q_no;
                forward(wo, lw, act, nx, rows, inf, mu);
            }
            inf.q = q_nt;
            forward(wt, lw, act, nx, rows, inf, mu);
            // TD loss per row; the terms summed in row order by one thread.
            for (u32 r = threadIdx.x; r < rows; r += blockDim.x) {
                u32 b = c0 + r;
                float terms[3];
                td_row(tr.q + (u64)r * A, b_actions[b], q_no + (u64)r * A, q_nt + (u64)r * A,
                       b_returns[b], b_discounts[b], b_weights[b], batch, A, double_dqn,
                       loss_kind, delta, dq + (u64)r * A, terms);
                bufa[3 * r] = terms[0];
                bufa[3 * r + 1] = terms[1];
                bufa[3 * r + 2] = terms[2];
            }
            __syncthreads();
            if (threadIdx.x == 0)
                for (u32 r = 0; r < rows; ++r)
                    for (u32 k = 0; k < 3; ++k) lsum[k] += bufa[3 * r + k];
            __syncthreads();
            if (c0 == b0) stamp(s, 3);
            backward(wo, lw, act, x, rows, tr, dq, dadv, dv, bufa, bufb, mm1, mm2, slot, first);
            first = 0;
        }
        if (first) {
            // No batch rows in this block: its slot adds nothing.
            for (u64 i = threadIdx.x; i < P; i += blockDim.x) slot[i] = 0.0f;
            stamp(s, 2);
            stamp(s, 3);
        }
        if (threadIdx.x < 3) loss_part[3 * g + threadIdx.x] = lsum[threadIdx.x];
        stamp(s, 4);
        blocks_barrier(bar, G);

        // The block's parameter slice: gradients summed over the slots in block order.
        const u64 p0 = (u64)g * P / G, p1 = (u64)(g + 1) * P / G;
        for (u64 j = p0 + threadIdx.x; j < p1; j += blockDim.x) {
            float acc = 0.0f;
            for (u32 h = 0; h < G; ++h) acc += __ldcg(part + (u64)h * P + j);
            grads[j] = acc;
        }
        __syncthreads();
        float sq = block_sumsq(grads + p0, p1 - p0, red);
        if (threadIdx.x == 0) norm_part[g] = sq;
        blocks_barrier(bar, G);

        // The norm from the blocks' parts in block order; Adam and the target update on the
        // block's slice.
        float total = 0.0f;
        for (u32 h = 0; h < G; ++h) total += __ldcg(norm_part + h);
        float norm = sqrtf(total);
        stamp(s, 5);
        if (g == 0 && threadIdx.x == 0) {
            float l0 = 0.0f, l1 = 0.0f, l2 = 0.0f;
            for (u32 h = 0; h < G; ++h) {
                l0 += __ldcg(loss_part + 3 * h);
                l1 += __ldcg(loss_part + 3 * h + 1);
                l2 += __ldcg(loss_part + 3 * h + 2);
            }
            float* out = stats + 4 * st[ST_STAT];
            out[0] = l0 / (float)batch;
            out[1] = l1 / (float)batch;
            out[2] = l2 / (float)batch;
            out[3] = norm;
        }
        float lr = word_f32(st[ST_LR]), eps_c2 = word_f32(st[ST_EPS_C2]), cf = word_f32(st[ST_CF]);
        for (u64 j = p0 + threadIdx.x; j < p1; j += blockDim.x)
            adam_one(online + j, grads[j], m1g + j, m2g + j, norm, clip, lr, b1, b2, eps_c2, cf,
                     weight_decay);
        __syncthreads();
        stamp(s, 6);
        // The target update, then every block takes the new networks.
        u64 sync = st[ST_SYNC];
        for (u64 j = p0 + threadIdx.x; j < p1; j += blockDim.x) {
            if (sync == 1) target[j] = online[j];
            else if (sync == 2) target[j] = polyak_one(online[j], target[j], tau);
        }
        blocks_barrier(bar, G);
        load_net(wo, online, P);
        if (sync) load_net(wt, target, P);
        __syncthreads();
        stamp(s, 7);
    }
}
