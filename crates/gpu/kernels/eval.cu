// foxhunt device evaluation: the greedy policy of a dense Q-network backtested over a split,
// deciding at every bar exactly what the host decides (foxhunt-dqn's HostQNetwork::greedy inside
// foxhunt-env's backtest), and the backtest's metrics booked as the host books them. Needs
// env.cuh (Market, Exec, transition, next_entry, observe) in the module.
//
// Exactness. Each output of a dense layer is one thread's (or lane's) sum in the host's order
// (bias first, then the inputs in order), layer norm's sums run in order on one thread, and the
// module is compiled with --fmad=false, so every product and sum rounds alone as on the host.
// Where the host passes over a zero input and the device multiplies it (or the other way round),
// the sum gains or loses only zeros: it can differ at most in a zero's sign, which no comparison
// reads. Only ReLU is evaluated here (the host's tanh and GELU are library functions the device
// does not share); the caller falls back to the host for the others.
//
// Deciding. The policy is sequential in the state (position, entry price) it holds, but it is a
// function of (bar, position, entry) alone, and under flatten-at-close every session starts flat.
// Three kernels:
// - eval_flat: every bar's decision in the flat state (bars in parallel, a warp R bars), and the
//   first hidden layer's sums of every bar: the features' part of any state's sums, so a walk
//   in a position adds only its state's two inputs (the observation's last) to them;
// - eval_chunks: every chunk of a session (a few dozen bars) walked by a small block as if it
//   began flat, recording the walk's state before every bar; flat stretches are skipped through
//   eval_flat's decisions, bars in a position are decided a few at a time on the guess that the
//   position is held;
// - eval_stitch: a team of blocks per session follows the true path; wherever its state equals a
//   chunk walk's state at the same bar, the rest of that chunk is the walk's (the same state gives
//   the same future); elsewhere it walks itself, each round guessing that the position is held
//   over the next bars, every block of the team deciding a few of them (the decisions meet in
//   global memory at a team barrier, and every block then takes the same steps). A round's time
//   is one block's pass over its few rows, so a long hold costs rounds of the team's width
//   rather than of one block's. Every decision used is the one the host makes in that state.
//
// Booking (book_steps, book_sessions, book_total). A bar's step depends only on the position
// before it and the decision, so every bar's step is computed in parallel (book_steps, a thread a
// bar); the host's sums are sequential chains: a day's PnL and each trade's PnL within a session
// (a block a session, its warps a slice each), the costs and the equity curve over the split
// (a cluster of blocks, each a run of the split's rows). Each runs in parallel only where that is exact, else as the host's chain: when
// every term is a whole multiple of one power of two and the sum of their magnitudes is below
// 2^52 of it, every partial sum is representable, so every order of adding gives the host's bits
// (ES, NQ: prices on a quarter-point grid, costs such as 2.50 a side).
//
// A population. Every kernel also judges the networks of several members at once, a member a row
// of blocks (blockIdx.y): its parameters and layout come from the member table (two addresses a
// member) and every buffer the kernels write or read per evaluation holds the members' parts one
// after another (a member's part as large as one evaluation's). A member's row runs exactly the
// code of its evaluation alone, so its decisions and metrics are that evaluation's.

// The network description (u64 words), written by the host (foxhunt-dqn's layout_words):
// [0] hidden layers L, [1] actions, [2] obs_dim, [3] layer norm (0/1), [4] dueling (0/1), then
// per hidden layer: weight offset, bias offset, d_in, d_out, norm scale offset, norm shift offset;
// then the head: weight offset, bias offset, d_in, d_out; then the value head (dueling) likewise.
#define NET_HEADER 5
#define NET_LAYER 6
// Rows a warp of eval_flat decides at once (foxhunt-memory's ROWS; the walks size their rounds
// on the host).
#define EVAL_R 4
// A lane's outputs of one dense pass: d_out up to 32 * EVAL_KMAX per pass.
#define EVAL_KMAX 8
// Threads of an evaluation block at most (the register budget: 128 a thread).
#define EVAL_THREADS_MAX 512
// Bars a round of a walk decides at most (a team's blocks together).
#define EVAL_ROUND_ROWS 256

struct Net {
    const float* p;
    const unsigned long long* w;
};

__device__ __forceinline__ u32 net_hidden(const Net& n) { return (u32)n.w[0]; }
__device__ __forceinline__ u32 net_obs_dim(const Net& n) { return (u32)n.w[2]; }
__device__ __forceinline__ const unsigned long long* net_layer(const Net& n, u32 l) {
    return n.w + NET_HEADER + (u64)l * NET_LAYER;
}
__device__ __forceinline__ const unsigned long long* net_head(const Net& n) {
    return n.w + NET_HEADER + (u64)net_hidden(n) * NET_LAYER;
}

// y[r][o] = bias[o] + sum_i x[r][i] * W[i][o] for r < rows (<= R), o < d_out, by one warp: lane
// takes outputs lane, lane + 32, ... (K of them per pass), each one sum in the host's order.
template <int R, int K>
__device__ __forceinline__ void warp_dense_wide(const float* p, u64 w_off, u64 b_off, u32 d_in,
                                                u32 d_out, const float* x, float* y, u32 rows,
                                                u32 lane) {
    const float* w = p + w_off;
    const float* bias = p + b_off;
    for (u32 o0 = 0; o0 < d_out; o0 += 32 * K) {
        float acc[R][K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            u32 o = o0 + lane + 32 * k;
            float b = o < d_out ? bias[o] : 0.0f;
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][k] = b;
        }
#pragma unroll 4
        for (u32 i = 0; i < d_in; ++i) {
            float xv[R];
#pragma unroll
            for (int r = 0; r < R; ++r) xv[r] = (u32)r < rows ? x[(u64)r * d_in + i] : 0.0f;
            const float* wr = w + (u64)i * d_out + o0 + lane;
#pragma unroll
            for (int k = 0; k < K; ++k) {
                if (o0 + lane + 32 * k < d_out) {
                    float wv = wr[32 * k];
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r][k] = acc[r][k] + xv[r] * wv;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
            u32 o = o0 + lane + 32 * k;
            if (o < d_out) {
#pragma unroll
                for (int r = 0; r < R; ++r)
                    if ((u32)r < rows) y[(u64)r * d_out + o] = acc[r][k];
            }
        }
    }
}

// The threads that decide together: a warp (eval_flat) or a block (the walks).
struct Warp {
    u32 rank;
    __device__ __forceinline__ u32 size() const { return 32; }
    __device__ __forceinline__ void sync() const { __syncwarp(); }
};
struct Block {
    u32 rank;
    __device__ __forceinline__ u32 size() const { return blockDim.x; }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
};

// A narrow layer (a head's few outputs) by group g: a thread per (row, output), each one sum in
// the host's order.
template <class G>
__device__ __forceinline__ void dense_narrow(const G& g, const float* p, u64 w_off, u64 b_off,
                                             u32 d_in, u32 d_out, const float* x, float* y,
                                             u32 rows) {
    const float* w = p + w_off;
    const float* bias = p + b_off;
    for (u32 k = g.rank; k < rows * d_out; k += g.size()) {
        u32 r = k / d_out, o = k % d_out;
        const float* xr = x + (u64)r * d_in;
        float acc = bias[o];
        if ((d_in & 3u) == 0 && ((unsigned long long)x & 15u) == 0) {
            // Four inputs a load (the chain is the pass's latency; fewer loads shorten each
            // link), added one by one.
#pragma unroll 2
            for (u32 i = 0; i < d_in; i += 4) {
                const float4 xq = *reinterpret_cast<const float4*>(xr + i);
                acc = acc + xq.x * w[(u64)i * d_out + o];
                acc = acc + xq.y * w[(u64)(i + 1) * d_out + o];
                acc = acc + xq.z * w[(u64)(i + 2) * d_out + o];
                acc = acc + xq.w * w[(u64)(i + 3) * d_out + o];
            }
        } else {
#pragma unroll 4
            for (u32 i = 0; i < d_in; ++i) acc = acc + xr[i] * w[(u64)i * d_out + o];
        }
        y[(u64)r * d_out + o] = acc;
    }
}

// A group's dense pass (a warp's in eval_flat, a block's in the walks) for layers whose weights
// and biases lie in aligned groups of four outputs: a thread takes four neighbouring outputs of
// R rows, so that one vector load of weights serves 4 x R sums and each input value serves four
// (a pass is bound by the loads of shared memory or the first-level cache, not by the
// arithmetic, when every product needs a weight of its own). Each sum is still one output's, in
// the host's order.
template <int R, class G>
__device__ __forceinline__ void dense_quads(const G& g_, const float* p, u64 w_off, u64 b_off,
                                            u32 d_in, u32 d_out, const float* x, float* y,
                                            u32 rows) {
    const float4* w = reinterpret_cast<const float4*>(p + w_off);
    const float4* bias = reinterpret_cast<const float4*>(p + b_off);
    const u32 quads = d_out / 4, groups = (rows + R - 1) / R;
    for (u32 k = g_.rank; k < groups * quads; k += g_.size()) {
        const u32 q = k % quads, g = k / quads;
        const float* xr[R];
        float4 acc[R];
        const float4 b = bias[q];
#pragma unroll
        for (int j = 0; j < R; ++j) {
            // A row past the end repeats the group's first: summed, never stored.
            const u32 r = g * R + j;
            xr[j] = x + (u64)(r < rows ? r : g * R) * d_in;
            acc[j] = b;
        }
        if ((d_in & 3u) == 0 && ((unsigned long long)x & 15u) == 0) {
            // Four inputs of a row a load, added input by input.
#pragma unroll 2
            for (u32 i = 0; i < d_in; i += 4) {
                float4 xq[R];
#pragma unroll
                for (int j = 0; j < R; ++j) xq[j] = *reinterpret_cast<const float4*>(xr[j] + i);
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const float4 wv = w[(u64)(i + c) * quads + q];
#pragma unroll
                    for (int j = 0; j < R; ++j) {
                        const float xv = c == 0 ? xq[j].x : c == 1 ? xq[j].y : c == 2 ? xq[j].z : xq[j].w;
                        acc[j].x = acc[j].x + xv * wv.x;
                        acc[j].y = acc[j].y + xv * wv.y;
                        acc[j].z = acc[j].z + xv * wv.z;
                        acc[j].w = acc[j].w + xv * wv.w;
                    }
                }
            }
        } else {
#pragma unroll 4
            for (u32 i = 0; i < d_in; ++i) {
                const float4 wv = w[(u64)i * quads + q];
#pragma unroll
                for (int j = 0; j < R; ++j) {
                    const float xv = xr[j][i];
                    acc[j].x = acc[j].x + xv * wv.x;
                    acc[j].y = acc[j].y + xv * wv.y;
                    acc[j].z = acc[j].z + xv * wv.z;
                    acc[j].w = acc[j].w + xv * wv.w;
                }
            }
        }
#pragma unroll
        for (int j = 0; j < R; ++j) {
            const u32 r = g * R + j;
            if (r < rows) {
                float* yr = y + (u64)r * d_out + 4 * q;
                yr[0] = acc[j].x;
                yr[1] = acc[j].y;
                yr[2] = acc[j].z;
                yr[3] = acc[j].w;
            }
        }
    }
}

// Whether a layer's weights, biases and rows all start on float4 boundaries, so the quads pass's
// vector loads are aligned (the parameters' base is 16-byte aligned: cudaMalloc, or the start of
// shared memory).
__device__ __forceinline__ bool quads_fit(u64 w_off, u64 b_off, u32 d_out) {
    return ((w_off | b_off | (u64)d_out) & 3) == 0;
}

template <int R>
__device__ __forceinline__ void warp_dense(const float* p, u64 w_off, u64 b_off, u32 d_in,
                                           u32 d_out, const float* x, float* y, u32 rows,
                                           u32 lane) {
    if (d_out * rows <= 32 || d_out < 16)
        dense_narrow(Warp{lane}, p, w_off, b_off, d_in, d_out, x, y, rows);
    else if (quads_fit(w_off, b_off, d_out))
        // The warp's rows together, a lane four neighbouring outputs of each: a vector load of
        // weights serves 4 x R sums.
        dense_quads<R>(Warp{lane}, p, w_off, b_off, d_in, d_out, x, y, rows);
    else if (d_out <= 32)
        warp_dense_wide<R, 1>(p, w_off, b_off, d_in, d_out, x, y, rows, lane);
    else if (d_out <= 64)
        warp_dense_wide<R, 2>(p, w_off, b_off, d_in, d_out, x, y, rows, lane);
    else if (d_out <= 128)
        warp_dense_wide<R, 4>(p, w_off, b_off, d_in, d_out, x, y, rows, lane);
    else
        // Two rows at a time: four rows of EVAL_KMAX sums each would not stay in registers.
        for (u32 r0 = 0; r0 < rows; r0 += 2)
            warp_dense_wide<2, EVAL_KMAX>(p, w_off, b_off, d_in, d_out, x + (u64)r0 * d_in,
                                          y + (u64)r0 * d_out, min(2u, rows - r0), lane);
}

// Layer norm (when on) then ReLU over `rows` rows of width `width`, in place, as the host, by
// group g: mean and variance summed in order by one thread per row (from -0.0, as Rust's f32
// sum), then ((v - mean) * inv) * gamma + beta, then max(v, 0).
template <class G>
__device__ __forceinline__ void post(const G& g, const float* p, int use_norm, u64 g_off,
                                     u64 b_off, float* y, u32 rows, u32 width, float* stat) {
    if (use_norm) {
        for (u32 r = g.rank; r < rows; r += g.size()) {
            const float* yr = y + (u64)r * width;
            float n = (float)width;
            float s = -0.0f;
            for (u32 j = 0; j < width; ++j) s = s + yr[j];
            float mean = s / n;
            float v = -0.0f;
            for (u32 j = 0; j < width; ++j) {
                float d = yr[j] - mean;
                v = v + d * d;
            }
            v = v / n;
            stat[2 * r] = mean;
            stat[2 * r + 1] = 1.0f / sqrtf(v + 1e-5f);
        }
        g.sync();
        const float* gamma = p + g_off;
        const float* beta = p + b_off;
        for (u32 k = g.rank; k < rows * width; k += g.size()) {
            u32 r = k / width, j = k % width;
            y[k] = fmaxf((y[k] - stat[2 * r]) * stat[2 * r + 1] * gamma[j] + beta[j], 0.0f);
        }
    } else {
        for (u32 k = g.rank; k < rows * width; k += g.size()) y[k] = fmaxf(y[k], 0.0f);
    }
    g.sync();
}

// A warp's scratch: R observations, two sets of R rows of the widest layer, statistics, actions.
struct WarpScratch {
    float* x;
    float* a;
    float* b;
    float* stat;
    int* act;
};

// Floats of one warp's scratch.
__device__ __forceinline__ u32 scratch_floats(u32 dim, u32 max_width) {
    return EVAL_R * dim + 2 * EVAL_R * max_width + 2 * EVAL_R + EVAL_R;
}

__device__ __forceinline__ WarpScratch warp_scratch(float* base, u32 warp, u32 dim, u32 max_width) {
    WarpScratch s;
    s.x = base + (u64)warp * scratch_floats(dim, max_width);
    s.a = s.x + EVAL_R * dim;
    s.b = s.a + EVAL_R * max_width;
    s.stat = s.b + EVAL_R * max_width;
    s.act = (int*)(s.stat + 2 * EVAL_R);
    return s;
}

// The greedy actions of the `rows` observations in s.x into s.act, by group g; `dense(w_off,
// b_off, d_in, d_out, x, y)` is the group's pass of a hidden layer over those rows. With
// `first_out`, the first hidden layer's sums (before its norm and activation) are also written
// there, rows x width; with `first_given`, they are in s.a already and s.x is not read.
template <class G, class Dense>
__device__ __forceinline__ void greedy(const G& g, const Net& n, const WarpScratch& s, u32 rows,
                                       Dense dense, float* first_out = 0,
                                       bool first_given = false) {
    u32 L = net_hidden(n);
    int use_norm = (int)n.w[3];
    const float* in = s.x;
    float* out = s.a;
    for (u32 l = 0; l < L; ++l) {
        const unsigned long long* d = net_layer(n, l);
        if (l > 0 || !first_given) dense(d[0], d[1], (u32)d[2], (u32)d[3], in, out);
        g.sync();
        // Each thread copies the sums post() will overwrite: the same (thread, element) pairs.
        for (u32 k = g.rank; l == 0 && first_out && k < rows * (u32)d[3]; k += g.size())
            first_out[k] = out[k];
        post(g, n.p, use_norm, d[4], d[5], out, rows, (u32)d[3], s.stat);
        in = out;
        out = (out == s.a) ? s.b : s.a;
    }
    const unsigned long long* h = net_head(n);
    u32 actions = (u32)h[3];
    // The Q (or advantage) head into `out`, the value head after it.
    dense_narrow(g, n.p, h[0], h[1], (u32)h[2], actions, in, out, rows);
    int dueling = (int)n.w[4];
    if (dueling) {
        const unsigned long long* v = h + 4;
        dense_narrow(g, n.p, v[0], v[1], (u32)v[2], 1, in, out + (u64)rows * actions, rows);
    }
    g.sync();
    for (u32 r = g.rank; r < rows; r += g.size()) {
        float* q = out + (u64)r * actions;
        if (dueling) {
            float val = out[(u64)rows * actions + r];
            float sum = -0.0f;
            for (u32 j = 0; j < actions; ++j) sum = sum + q[j];
            float mean = sum / (float)actions;
            for (u32 j = 0; j < actions; ++j) q[j] = val + q[j] - mean;
        }
        u32 best = 0;
        for (u32 j = 1; j < actions; ++j)
            if (q[j] > q[best]) best = j;
        s.act[r] = (int)best;
    }
    g.sync();
}

// The host's EnvConfig::target: action a means a - max_position contracts.
__device__ __forceinline__ int action_target(int a, int max_position) {
    int amax = 2 * max_position;
    return (a < amax ? a : amax) - max_position;
}

__device__ __forceinline__ bool same_state(int pos_a, double entry_a, int pos_b, double entry_b) {
    return pos_a == pos_b && __double_as_longlong(entry_a) == __double_as_longlong(entry_b);
}

#define EVAL_PARAMS                                                                                \
    const float *features, const double *open, const double *close, const u32 *session,            \
        const u32 *contract, u32 cols, u32 lookback, int max_position, float upnl_scale,           \
        double tick_size, const float *params, const unsigned long long *net, u32 n_params,        \
        u32 params_shared, u32 max_width, const unsigned long long *members

// Moves each pointer to this row's network's part of its buffer (`per` elements a network; the
// first row's part is the buffer's start, as for one network alone).
template <typename... T>
__device__ __forceinline__ void at_member(u64 per, T*&... p) {
    ((p += (u64)blockIdx.y * per), ...);
}

// Every evaluation kernel's dynamic shared memory: the parameters (when params_shared) and then
// each warp's scratch. Returns the network to read and the first scratch float.
__device__ __forceinline__ Net eval_prologue(float* sh, const float* params,
                                             const unsigned long long* net, u32 n_params,
                                             u32 params_shared, const unsigned long long* members,
                                             float** scratch) {
    if (members) {
        // A population's member: its row of the member table (parameters, layout).
        params = (const float*)members[2 * blockIdx.y];
        net = (const unsigned long long*)members[2 * blockIdx.y + 1];
    }
    Net n = {params, net};
    if (params_shared) {
        load_net(sh, params, n_params);
        __syncthreads();
        n.p = sh;
        // Scratch 16-byte aligned after the parameters.
        *scratch = sh + ((n_params + 3) & ~3u);
    } else {
        *scratch = sh;
    }
    return n;
}

// Runs body with the network, its parameters read through sh itself where they are in shared
// memory: the compiler then knows the space and reads them with shared loads, not generic ones.
template <typename Body>
__device__ __forceinline__ void with_params(const Net& n, u32 params_shared, const float* sh,
                                            Body body) {
    if (params_shared) {
        Net ns = n;
        ns.p = sh;
        body(ns);
    } else {
        body(n);
    }
}

// Decisions of bars [split_start, split_end) in the flat state: flat_target[t - split_start].
// Warps take EVAL_R bars at a time, striding over the grid. With first_on (the network has a
// hidden layer), each bar's first hidden layer sums, before the norm and activation, go to
// first_sums[(t - split_start) * width]: the bias plus the look-back features' products, in the
// host's order, then the state inputs' products, which are zero when flat. A walk in a position
// adds its own state's two products to them instead of summing the features again.
extern "C" __global__ void __launch_bounds__(EVAL_THREADS_MAX, 1)
    eval_flat(EVAL_PARAMS, u32 split_start, u32 split_end, signed char* flat_target,
              float* first_sums, u32 first_on) {
    extern __shared__ float sh[];
    float* scratch;
    Net n = eval_prologue(sh, params, net, n_params, params_shared, members, &scratch);
    Market m = {features, open, close, session, contract, cols};
    // The member's part of the outputs (row 0 alone).
    const u64 bars = split_end - split_start;
    at_member(bars, flat_target);
    at_member(bars * (first_on ? (u32)net_layer(n, 0)[3] : 0), first_sums);
    u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 dim = net_obs_dim(n);
    WarpScratch s = warp_scratch(scratch, warp, dim, max_width);
    with_params(n, params_shared, sh, [&](const Net& n) {
        u32 warps = (gridDim.x * blockDim.x) >> 5;
        for (u32 first = split_start + (blockIdx.x * (blockDim.x >> 5) + warp) * EVAL_R;
             first < split_end; first += warps * EVAL_R) {
            u32 rows = min((u32)EVAL_R, split_end - first);
            observe_rows<EVAL_R>(m, lookback, max_position, upnl_scale, tick_size, first, rows, 0,
                                 0.0, s.x, dim, lane, 32);
            __syncwarp();
            float* first_out =
                first_on ? first_sums + (u64)(first - split_start) * (u32)net_layer(n, 0)[3] : 0;
            greedy(
                Warp{lane}, n, s, rows,
                [&](u64 w_off, u64 b_off, u32 d_in, u32 d_out, const float* x, float* y) {
                    warp_dense<EVAL_R>(n.p, w_off, b_off, d_in, d_out, x, y, rows, lane);
                },
                first_out);
            if (lane < rows)
                flat_target[first + lane - split_start] =
                    (signed char)action_target(s.act[lane], max_position);
            __syncwarp();
        }
    });
}

// ---- Walking: a block follows one path, a few bars a network pass ----

// y[r][o] = bias[o] + sum_i x[r][i] * W[i][o] for r < rows, o < d_out, by the whole block: a
// thread takes P (row, output) pairs side by side, each one sum in the host's order. Rounds of
// a walk wait on this pass's latency, so every thread's chain is one output's, not more.
template <int P>
__device__ __forceinline__ void block_dense(const float* p, u64 w_off, u64 b_off, u32 d_in,
                                            u32 d_out, const float* x, float* y, u32 rows) {
    const float* w = p + w_off;
    const float* bias = p + b_off;
    const u32 n = rows * d_out, T = blockDim.x;
    for (u32 k0 = threadIdx.x; k0 < n; k0 += P * T) {
        float acc[P];
        const float* xr[P];
        u32 o[P];
#pragma unroll
        for (int j = 0; j < P; ++j) {
            // A pair past the end repeats the first: summed, never stored.
            u32 k = k0 + j * T < n ? k0 + j * T : k0;
            o[j] = k % d_out;
            xr[j] = x + (u64)(k / d_out) * d_in;
            acc[j] = bias[o[j]];
        }
#pragma unroll 4
        for (u32 i = 0; i < d_in; ++i) {
#pragma unroll
            for (int j = 0; j < P; ++j) acc[j] = acc[j] + xr[j][i] * w[(u64)i * d_out + o[j]];
        }
#pragma unroll
        for (int j = 0; j < P; ++j)
            if (k0 + j * T < n) y[k0 + j * T] = acc[j];
    }
}

// A walking block's pass of a hidden layer over `rows` rows: four outputs a thread, one row each
// (two where the block has too few threads), where the layer's parameters allow vector loads,
// else block_dense.
__device__ __forceinline__ void block_dense_any(const float* p, u64 w_off, u64 b_off, u32 d_in,
                                               u32 d_out, const float* x, float* y, u32 rows) {
    if (quads_fit(w_off, b_off, d_out)) {
        // A row a thread wherever the block has a thread for every (row, quad): the pass is a
        // chain per thread, and a round waits on it, so the most threads with the shortest
        // chains (each weight load then serves fewer sums).
        if (rows * (d_out / 4) <= blockDim.x)
            dense_quads<1>(Block{threadIdx.x}, p, w_off, b_off, d_in, d_out, x, y, rows);
        else
            dense_quads<2>(Block{threadIdx.x}, p, w_off, b_off, d_in, d_out, x, y, rows);
    } else {
        block_dense<2>(p, w_off, b_off, d_in, d_out, x, y, rows);
    }
}

// Floats of a block's scratch for `rows` rows.
__device__ __forceinline__ u32 block_scratch_floats(u32 rows, u32 dim, u32 max_width) {
    return rows * dim + 2 * rows * max_width + 3 * rows;
}

__device__ __forceinline__ WarpScratch block_scratch(float* base, u32 rows, u32 dim,
                                                     u32 max_width) {
    WarpScratch s;
    s.x = base;
    s.a = s.x + rows * dim;
    s.b = s.a + rows * max_width;
    s.stat = s.b + rows * max_width;
    s.act = (int*)(s.stat + 2 * rows);
    return s;
}

// What a walk reads and writes besides the market and the network.
struct WalkIo {
    u32 split_start, split_end;
    const signed char* flat_target;  // the flat decision of every bar
    const float* first_sums;         // eval_flat's first-layer sums of every bar, or null
    signed char* out;                // the walk's decisions
    signed char* rec_pos;            // with rec_entry: the state before each bar, or null
    double* rec_entry;
    const signed char* merge_pos;    // with merge_entry: another walk's states, or null
    const double* merge_entry;
};

// The block's walk state (shared).
struct WalkState {
    u32 t, u;
    int pos;
    double entry;
    u32 stop;
    u32 per;  // rows each block decides in the next round
};

// The blocks that walk one path together: block `rank` of `size` decides rows [rank * per,
// (rank + 1) * per) of each round's guess, `per` starting at rows_min and doubling up to rows
// while the position is held through whole rounds (short holds get quick rounds, long ones wide
// ones), and leaves their actions in `act` (two sets of size * rows, alternating by round: a
// block writes a set again only after every block has passed the barrier that follows its
// reading of it); `bar` is the team's barrier. A team of one decides every row itself and meets
// nobody.
struct Team {
    u32 rank, size, rows, rows_min;
    int* act;
    u32* bar;
};

// Walks bars [ws.t, end) of one session by the team's blocks from the state in `ws`, in a
// position team.size * ws.per bars a round (on the guess that it is held; ws.per starts at
// team.rows_min and doubles up to team.rows while the position is held), flat stretches a
// block-wide search at a time. Writes each bar's decision to io.out (and the state before it to
// io.rec_*) where those are given; with io.merge_*, stops at the first bar whose state equals
// that walk's there. `round` counts the team's rounds (every thread of every block keeps the
// same count). On return (every thread), ws.t is the bar it stopped at (end when it ran
// through) and ws.pos / ws.entry the state there: the same in every block of the team.
__device__ void block_walk(const Net& n, const Market& m, const Exec& xc, u32 lookback,
                           int max_position, float upnl_scale, double tick_size,
                           const WalkIo& io, const WarpScratch& s, const Team& team, u32 end,
                           WalkState& ws, u32& round) {
    const u32 dim = net_obs_dim(n);
    const u32 base = io.split_start;
    const bool merging = io.merge_pos != 0;
    __syncthreads();
    while (true) {
        const u32 t0 = ws.t;
        const int pos = ws.pos;
        const double entry = ws.entry;
        if (t0 >= end) break;
        if (pos == 0) {
            // Flat: the first bar from t0 whose flat decision trades, or (merging) where the
            // other walk is flat too; every flat bar before it stays flat.
            if (threadIdx.x == 0) ws.u = end;
            __syncthreads();
            for (u32 b0 = t0; b0 < end; b0 += blockDim.x) {
                u32 v = b0 + threadIdx.x;
                if (v < end &&
                    (io.flat_target[v - base] != 0 ||
                     (merging && io.merge_pos[v - base] == 0 && io.merge_entry[v - base] == 0.0)))
                    atomicMin(&ws.u, v);
                __syncthreads();
                if (ws.u < end) break;
            }
            const u32 u = ws.u;
            for (u32 v = t0 + threadIdx.x; io.out && v < u; v += blockDim.x) {
                io.out[v - base] = 0;
                if (io.rec_pos) {
                    io.rec_pos[v - base] = 0;
                    io.rec_entry[v - base] = 0.0;
                }
            }
            if (threadIdx.x == 0) {
                if (u < end && merging && io.merge_pos[u - base] == 0 &&
                    io.merge_entry[u - base] == 0.0) {
                    ws.t = u;  // met: the rest is the other walk's
                    ws.stop = 1;
                } else if (u < end) {
                    int target = io.flat_target[u - base];
                    if (io.out) io.out[u - base] = (signed char)target;
                    if (io.rec_pos) {
                        io.rec_pos[u - base] = 0;
                        io.rec_entry[u - base] = 0.0;
                    }
                    Trans tr = transition(m, xc, u, io.split_end, 1, 0, target);
                    ws.entry = next_entry(0.0, 0, tr);
                    ws.pos = tr.position;
                    ws.t = u + 1;
                } else {
                    ws.t = end;
                }
            }
            __syncthreads();
            if (ws.stop) break;
            continue;
        }
        // In a position: the next rows decided as if it were held, this block's share of them.
        const u32 per = ws.per;
        const u32 rows = min(team.size * per, end - t0);
        const u32 mine0 = team.rank * per;
        const u32 mine = rows > mine0 ? min(per, rows - mine0) : 0;
        if (io.first_sums) {
            // The first layer's sums: the flat sums of the bar (the bias and the features'
            // products, then the state's zero products, which change at most a zero's sign)
            // and this state's two products, in the host's order.
            const unsigned long long* d = net_layer(n, 0);
            const u32 width = (u32)d[3];
            const float* wf = n.p + d[0] + (u64)(dim - 2) * width;
            for (u32 k = threadIdx.x; k < mine * width; k += blockDim.x) {
                const u32 r = k / width, o = k % width, t = t0 + mine0 + r;
                float in[2];
                observe_state(m, max_position, upnl_scale, tick_size, t, pos, entry, in);
                float acc = io.first_sums[(u64)(t - base) * width + o];
                acc = acc + in[0] * wf[o];
                acc = acc + in[1] * wf[width + o];
                s.a[k] = acc;
            }
        } else {
            for (u32 r = threadIdx.x >> 5; r < mine; r += blockDim.x >> 5)
                observe(m, lookback, max_position, upnl_scale, tick_size, t0 + mine0 + r, pos,
                        entry, s.x + (u64)r * dim, threadIdx.x & 31, 32);
        }
        // The other walk's states at those bars, for the search for the round's end.
        __shared__ signed char s_mpos[EVAL_ROUND_ROWS];
        __shared__ double s_mentry[EVAL_ROUND_ROWS];
        for (u32 r = threadIdx.x; merging && r < rows; r += blockDim.x) {
            s_mpos[r] = io.merge_pos[t0 + r - base];
            s_mentry[r] = io.merge_entry[t0 + r - base];
        }
        if (threadIdx.x == 0) ws.u = rows;
        __syncthreads();
        if (mine > 0)
            greedy(
                Block{threadIdx.x}, n, s, mine,
                [&](u64 w_off, u64 b_off, u32 d_in, u32 d_out, const float* x, float* y) {
                    block_dense_any(n.p, w_off, b_off, d_in, d_out, x, y, mine);
                },
                0, io.first_sums != 0);
        // Every row's action: this block's, or (a team) every block's, met at the barrier.
        __shared__ int s_act[EVAL_ROUND_ROWS];
        const int* act = s.act;
        if (team.size > 1) {
            int* set = team.act + (round & 1) * team.size * team.rows;
            for (u32 r = threadIdx.x; r < mine; r += blockDim.x) set[mine0 + r] = s.act[r];
            // A team launched as one thread-block cluster meets at the cluster's barrier (its
            // writes to global memory ordered at the cluster's scope, read through L2 below),
            // else at the barrier in global memory.
            if (cluster_blocks() == team.size)
                cluster_barrier();
            else
                blocks_barrier(team.bar, team.size);
            for (u32 r = threadIdx.x; r < rows; r += blockDim.x) s_act[r] = __ldcg(set + r);
            __syncthreads();
            act = s_act;
        }
        round += 1;
        // The round ends at its first row where the other walk's state is met, the decision
        // trades, or the session ends (ws.u, set to rows before the pass); every row before it
        // holds the position. Found and written by all threads at once.
        for (u32 r = threadIdx.x; r < rows; r += blockDim.x) {
            const bool met = merging && same_state(pos, entry, s_mpos[r], s_mentry[r]);
            if (met || action_target(act[r], max_position) != pos || t0 + r + 1 >= end)
                atomicMin(&ws.u, r);
        }
        __syncthreads();
        const u32 held = ws.u;
        for (u32 r = threadIdx.x; r < held; r += blockDim.x) {
            if (io.out) io.out[t0 + r - base] = (signed char)pos;
            if (io.rec_pos) {
                io.rec_pos[t0 + r - base] = (signed char)pos;
                io.rec_entry[t0 + r - base] = entry;
            }
        }
        if (threadIdx.x == 0) {
            const u32 t = t0 + held;
            if (held == rows) {
                // Held through the round (never at the session's last bar): wider next time.
                ws.t = t;
                ws.per = min(2 * per, team.rows);
            } else if (merging && same_state(pos, entry, s_mpos[held], s_mentry[held])) {
                ws.t = t;
                ws.stop = 1;
                ws.per = team.rows_min;
            } else {
                const int target = action_target(act[held], max_position);
                if (io.out) io.out[t - base] = (signed char)target;
                if (io.rec_pos) {
                    io.rec_pos[t - base] = (signed char)pos;
                    io.rec_entry[t - base] = entry;
                }
                Trans tr = transition(m, xc, t, io.split_end, 1, pos, target);
                ws.entry = next_entry(entry, pos, tr);
                ws.pos = tr.position;
                ws.t = t + 1;
                ws.per = team.rows_min;
            }
        }
        __syncthreads();
        if (ws.stop) break;
    }
    __syncthreads();
}

#define WALK_PARAMS                                                                                \
    EVAL_PARAMS, u32 split_start, u32 split_end, double multiplier, double cost_per_side,         \
        double slippage_price, u32 rows_max, const signed char *flat_target,                   \
        const float *first_sums, u32 first_on

// Walks chunk c (bars [chunk_start[c], chunk_end[c]) of one session) from a flat start, a block
// a chunk, rows_min to rows_max bars a round in a position (as a team of one): its decisions
// into w_target, the state before each bar into w_pos / w_entry, the state after its last bar
// into w_end_pos / w_end_entry.
extern "C" __global__ void __launch_bounds__(1024, 1)
    eval_chunks(WALK_PARAMS, const u32* chunk_start, const u32* chunk_end, u32 rows_min,
                signed char* w_target, signed char* w_pos, double* w_entry,
                signed char* w_end_pos, double* w_end_entry) {
    extern __shared__ float sh[];
    __shared__ WalkState ws;
    float* scratch;
    Net n = eval_prologue(sh, params, net, n_params, params_shared, members, &scratch);
    Market m = {features, open, close, session, contract, cols};
    Exec xc = {multiplier, cost_per_side, slippage_price};
    WarpScratch s = block_scratch(scratch, rows_max, net_obs_dim(n), max_width);
    const u32 c = blockIdx.x;
    // The member's part: its flat pass's and its walks' (a row of blocks a chunk each).
    const u64 bars = split_end - split_start;
    at_member(bars, flat_target, w_target, w_pos, w_entry);
    at_member(bars * (first_on ? (u32)net_layer(n, 0)[3] : 0), first_sums);
    at_member(gridDim.x, w_end_pos, w_end_entry);
    WalkIo io = {split_start, split_end, flat_target, first_on ? first_sums : 0,
                 w_target, w_pos, w_entry, 0, 0};
    const Team alone = {0, 1, rows_max, min(rows_min, rows_max), 0, 0};
    u32 round = 0;
    if (threadIdx.x == 0) {
        ws.t = chunk_start[c];
        ws.pos = 0;
        ws.entry = 0.0;
        ws.stop = 0;
        ws.per = alone.rows_min;
    }
    // Not through with_params, unlike the stitch: the chunk walks measured 1-2% slower with
    // shared loads of the parameters (PERFORMANCE.md, #12's twenty-fifth session).
    block_walk(n, m, xc, lookback, max_position, upnl_scale, tick_size, io, s, alone, chunk_end[c],
               ws, round);
    if (threadIdx.x == 0) {
        w_end_pos[c] = (signed char)ws.pos;
        w_end_entry[c] = ws.entry;
    }
}

// The true path of each session s (bars [sess_start[s], sess_end[s]); its chunks are
// [sess_chunk[s], ...) of the chunk table) into targets: walked from the session's flat start
// until its state is the state of the chunk walk over the same bar, the rest of that chunk
// taken from the walk (the same state gives the same future), and on from the chunk's end in
// the state the walk ends in. Teams of team_size blocks (rows_min to rows_max rows each a
// round) take sessions team, team + teams, ...; team g's barrier is team_bar[2 g ..] and its exchange
// team_act[g * 2 * team_size * rows_max ..]. Every block of a team takes the same steps; its
// first block writes the targets. A team larger than one needs every block resident (a
// cooperative launch).
extern "C" __global__ void __launch_bounds__(1024, 1)
    eval_stitch(WALK_PARAMS, const u32* sess_start, const u32* sess_end, const u32* sess_chunk,
                const u32* chunk_end, const signed char* w_target, const signed char* w_pos,
                const double* w_entry, const signed char* w_end_pos, const double* w_end_entry,
                u32 n_sessions, u32 n_chunks, u32 team_size, u32 rows_min, int* team_act,
                u32* team_bar, signed char* targets) {
    extern __shared__ float sh[];
    __shared__ WalkState ws;
    float* scratch;
    Net n = eval_prologue(sh, params, net, n_params, params_shared, members, &scratch);
    Market m = {features, open, close, session, contract, cols};
    Exec xc = {multiplier, cost_per_side, slippage_price};
    WarpScratch s = block_scratch(scratch, rows_max, net_obs_dim(n), max_width);
    // The member's part: its flat pass's, its walks', its decisions and its teams' words.
    const u64 bars = split_end - split_start;
    at_member(bars, flat_target, w_target, w_pos, w_entry, targets);
    at_member(bars * (first_on ? (u32)net_layer(n, 0)[3] : 0), first_sums);
    at_member(n_chunks, w_end_pos, w_end_entry);
    at_member((u64)gridDim.x * 2 * rows_max, team_act);
    at_member(2 * (gridDim.x / team_size), team_bar);
    const u32 g = blockIdx.x / team_size, teams = gridDim.x / team_size;
    const Team team = {blockIdx.x % team_size, team_size, rows_max, min(rows_min, rows_max),
                       team_act + (u64)g * 2 * team_size * rows_max, team_bar + 2 * g};
    const bool writes = team.rank == 0;
    WalkIo io = {split_start, split_end, flat_target, first_on ? first_sums : 0,
                 writes ? targets : 0, 0, 0, w_pos, w_entry};
    u32 round = 0;
    for (u32 sid = g; g < teams && sid < n_sessions; sid += teams) {
        const u32 end = sess_end[sid];
        __syncthreads();
        if (threadIdx.x == 0) {
            ws.t = sess_start[sid];
            ws.pos = 0;
            ws.entry = 0.0;
            ws.per = team.rows_min;
        }
        for (u32 c = sess_chunk[sid]; true;) {
            __syncthreads();
            if (threadIdx.x == 0) ws.stop = 0;
            with_params(n, params_shared, sh, [&](const Net& n) {
                block_walk(n, m, xc, lookback, max_position, upnl_scale, tick_size, io, s, team,
                           end, ws, round);
            });
            if (!ws.stop) break;  // ran through the session
            // Met the walk of the chunk holding bar ws.t: the rest of that chunk is its.
            const u32 t = ws.t;
            while (chunk_end[c] <= t) ++c;
            const u32 ce = chunk_end[c];
            for (u32 v = t + threadIdx.x; writes && v < ce; v += blockDim.x)
                targets[v - split_start] = w_target[v - split_start];
            __syncthreads();
            if (threadIdx.x == 0) {
                ws.t = ce;
                ws.pos = w_end_pos[c];
                ws.entry = w_end_entry[c];
            }
        }
    }
}

// ---- Booking ----

// A step's word: the contracts traded (bits 0-15), the position before (bits 16-23) and after
// (bits 24-31), each plus 128 (|position| <= 127). read_step unpacks it.
__device__ __forceinline__ u32 pack_step_word(u32 traded, int before, int after) {
    return (traded & 0xffffu) | ((u32)(before + 128) << 16) | ((u32)(after + 128) << 24);
}

// Every bar's step of the split at once, a thread a bar: the position before bar t is the
// decision at the bar before, flat where a session starts (the split's first bar included); the
// step's hold PnL, bar PnL and cost, and its word (pack_step_word).
extern "C" __global__ void __launch_bounds__(256)
    book_steps(const double* open, const double* close, const u32* session, const u32* contract,
               u32 split_start, u32 split_end, int max_position, double multiplier,
               double cost_per_side, double slippage_price, const signed char* targets,
               double* step_hold, double* step_bar, double* step_cost, u32* step_word) {
    const u32 k = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 t = split_start + k;
    if (t >= split_end) return;
    // The member's part (a row of blocks a member).
    at_member(split_end - split_start, targets, step_hold, step_bar, step_cost, step_word);
    Market m = {0, open, close, session, contract, 0};
    Exec xc = {multiplier, cost_per_side, slippage_price};
    const bool first = t == split_start || session[t] != session[t - 1];
    int before = first ? 0 : (int)targets[k - 1];
    int target = targets[k];
    before = max(-max_position, min(max_position, before));
    target = max(-max_position, min(max_position, target));
    Trans tr = transition(m, xc, t, split_end, 1, before, target);
    step_hold[k] = tr.hold_pnl;
    step_bar[k] = tr.bar_pnl;
    step_cost[k] = tr.cost;
    step_word[k] = pack_step_word(tr.traded, before, tr.position);
}

// A bar's step as book_steps left it, and what the host's chains read of it.
struct Step {
    double pnl, cost, hold, bar_less_cost, open_part, exit_cost;
    bool inpos, closed, opened;
    u32 traded;
};

// A step's PnL as the host books it: hold and bar PnL less the cost.
__device__ __forceinline__ double step_pnl(double hold, double bar, double cost) {
    return hold + bar - cost;
}

__device__ __forceinline__ Step read_step(double hold, double bar, double cost, u32 word,
                                          double cost_per_side) {
    Step st;
    const int before = (int)((word >> 16) & 0xffu) - 128, after = (int)(word >> 24) - 128;
    st.pnl = step_pnl(hold, bar, cost);
    st.cost = cost;
    st.hold = hold;
    st.traded = word & 0xffffu;
    // foxhunt-env's backtest: a flip closes the old trade and opens a new one.
    int sp = (before > 0) - (before < 0), sn = (after > 0) - (after < 0);
    st.opened = after != 0 && sn != sp;
    st.closed = before != 0 && sn != sp;
    st.inpos = before != 0;
    st.exit_cost = st.closed ? (double)abs(before) * cost_per_side : 0.0;
    st.bar_less_cost = bar - cost;
    st.open_part = bar - (cost - st.exit_cost);
    return st;
}

// A lane's next step, read a batch ahead of its booking (the loads of bar t + 32 in flight while
// bar t is booked); past the session's end a zero step with a flat position before and after.
struct StepAhead {
    const double *hold_in, *bar_in, *cost_in;
    const u32* word_in;
    u32 split_start, se;
    double cost_per_side;
    double hold, bar, cost;
    u32 word;
    __device__ __forceinline__ void load(u32 t) {
        if (t < se) {
            const u32 k = t - split_start;
            hold = hold_in[k];
            bar = bar_in[k];
            cost = cost_in[k];
            word = word_in[k];
        } else {
            hold = bar = cost = 0.0;
            word = pack_step_word(0, 0, 0);
        }
    }
    __device__ __forceinline__ Step step() const {
        return read_step(hold, bar, cost, word, cost_per_side);
    }
};

// The exponent of a finite non-zero double's lowest set bit (v is a whole multiple of 2^that).
__device__ __forceinline__ int low_bit_exponent(double v) {
    unsigned long long bits = (unsigned long long)__double_as_longlong(v);
    int e = (int)((bits >> 52) & 0x7ff);
    unsigned long long mant = bits & 0xfffffffffffffull;
    if (e == 0) return -1074 + __ffsll((long long)mant) - 1;
    return e - 1075 + __ffsll((long long)(mant | (1ull << 52))) - 1;
}

// Whether a sum's terms add to the same bits in every order, collected term by term (the rule
// at the top of this file): q the lowest set bit's exponent over the non-zero terms, mag the
// sum of their magnitudes. Zeros are skipped: adding one changes no partial sum's value.
struct Exactness {
    int q = 4096;
    double mag = 0.0;
    bool finite = true;
    __device__ __forceinline__ void add(double v) {
        if (v == 0.0) return;
        if (!isfinite(v)) {
            finite = false;
            return;
        }
        q = min(q, low_bit_exponent(v));
        mag += fabs(v);
    }
};

// Every partial sum representable: every term a whole multiple of 2^q, their magnitudes summing
// below 2^52 * 2^q (a margin of two over 2^53 for the rounding of this bound's own sum).
__device__ __forceinline__ bool exact_in_any_order(int q, double mag, bool finite) {
    return finite && mag <= ldexp(1.0, 52 + min(q, 2048));
}

// The host's chains over a session's steps, bar by bar: the day's PnL and each trade's PnL
// (trades, wins, bars held), every lane alike, reading each 32 bars' terms from shared memory
// (a broadcast read a term instead of two shuffles a double: 17-31% faster on the H200 than
// shuffles). Zero steps are added too (adding a zero to a sum that starts at +0.0 changes
// nothing); a lane past the session's end adds zeros and no trade.
__device__ __forceinline__ void session_chains(u32 ss, u32 se, u32 split_start, double cost_per_side,
                                            const double* step_hold, const double* step_bar,
                                            const double* step_cost, const u32* step_word,
                                            double* s_term, unsigned* s_flags, double* day_out,
                                            unsigned long long* ntr_out,
                                            unsigned long long* nwin_out,
                                            unsigned long long* nbars_out) {
    const u32 lane = threadIdx.x & 31;
    double day = 0.0, trade_pnl = 0.0;
    unsigned long long trade_bars = 0, ntr = 0, nwin = 0, nbars = 0;
    StepAhead next{step_hold, step_bar, step_cost, step_word, split_start, se, cost_per_side};
    next.load(ss + lane);
    for (u32 b0 = ss; b0 < se; b0 += 32) {
        const u32 t = b0 + lane;
        const bool live = t < se;
        const Step st = next.step();
        next.load(t + 32);
        s_term[0 * 32 + lane] = live ? st.pnl : 0.0;
        s_term[1 * 32 + lane] = st.hold;
        s_term[2 * 32 + lane] = st.bar_less_cost;
        s_term[3 * 32 + lane] = st.open_part;
        s_term[4 * 32 + lane] = st.exit_cost;
        s_flags[lane] =
            live ? (u32)st.inpos | ((u32)st.closed << 1) | ((u32)st.opened << 2) : 0u;
        __syncwarp();
#pragma unroll 8
        for (u32 j = 0; j < 32; ++j) {
            const unsigned flags = s_flags[j];
            day += s_term[j];
            if (flags & 1u) {
                trade_pnl += s_term[32 + j];
                trade_bars += 1;
                if (flags & 2u) {
                    double p = trade_pnl - s_term[4 * 32 + j];
                    ntr += 1;
                    nwin += p > 0.0 ? 1 : 0;
                    nbars += trade_bars;
                } else {
                    trade_pnl += s_term[2 * 32 + j];
                }
            }
            if (flags & 4u) {
                trade_pnl = s_term[3 * 32 + j];
                trade_bars = 0;
            }
        }
        __syncwarp();
    }
    *day_out = day;
    *ntr_out = ntr;
    *nwin_out = nwin;
    *nbars_out = nbars;
}

// What a warp of book_sessions leaves for the session's sum over its warps: its slice's sums
// (from zero carries), the trade it leaves open (its last opening), and the close in it whose
// trade opened in an earlier slice (its orphan: at most one, the slice's first close when no
// opening comes before it in the slice).
struct SliceSum {
    double day, z, base, o_zex, o_hold, o_exit, mag;
    unsigned long long ntr, nwin, nbars, ncon;
    u32 in_bars, in_base, o_in;
    int q;
    bool opened, orphan, finite, nz_second_last, nz_last;
};

// A block a session of the split (bars [sess_start[s], sess_end[s])), its warps each booking a
// slice of whole 32s of the session, 32 bars at a time, from the steps book_steps computed (the
// next 32 read while these are booked): the session's non-zero step PnLs and costs gathered in
// bar order (into pnl_out / cost_out from the session's first row on, zeros in the session's
// rows after them, for book_total's sums over the split; each warp's place after the slices
// before it, counted first), with `seen`: whether the equity after that step is a point of the
// host's curve (the point after the bar before a session's last is overwritten by the last
// bar's equity).
//
// The host's chains, the day's PnL and each trade's PnL, are sums in bar order. The warps sum
// them side by side: the day's PnL a warp sum a batch; a trade's PnL from the prefix sum of the
// terms its chain adds while held (each bar in a position that does not close adds its hold and
// bar-less-cost parts), taken where it opened and where it closed. A trade open across slices
// is closed by the session's sum over the warps (warp 0, in slice order), from its slice's
// prefix at the opening and the carries of the slices in between. Every term is checked: where
// every order of adding gives the chain's bits (the rule at the top of this file), these sums
// are the chain's; where that does not hold for a session, warp 0 runs the chains bar by bar
// (session_chains).
// Warps of a book_sessions block at most (the host launches 1 to BOOK_WARPS warps a block).
#define BOOK_WARPS 8
extern "C" __global__ void __launch_bounds__(BOOK_WARPS * 32, 1)
    book_sessions(u32 split_start, u32 n_bars, double cost_per_side, const u32* sess_start,
                  const u32* sess_end, u32 n_sessions, const double* step_hold,
                  const double* step_bar, const double* step_cost, const u32* step_word,
                  double* daily, u32* n_pnl, u32* n_cost, unsigned long long* n_trades,
                  unsigned long long* wins, unsigned long long* bars,
                  unsigned long long* contracts, double* pnl_out, unsigned char* seen_out,
                  double* cost_out) {
    const unsigned FULL = 0xffffffffu;
    __shared__ double s_term[5 * 32];
    __shared__ unsigned s_flags[32];
    __shared__ u32 s_np[BOOK_WARPS], s_nc[BOOK_WARPS];
    __shared__ SliceSum s_sum[BOOK_WARPS];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const u32 sid = blockIdx.x;
    if (sid >= n_sessions) return;
    // The member's part (a row of blocks a member): its steps and its sessions' entries.
    at_member(n_bars, step_hold, step_bar, step_cost, step_word, pnl_out, seen_out, cost_out);
    at_member(n_sessions, daily, n_pnl, n_cost, n_trades, wins, bars, contracts);
    const u32 ss = sess_start[sid], se = sess_end[sid];
    const u32 out0 = ss - split_start;
    const u32 batches = (se - ss + 31) / 32;
    const u32 a = ss + 32 * (warp * batches / warps);
    const u32 b = min(se, ss + 32 * ((warp + 1) * batches / warps));
    const unsigned below = (1u << lane) - 1u;
    // The slice's places: its non-zero steps and costs counted first, the slices before it
    // summed.
    {
        u32 cp = 0, cc = 0;
#pragma unroll 4
        for (u32 t = a + lane; t < b; t += 32) {
            const u32 k = t - split_start;
            const double cost = step_cost[k];
            const double pnl = step_pnl(step_hold[k], step_bar[k], cost);
            cp += pnl != 0.0;
            cc += cost != 0.0;
        }
        for (u32 o = 16; o > 0; o >>= 1) {
            cp += __shfl_xor_sync(FULL, cp, o);
            cc += __shfl_xor_sync(FULL, cc, o);
        }
        if (lane == 0) {
            s_np[warp] = cp;
            s_nc[warp] = cc;
        }
    }
    __syncthreads();
    u32 np = 0, nc = 0, np_all = 0, nc_all = 0;
    for (u32 v = 0; v < warps; ++v) {
        if (v == warp) {
            np = np_all;
            nc = nc_all;
        }
        np_all += s_np[v];
        nc_all += s_nc[v];
    }
    // The session's rows after its non-zero steps (and after its costs) hold zeros, not points,
    // so book_total sums every row of the split in order.
    for (u32 k = np_all + threadIdx.x; k < se - ss; k += blockDim.x) {
        pnl_out[out0 + k] = 0.0;
        seen_out[out0 + k] = 0;
    }
    for (u32 k = nc_all + threadIdx.x; k < se - ss; k += blockDim.x) cost_out[out0 + k] = 0.0;
    // The chains' carries from batch to batch (from zero at the slice's start): the day's PnL,
    // z's prefix sum, the count of bars in a position, and the slice's last opened trade's
    // base and that count where it opened.
    double day = 0.0, held = 0.0, base = 0.0;
    u32 in_carry = 0, in_base = 0;
    bool opened_before = false, orphan = false;
    double o_zex = 0.0, o_hold = 0.0, o_exit = 0.0;
    u32 o_in = 0;
    unsigned long long ntr = 0, nwin = 0, nbars = 0, ncon = 0;
    Exactness ex;
    bool nz_second_last = false, nz_last = false;
    StepAhead next{step_hold, step_bar, step_cost, step_word, split_start, b, cost_per_side};
    next.load(a + lane);
    for (u32 b0 = a; b0 < b; b0 += 32) {
        const u32 t = b0 + lane;
        const bool live = t < b;
        const Step st = next.step();
        next.load(t + 32);
        const double pnl = live ? st.pnl : 0.0, cost = st.cost;
        u32 traded = live ? st.traded : 0;
        // Gathered in bar order: each lane's place among the block's non-zero steps and costs.
        unsigned nzp = __ballot_sync(FULL, live && pnl != 0.0);
        unsigned nzc = __ballot_sync(FULL, live && cost != 0.0);
        if (live && pnl != 0.0) {
            u32 k = out0 + np + __popc(nzp & below);
            pnl_out[k] = pnl;
            seen_out[k] = 1;
        }
        if (live && cost != 0.0) cost_out[out0 + nc + __popc(nzc & below)] = cost;
        np += __popc(nzp);
        nc += __popc(nzc);
        nz_second_last = nz_second_last || (__ballot_sync(FULL, t + 2 == se && pnl != 0.0) != 0);
        nz_last = nz_last || (__ballot_sync(FULL, t + 1 == se && pnl != 0.0) != 0);
        // The chains' terms (what session_chains adds), each checked for exactness: a trade's
        // chain adds z, a bar in a position's hold and, unless it closes there, its
        // bar-less-cost part.
        const bool inpos = live && st.inpos, closes = inpos && st.closed;
        const bool opens = live && st.opened;
        const double z = inpos ? (closes ? st.hold : st.hold + st.bar_less_cost) : 0.0;
        ex.add(pnl);
        if (inpos) ex.add(st.hold);
        if (inpos && !closes) ex.add(st.bar_less_cost);
        if (closes) ex.add(st.exit_cost);
        if (opens) ex.add(st.open_part);
        // Warp sums: the day's PnL, the contracts traded; prefixes: z's sum and the count of
        // bars in a position, through this bar (in) and before it (ex).
        double d = pnl, s = z;
        for (u32 o = 16; o > 0; o >>= 1) {
            d += __shfl_xor_sync(FULL, d, o);
            traded += __shfl_xor_sync(FULL, traded, o);
        }
        for (u32 o = 1; o < 32; o <<= 1) {
            const double u = __shfl_up_sync(FULL, s, o);
            if (lane >= o) s += u;
        }
        day += d;
        ncon += traded;
        const double z_in = held + s;
        const double z_up = __shfl_up_sync(FULL, z_in, 1);
        const double z_ex = lane == 0 ? held : z_up;
        held = __shfl_sync(FULL, z_in, 31);
        const unsigned inpos_mask = __ballot_sync(FULL, inpos);
        const u32 in_bars = in_carry + __popc(inpos_mask & ((2u << lane) - 1u));
        in_carry += __popc(inpos_mask);
        // The chain's trade PnL after bar t is base + (z's prefix through t), base being the
        // opening term less that prefix at the last opening: a close at t reads it before t's
        // own terms, adds t's hold, less the exit's cost. Bars held: the bars in a position
        // since the opening. A close with no opening before it in the slice is the slice's
        // orphan, closed by the sum over the warps.
        const double my_base = st.open_part - z_in;
        const unsigned opened = __ballot_sync(FULL, opens);
        const unsigned earlier = opened & below;
        const u32 src = earlier ? 31 - __clz(earlier) : lane;
        const double b_lane = __shfl_sync(FULL, my_base, src);
        const u32 ib_lane = __shfl_sync(FULL, in_bars, src);
        const double bb = earlier ? b_lane : base;
        const u32 ib = earlier ? ib_lane : in_base;
        const double p = ((bb + z_ex) + st.hold) - st.exit_cost;
        const bool lone = closes && !earlier && !opened_before;
        const bool owned = closes && !lone;
        ntr += __popc(__ballot_sync(FULL, closes));
        nwin += __popc(__ballot_sync(FULL, owned && p > 0.0));
        u32 held_bars = owned ? in_bars - ib : 0;
        for (u32 o = 16; o > 0; o >>= 1) held_bars += __shfl_xor_sync(FULL, held_bars, o);
        nbars += held_bars;
        const unsigned lone_mask = __ballot_sync(FULL, lone);
        if (lone_mask) {
            const u32 l = __ffs(lone_mask) - 1;
            orphan = true;
            o_zex = __shfl_sync(FULL, z_ex, l);
            o_hold = __shfl_sync(FULL, st.hold, l);
            o_exit = __shfl_sync(FULL, st.exit_cost, l);
            o_in = __shfl_sync(FULL, in_bars, l);
        }
        if (opened) {
            const u32 last = 31 - __clz(opened);
            base = __shfl_sync(FULL, my_base, last);
            in_base = __shfl_sync(FULL, in_bars, last);
            opened_before = true;
        }
    }
    // The slice's verdict on exactness, over every lane's terms.
    for (u32 o = 16; o > 0; o >>= 1) {
        ex.q = min(ex.q, __shfl_xor_sync(FULL, ex.q, o));
        ex.mag += __shfl_xor_sync(FULL, ex.mag, o);
    }
    ex.finite = __all_sync(FULL, ex.finite);
    if (lane == 0)
        s_sum[warp] = SliceSum{day,     held,  base,     o_zex,          o_hold,  o_exit,
                               ex.mag,  ntr,   nwin,     nbars,          ncon,    in_carry,
                               in_base, o_in,  ex.q,     opened_before,  orphan,  ex.finite,
                               nz_second_last, nz_last};
    __syncthreads();
    if (warp != 0) return;
    // The session's sums over its slices, in order (every lane of warp 0 alike), with the
    // trade open at each slice's start: its base and count of bars in a position at the opening
    // as of the session's start.
    day = 0.0;
    ntr = nwin = nbars = ncon = 0;
    ex = Exactness{};
    nz_second_last = nz_last = false;
    double z_carry = 0.0, open_base = 0.0;
    u32 in_at = 0, open_in = 0;
    for (u32 v = 0; v < warps; ++v) {
        const SliceSum& q = s_sum[v];
        day += q.day;
        ntr += q.ntr;
        nwin += q.nwin;
        nbars += q.nbars;
        ncon += q.ncon;
        if (q.orphan) {
            const double p = ((open_base + (z_carry + q.o_zex)) + q.o_hold) - q.o_exit;
            nwin += p > 0.0 ? 1 : 0;
            nbars += (in_at + q.o_in) - open_in;
        }
        if (q.opened) {
            open_base = q.base - z_carry;
            open_in = in_at + q.in_base;
        }
        z_carry += q.z;
        in_at += q.in_bars;
        ex.q = min(ex.q, q.q);
        ex.mag += q.mag;
        ex.finite = ex.finite && q.finite;
        nz_second_last = nz_second_last || q.nz_second_last;
        nz_last = nz_last || q.nz_last;
    }
    if (!exact_in_any_order(ex.q, ex.mag, ex.finite))
        session_chains(ss, se, split_start, cost_per_side, step_hold, step_bar, step_cost,
                       step_word, s_term, s_flags, &day, &ntr, &nwin, &nbars);
    if (lane == 0) {
        if (se - ss >= 2 && nz_second_last && nz_last) seen_out[out0 + np_all - 2] = 0;
        daily[sid] = day;
        n_pnl[sid] = np_all;
        n_cost[sid] = nc_all;
        n_trades[sid] = ntr;
        wins[sid] = nwin;
        bars[sid] = nbars;
        contracts[sid] = ncon;
    }
}

// Blocks of a book_total row (a cluster) at most: the host launches 1 to BOOK_BLOCKS.
#define BOOK_BLOCKS 8
// Below every equity: the top of a run without points.
#define NO_TOP (-__longlong_as_double(0x7ff0000000000000ll))

// What a run of rows contributes to the split's sums (a warp's segment, a block's rows): the
// steps' sum and the highest equity at a point of the curve relative to the run's first row
// (meaningful where the sums are exact), the exactness of the steps and of the costs, and the
// costs' sum.
struct BookPart {
    double sum, top, mag, cmag, csum;
    int q, cq;
    bool finite, cfinite;
};

// What a block of book_total learns when its row's parts meet: whether the steps' and the
// costs' sums are exact in any order, the costs' sum, and its carry (the steps' sum before its
// first row) and the running peak before it.
struct BookMeet {
    double carry, peak, csum;
    bool exact, costs_exact;
};

__device__ __forceinline__ BookPart book_none() {
    return BookPart{0.0, NO_TOP, 0.0, 0.0, 0.0, 4096, 4096, true, true};
}

// Runs side by side on a warp's lanes (a run a lane, in order) scanned: each lane gets the run
// of the lanes up to it as one, where a top inside a later run is its top above the sum before.
__device__ __forceinline__ void scan_runs(double& sum, double& top) {
    const u32 lane = threadIdx.x & 31;
    for (u32 o = 1; o < 32; o <<= 1) {
        const double s = __shfl_up_sync(0xffffffffu, sum, o);
        const double t = __shfl_up_sync(0xffffffffu, top, o);
        if (lane >= o) {
            top = fmax(t, s + top);
            sum = s + sum;
        }
    }
}

// The exactness verdicts and the costs' sum of a warp's parts, a lane each, over every lane
// (every lane gets them); the costs in one butterfly order, so every lane's sum has the same bits.
__device__ __forceinline__ void book_warp_costs(BookPart& p) {
    const unsigned FULL = 0xffffffffu;
    for (u32 o = 16; o > 0; o >>= 1) {
        p.mag += __shfl_xor_sync(FULL, p.mag, o);
        p.cmag += __shfl_xor_sync(FULL, p.cmag, o);
        p.csum += __shfl_xor_sync(FULL, p.csum, o);
        p.q = min(p.q, __shfl_xor_sync(FULL, p.q, o));
        p.cq = min(p.cq, __shfl_xor_sync(FULL, p.cq, o));
    }
    p.finite = __all_sync(FULL, p.finite);
    p.cfinite = __all_sync(FULL, p.cfinite);
}

// A warp's parts, a lane each, as one (every lane gets it; the lanes past the last part hold
// book_none), their runs already scanned (scan_runs): lane 31's run, the verdicts and the
// costs' sums over every lane.
__device__ __forceinline__ BookPart book_warp_all(BookPart p) {
    const unsigned FULL = 0xffffffffu;
    p.sum = __shfl_sync(FULL, p.sum, 31);
    p.top = __shfl_sync(FULL, p.top, 31);
    book_warp_costs(p);
    return p;
}

// A barrier of the blocks of a row: its cluster's, or the block's where it is alone.
__device__ __forceinline__ void book_sync(u32 blocks) {
    if (blocks > 1) cluster_barrier(); else __syncthreads();
}

template <typename T>
__device__ __forceinline__ T* book_at(T* p, u32 blocks, u32 rank) {
    return blocks > 1 ? cluster_ptr(p, rank) : p;
}

// The parts meet (every thread of the row calls it, after its warp's part is in s_warp): warp 0
// of each block combines its warps' parts into the block's, leaving each warp's carry and the
// top before it relative to the block's first row in s_wsum / s_wtop, and pushes the block's
// part into every block's s_part; after the row's barrier, warp 0 combines the blocks' parts
// into s_meet. Every thread may read s_meet, s_wsum and s_wtop on return.
__device__ void book_meet(const BookPart* s_warp, u32 warps, BookPart* s_part, u32 blocks,
                          u32 rank, bool chain_only, double* s_wsum, double* s_wtop,
                          BookMeet* s_meet) {
    const unsigned FULL = 0xffffffffu;
    const u32 lane = threadIdx.x & 31;
    __syncthreads();
    if (threadIdx.x < 32) {
        BookPart p = lane < warps ? s_warp[lane] : book_none();
        scan_runs(p.sum, p.top);
        const double es = __shfl_up_sync(FULL, p.sum, 1), et = __shfl_up_sync(FULL, p.top, 1);
        if (lane < warps) {
            s_wsum[lane] = lane == 0 ? 0.0 : es;
            s_wtop[lane] = lane == 0 ? NO_TOP : et;
        }
        p = book_warp_all(p);
        if (lane < blocks) *book_at(&s_part[rank], blocks, lane) = p;
    }
    book_sync(blocks);
    if (threadIdx.x < 32) {
        BookPart p = lane < blocks ? s_part[lane] : book_none();
        scan_runs(p.sum, p.top);
        const double es = __shfl_sync(FULL, p.sum, rank == 0 ? 0 : rank - 1);
        const double et = __shfl_sync(FULL, p.top, rank == 0 ? 0 : rank - 1);
        p = book_warp_all(p);
        if (lane == 0)
            *s_meet = BookMeet{rank == 0 ? 0.0 : es, rank == 0 ? 0.0 : fmax(0.0, et), p.csum,
                               !chain_only && exact_in_any_order(p.q, p.mag, p.finite),
                               !chain_only && exact_in_any_order(p.cq, p.cmag, p.cfinite)};
    }
    __syncthreads();
}

// The host's chain over the rows [k0, k1) from acc, in order, by a whole warp (every lane
// alike): 32 rows read at once into `buf` (32 doubles of the warp's own) and the next 32 read
// while the chain adds these from it (a broadcast read a row, off the chain's path; one thread
// reading ahead itself waits on memory every few rows); y, where given, gets every partial sum.
__device__ __forceinline__ double warp_chain(const double* x, double* y, u32 k0, u32 k1,
                                             double acc, double* buf) {
    const u32 lane = threadIdx.x & 31;
    double ahead = k0 + lane < k1 ? x[k0 + lane] : 0.0;
    for (u32 b = k0; b < k1; b += 32) {
        __syncwarp();
        buf[lane] = ahead;
        __syncwarp();
        ahead = b + 32 + lane < k1 ? x[b + 32 + lane] : 0.0;
        const u32 n = min(32u, k1 - b);
        double mine = 0.0;
#pragma unroll 8
        for (u32 j = 0; j < n; ++j) {
            acc += buf[j];
            if (j == lane) mine = acc;
        }
        if (y && lane < n) y[b + lane] = mine;
    }
    return acc;
}

// Rows a lane takes side by side in book_total's passes (neighbouring rows: a lane sums its
// own in order, and one scan over the lanes joins them).
#define BOOK_LANE_ROWS 4

// The split's totals over the rows book_sessions left (each session's non-zero steps and costs
// in bar order from its first row, zeros after them, so a sum over every row in order adds what
// the host's chain adds, and only zeros besides): the costs and the equity summed as the host
// sums them, the maximum drawdown over the curve's points, the sessions' counts. A row of
// blocks (one cluster) a member, each block a run of rows and each of its warps a segment of
// that run. out: [0] costs, [1] max drawdown, [2] as a fraction, [3..7) trades, wins, bars
// held, contracts (u64 bits), [7] 1 when the equity was summed in parallel (exact), then the
// daily PnL of each session. E: the equity after each row (scratch).
//
// Where every order of adding gives the host's bits (the rule at the top of this file), each
// warp scans its segment from zero and the parts meet once (book_meet) to give every warp its
// carry and the peak before it; else a warp runs the host's chain over the rows and the parts
// meet again over its curve. The drawdown's maxima, exact in any grouping, meet in block 0.
extern "C" __global__ void __launch_bounds__(1024)
    book_total(u32 n_sessions, const u32* sess_start, u32 split_start, u32 n_bars,
               const double* daily, const u32* n_pnl, const u32* n_cost,
               const unsigned long long* n_trades, const unsigned long long* wins,
               const unsigned long long* bars, const unsigned long long* contracts,
               const double* V, const unsigned char* F, const double* C, double capital,
               u32 chain_only, double* E, double* out) {
    const unsigned FULL = 0xffffffffu;
    // Every block's part (each block's pushed into every block's copy), this block's warps'
    // parts and their carries and tops, what the meeting gave, the drawdown's maxima of this
    // block's warps and of every block (in block 0's), the costs' chain (block 0's).
    __shared__ BookPart s_part[BOOK_BLOCKS];
    __shared__ BookPart s_warp[32];
    __shared__ double s_wsum[32], s_wtop[32];
    __shared__ BookMeet s_meet;
    __shared__ double s_wmd[32], s_wmf[32];
    __shared__ double s_md[BOOK_BLOCKS], s_mf[BOOK_BLOCKS];
    __shared__ double s_costs;
    __shared__ double s_chain[2][32];
    // The member's part (a row of blocks a member, blockIdx.y).
    at_member(n_sessions, daily, n_pnl, n_cost, n_trades, wins, bars, contracts);
    at_member(n_bars, V, F, C, E);
    at_member(8 + n_sessions, out);
    const u32 G = gridDim.x, rank = blockIdx.x, T = blockDim.x;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = T >> 5;
    const u32 BATCH = 32 * BOOK_LANE_ROWS;
    const u32 per = ((n_bars + G - 1) / G + 31) & ~31u;
    const u32 r0 = min(rank * per, n_bars), r1 = min(r0 + per, n_bars);
    const u32 seg = ((r1 - r0 + warps - 1) / warps + 31) & ~31u;
    const u32 s0 = min(r0 + warp * seg, r1), s1 = min(s0 + seg, r1);
    for (u32 s = rank * T + threadIdx.x; s < n_sessions; s += G * T) out[8 + s] = daily[s];
    // The segment's steps summed from zero (the equity relative to the segment's start, in E),
    // its top at a point, and both sums' exactness: a lane's rows in order, then the lanes'
    // sums scanned.
    Exactness ex, cex;
    double run = 0.0, top = NO_TOP, csum = 0.0;
    for (u32 b = s0; b < s1; b += BATCH) {
        const u32 k0 = b + BOOK_LANE_ROWS * lane;
        double x[BOOK_LANE_ROWS], c[BOOK_LANE_ROWS];
        bool point[BOOK_LANE_ROWS];
#pragma unroll
        for (u32 i = 0; i < BOOK_LANE_ROWS; ++i) {
            const bool in = k0 + i < s1;
            x[i] = in ? V[k0 + i] : 0.0;
            c[i] = in ? C[k0 + i] : 0.0;
            point[i] = in && F[k0 + i];
        }
#pragma unroll
        for (u32 i = 0; i < BOOK_LANE_ROWS; ++i) {
            ex.add(x[i]);
            cex.add(c[i]);
            csum += c[i];
            if (i > 0) x[i] += x[i - 1];
        }
        double inc = x[BOOK_LANE_ROWS - 1];
        for (u32 o = 1; o < 32; o <<= 1) {
            const double u = __shfl_up_sync(FULL, inc, o);
            if (lane >= o) inc += u;
        }
        const double up = __shfl_up_sync(FULL, inc, 1);
        const double base = run + (lane == 0 ? 0.0 : up);
#pragma unroll
        for (u32 i = 0; i < BOOK_LANE_ROWS; ++i) {
            const double e = base + x[i];
            if (k0 + i < s1) E[k0 + i] = e;
            if (point[i]) top = fmax(top, e);
        }
        run += __shfl_sync(FULL, inc, 31);
    }
    for (u32 o = 16; o > 0; o >>= 1) top = fmax(top, __shfl_xor_sync(FULL, top, o));
    BookPart part{run, top, ex.mag, cex.mag, csum, ex.q, cex.q, ex.finite, cex.finite};
    book_warp_costs(part);
    if (lane == 0) s_warp[warp] = part;
    book_meet(s_warp, warps, s_part, G, rank, chain_only, s_wsum, s_wtop, &s_meet);
    const bool exact = s_meet.exact, costs_exact = s_meet.costs_exact;
    // Where not exact, the host's chains, each by a warp: the costs' by the last block's first
    // warp (block 0's second where alone), the equity's by block 0's first.
    if (!costs_exact && rank == G - 1 && warp == (G > 1 ? 0 : 1)) {
        double c = 0.0;
        for (u32 s = 0; s < n_sessions; ++s) {
            const u32 k0 = sess_start[s] - split_start;
            c = warp_chain(C, nullptr, k0, k0 + n_cost[s], c, s_chain[1]);
        }
        if (lane == 0) *book_at(&s_costs, G, 0) = c;
    }
    if (!exact) {
        // The equity's chain, then the parts meet again over its curve (no carries: E is the
        // equity).
        if (rank == 0 && warp == 0) {
            double e = 0.0;
            for (u32 s = 0; s < n_sessions; ++s) {
                const u32 k0 = sess_start[s] - split_start;
                e = warp_chain(V, E, k0, k0 + n_pnl[s], e, s_chain[0]);
            }
        }
        book_sync(G);
        double t = NO_TOP;
        for (u32 k = s0 + lane; k < s1; k += 32)
            if (F[k]) t = fmax(t, __ldcg(&E[k]));
        for (u32 o = 16; o > 0; o >>= 1) t = fmax(t, __shfl_xor_sync(FULL, t, o));
        if (lane == 0) {
            s_warp[warp].sum = 0.0;
            s_warp[warp].top = t;
        }
        book_meet(s_warp, warps, s_part, G, rank, chain_only, s_wsum, s_wtop, &s_meet);
    }
    // The warp's carry and the running peak before its segment (the curve's peak starts at 0).
    const double carry = s_meet.carry + s_wsum[warp];
    double peak = fmax(s_meet.peak, s_meet.carry + s_wtop[warp]), md = 0.0, mf = 0.0;
    // The maximum drawdown over the segment's points: a lane's rows in order from the peak
    // before them (the lanes' tops scanned); a row off the curve counts as 0 (no peak is below
    // it).
    for (u32 b = s0; b < s1; b += BATCH) {
        const u32 k0 = b + BOOK_LANE_ROWS * lane;
        bool point[BOOK_LANE_ROWS];
        double e[BOOK_LANE_ROWS];
        double m = 0.0;
#pragma unroll
        for (u32 i = 0; i < BOOK_LANE_ROWS; ++i) {
            point[i] = k0 + i < s1 && F[k0 + i];
            e[i] = point[i] ? carry + __ldcg(&E[k0 + i]) : 0.0;
            m = fmax(m, e[i]);
        }
        for (u32 o = 1; o < 32; o <<= 1) {
            const double u = __shfl_up_sync(FULL, m, o);
            if (lane >= o) m = fmax(m, u);
        }
        const double up = __shfl_up_sync(FULL, m, 1);
        double pk = lane == 0 ? peak : fmax(peak, up);
#pragma unroll
        for (u32 i = 0; i < BOOK_LANE_ROWS; ++i) {
            pk = fmax(pk, e[i]);
            if (point[i]) {
                md = fmax(md, pk - e[i]);
                mf = fmax(mf, (pk - e[i]) / (capital + pk));
            }
        }
        peak = fmax(peak, __shfl_sync(FULL, m, 31));
    }
    for (u32 o = 16; o > 0; o >>= 1) {
        md = fmax(md, __shfl_xor_sync(FULL, md, o));
        mf = fmax(mf, __shfl_xor_sync(FULL, mf, o));
    }
    if (lane == 0) {
        s_wmd[warp] = md;
        s_wmf[warp] = mf;
    }
    __syncthreads();
    if (warp == 0) {
        md = lane < warps ? s_wmd[lane] : 0.0;
        mf = lane < warps ? s_wmf[lane] : 0.0;
        for (u32 o = 16; o > 0; o >>= 1) {
            md = fmax(md, __shfl_xor_sync(FULL, md, o));
            mf = fmax(mf, __shfl_xor_sync(FULL, mf, o));
        }
        if (lane == 0) {
            *book_at(&s_md[rank], G, 0) = md;
            *book_at(&s_mf[rank], G, 0) = mf;
        }
    }
    book_sync(G);
    if (rank == 0 && warp == 0) {
        md = lane < G ? s_md[lane] : 0.0;
        mf = lane < G ? s_mf[lane] : 0.0;
        // The sessions' counts (u64: exact in any order).
        unsigned long long tr = 0, win = 0, held = 0, con = 0;
        for (u32 s = lane; s < n_sessions; s += 32) {
            tr += n_trades[s];
            win += wins[s];
            held += bars[s];
            con += contracts[s];
        }
        for (u32 o = 16; o > 0; o >>= 1) {
            md = fmax(md, __shfl_xor_sync(FULL, md, o));
            mf = fmax(mf, __shfl_xor_sync(FULL, mf, o));
            tr += __shfl_xor_sync(FULL, tr, o);
            win += __shfl_xor_sync(FULL, win, o);
            held += __shfl_xor_sync(FULL, held, o);
            con += __shfl_xor_sync(FULL, con, o);
        }
        if (lane == 0) {
            out[0] = costs_exact ? s_meet.csum : s_costs;
            out[1] = md;
            out[2] = mf;
            out[3] = __longlong_as_double((long long)tr);
            out[4] = __longlong_as_double((long long)win);
            out[5] = __longlong_as_double((long long)held);
            out[6] = __longlong_as_double((long long)con);
            out[7] = exact ? 1.0 : 0.0;
        }
    }
}
