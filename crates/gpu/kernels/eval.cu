// foxhunt device evaluation: the greedy policy of a dense Q-network backtested over a split,
// deciding at every bar exactly what the host decides (foxhunt-dqn's HostQNetwork::greedy inside
// foxhunt-env's backtest). Needs env_step.cu (Market, Exec, transition, next_entry) in the module.
//
// Exactness: each output of a dense layer is one thread's sum in the host's order (bias first,
// then the inputs in order), layer norm's sums run in order on one thread, and the module is
// compiled with --fmad=false, so every product and sum rounds alone as on the host. Only ReLU
// is evaluated here (the host's tanh and GELU are library functions the device does not share);
// the caller falls back to the host for the others.
//
// Two kernels. eval_flat decides, for every bar of the split, what a flat trader (position 0,
// no unrealized PnL) would do: bars in parallel. eval_scan walks each session on one block
// (flatten-at-close makes sessions independent: each starts flat), taking flat decisions from
// eval_flat and, while a position is held, deciding up to `spec` bars at once on the guess that
// the position is held: the guess is checked bar by bar and the walk stops at the first bar where
// the decision trades, so every decision used is the one the host makes in that state.

// The network description (u64 words), written by the host (foxhunt-dqn's QNetLayout):
// [0] hidden layers L, [1] actions, [2] obs_dim, [3] layer norm (0/1), [4] dueling (0/1), then
// per hidden layer: weight offset, bias offset, d_in, d_out, norm scale offset, norm shift offset;
// then the head: weight offset, bias offset, d_in, d_out; then the value head (dueling) likewise.
#define NET_HEADER 5
#define NET_LAYER 6

struct Net {
    const float* p;
    const unsigned long long* w;
};

__device__ __forceinline__ u32 net_hidden(const Net& n) { return (u32)n.w[0]; }
__device__ __forceinline__ u32 net_actions(const Net& n) { return (u32)n.w[1]; }
__device__ __forceinline__ u32 net_obs_dim(const Net& n) { return (u32)n.w[2]; }
__device__ __forceinline__ const unsigned long long* net_layer(const Net& n, u32 l) {
    return n.w + NET_HEADER + (u64)l * NET_LAYER;
}
__device__ __forceinline__ const unsigned long long* net_head(const Net& n) {
    return n.w + NET_HEADER + (u64)net_hidden(n) * NET_LAYER;
}

// y[b][o] = bias[o] + sum_i x[b][i] * W[i][o] for b < rows, o < d_out (x rows of stride d_in,
// y rows of stride d_out), the host's order. A thread takes one output column for up to four rows
// at a time (every blockDim / d_out-th row), so that each weight it loads serves them all and
// their sums run side by side.
__device__ void block_dense(const float* p, u64 w_off, u64 b_off, u32 d_in, u32 d_out,
                            const float* x, float* y, u32 rows) {
    const float* w = p + w_off;
    const float* bias = p + b_off;
    const u32 groups = d_out >= blockDim.x ? 1 : blockDim.x / d_out;
    for (u32 k = threadIdx.x; k < groups * d_out; k += blockDim.x) {
        const u32 o = k % d_out, g = k / d_out;
        for (u32 r0 = g; r0 < rows; r0 += 4 * groups) {
            float acc[4];
#pragma unroll
            for (u32 j = 0; j < 4; ++j) acc[j] = bias[o];
            for (u32 i = 0; i < d_in; ++i) {
                const float wv = w[(u64)i * d_out + o];
#pragma unroll
                for (u32 j = 0; j < 4; ++j) {
                    const u32 r = r0 + j * groups;
                    if (r < rows) acc[j] = acc[j] + x[(u64)r * d_in + i] * wv;
                }
            }
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                const u32 r = r0 + j * groups;
                if (r < rows) y[(u64)r * d_out + o] = acc[j];
            }
        }
    }
}

// Layer norm (when on) then ReLU over rows of width `width`, in place, as the host: mean and
// variance summed in order on one thread per row (from -0.0, as Rust's f32 sum), then
// ((v - mean) * inv) * gamma + beta, then max(v, 0).
__device__ void block_post(const float* p, int use_norm, u64 g_off, u64 b_off, float* y, u32 rows,
                           u32 width, float* row_mean, float* row_inv) {
    if (use_norm) {
        for (u32 r = threadIdx.x; r < rows; r += blockDim.x) {
            const float* yr = y + (u64)r * width;
            float n = (float)width;
            float s = -0.0f;
            for (u32 j = 0; j < width; ++j) s = s + yr[j];
            float mean = s / n;
            float v = -0.0f;
            for (u32 j = 0; j < width; ++j) { float d = yr[j] - mean; v = v + d * d; }
            v = v / n;
            row_mean[r] = mean;
            row_inv[r] = 1.0f / sqrtf(v + 1e-5f);
        }
        __syncthreads();
        const float* gamma = p + g_off;
        const float* beta = p + b_off;
        for (u32 k = threadIdx.x; k < rows * width; k += blockDim.x) {
            u32 r = k / width, j = k % width;
            y[k] = (y[k] - row_mean[r]) * row_inv[r] * gamma[j] + beta[j];
        }
        __syncthreads();
    }
    for (u32 k = threadIdx.x; k < rows * width; k += blockDim.x) y[k] = fmaxf(y[k], 0.0f);
    __syncthreads();
}

// The greedy actions of `rows` observations in `x` (rows x obs_dim) into act[rows]. `a` and `b`
// are scratch rows x max_width each; `stat` 2 x rows. The whole block calls it.
__device__ void block_greedy(const Net& n, float* x, float* a, float* b, float* stat, u32 rows,
                             int* act) {
    u32 L = net_hidden(n);
    int use_norm = (int)n.w[3];
    const float* in = x;
    float* out = a;
    for (u32 l = 0; l < L; ++l) {
        const unsigned long long* d = net_layer(n, l);
        block_dense(n.p, d[0], d[1], (u32)d[2], (u32)d[3], in, out, rows);
        __syncthreads();
        block_post(n.p, use_norm, d[4], d[5], out, rows, (u32)d[3], stat, stat + rows);
        in = out;
        out = (out == a) ? b : a;
    }
    const unsigned long long* h = net_head(n);
    u32 actions = (u32)h[3];
    // The Q (or advantage) head into `out`; the value head after it.
    block_dense(n.p, h[0], h[1], (u32)h[2], actions, in, out, rows);
    int dueling = (int)n.w[4];
    if (dueling) {
        const unsigned long long* v = h + 4;
        block_dense(n.p, v[0], v[1], (u32)v[2], 1, in, out + (u64)rows * actions, rows);
    }
    __syncthreads();
    for (u32 r = threadIdx.x; r < rows; r += blockDim.x) {
        float* q = out + (u64)r * actions;
        if (dueling) {
            float val = out[(u64)rows * actions + r];
            float s = -0.0f;
            for (u32 j = 0; j < actions; ++j) s = s + q[j];
            float mean = s / (float)actions;
            for (u32 j = 0; j < actions; ++j) q[j] = val + q[j] - mean;
        }
        u32 best = 0;
        for (u32 j = 1; j < actions; ++j) if (q[j] > q[best]) best = j;
        act[r] = (int)best;
    }
    __syncthreads();
}

// The host's EnvConfig::target: action a means a - max_position contracts.
__device__ __forceinline__ int action_target(int a, int max_position) {
    int amax = 2 * max_position;
    return (a < amax ? a : amax) - max_position;
}

#define EVAL_PARAMS                                                                                  \
    const float* features, const double* open, const double* close, const u32* session,              \
        const u32* contract, u32 cols, u32 lookback, int max_position, float upnl_scale,             \
        double tick_size, const float* params, const unsigned long long* net, u32 max_width,         \
        u32 rows_per_round

// Dynamic shared memory of both kernels: obs rows x obs_dim, two rows x max_width scratch rows,
// 2 x rows statistics, rows actions (ints).

// Flat decisions of bars [split_start, split_end): flat_target[t - split_start]. One block per
// rows_per_round bars.
extern "C" __global__ void __launch_bounds__(1024) eval_flat(EVAL_PARAMS, u32 split_start, u32 split_end,
                                     signed char* flat_target) {
    extern __shared__ float sh[];
    Market m = {features, open, close, session, contract, cols};
    Net n = {params, net};
    u32 R = rows_per_round;
    u32 dim = net_obs_dim(n);
    float* x = sh;
    float* a = x + (u64)R * dim;
    float* b = a + (u64)R * max_width;
    float* stat = b + (u64)R * max_width;
    int* act = (int*)(stat + 2 * R);
    u32 first = split_start + blockIdx.x * R;
    if (first >= split_end) return;
    u32 rows = min(R, split_end - first);
    for (u32 r = 0; r < rows; ++r)
        observe(m, lookback, max_position, upnl_scale, tick_size, first + r, 0, 0.0,
                x + (u64)r * dim, threadIdx.x, blockDim.x);
    __syncthreads();
    block_greedy(n, x, a, b, stat, rows, act);
    for (u32 r = threadIdx.x; r < rows; r += blockDim.x)
        flat_target[first + r - split_start] = (signed char)action_target(act[r], max_position);
}

// The decisions of every bar of each session: session s is bars [sess_start[s], sess_end[s]).
// One block per session; targets[t - split_start]. Within a session (flatten-at-close), a bar is
// the session's last, and so terminal, exactly when it is the run's last, so the walk needs the
// market only for a trade's fill; a flat bar whose flat decision is 0 changes nothing, so flat
// stretches are skipped by the block at once.
extern "C" __global__ void __launch_bounds__(1024) eval_scan(EVAL_PARAMS, u32 split_start, u32 split_end,
                                     double multiplier, double cost_per_side, double slippage_price,
                                     const u32* sess_start, const u32* sess_end, u32 n_sessions,
                                     const signed char* flat_target, signed char* targets) {
    extern __shared__ float sh[];
    __shared__ u32 s_t, s_rows, s_next;
    __shared__ int s_pos;
    __shared__ double s_entry;
    u32 s = blockIdx.x;
    if (s >= n_sessions) return;
    Market m = {features, open, close, session, contract, cols};
    Exec xc = {multiplier, cost_per_side, slippage_price};
    Net n = {params, net};
    u32 R = rows_per_round;
    u32 dim = net_obs_dim(n);
    float* x = sh;
    float* a = x + (u64)R * dim;
    float* b = a + (u64)R * max_width;
    float* stat = b + (u64)R * max_width;
    int* act = (int*)(stat + 2 * R);
    u32 end = sess_end[s];
    // Flat decisions are the targets wherever the walk is flat; the walk overwrites the rest.
    for (u32 t = sess_start[s] + threadIdx.x; t < end; t += blockDim.x)
        targets[t - split_start] = flat_target[t - split_start];
    if (threadIdx.x == 0) { s_t = sess_start[s]; s_pos = 0; s_entry = 0.0; }
    __syncthreads();
    while (true) {
        // Flat: the first bar from s_t whose flat decision trades (or the end), found by the
        // block; every flat bar before it keeps the trader flat.
        if (s_pos == 0) {
            if (threadIdx.x == 0) s_next = end;
            __syncthreads();
            for (u32 base = s_t; base < end; base += blockDim.x) {
                u32 t = base + threadIdx.x;
                if (t < end && flat_target[t - split_start] != 0) atomicMin(&s_next, t);
                __syncthreads();
                if (s_next < end) break;
            }
            if (threadIdx.x == 0) {
                u32 t = s_next;
                if (t < end) {
                    int target = flat_target[t - split_start];
                    if (t + 1 == end) {
                        t = end;  // the session's last bar: closed at once, nothing held
                    } else {
                        Trans tr = transition(m, xc, t, split_end, 1, 0, target);
                        s_entry = next_entry(0.0, 0, tr);
                        s_pos = tr.position;
                        t = tr.next_t;
                    }
                }
                s_t = t;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) s_rows = s_t < end ? min(R, end - s_t) : 0;
        __syncthreads();
        u32 t0 = s_t, rows = s_rows;
        if (rows == 0) break;
        int pos = s_pos;
        double entry = s_entry;
        // In position: decide the next `rows` bars as if the position were held.
        for (u32 r = 0; r < rows; ++r)
            observe(m, lookback, max_position, upnl_scale, tick_size, t0 + r, pos, entry,
                    x + (u64)r * dim, threadIdx.x, blockDim.x);
        __syncthreads();
        block_greedy(n, x, a, b, stat, rows, act);
        if (threadIdx.x == 0) {
            u32 t = t0;
            for (u32 r = 0; r < rows; ++r) {
                int target = action_target(act[r], max_position);
                targets[t - split_start] = (signed char)target;
                if (t + 1 == end) { t = end; pos = 0; entry = 0.0; break; }
                if (target == pos) { t += 1; continue; }  // held: nothing changes
                Trans tr = transition(m, xc, t, split_end, 1, pos, target);
                entry = next_entry(entry, pos, tr);
                pos = tr.position;
                t = tr.next_t;
                break;  // a trade leaves the state the later rows were decided in
            }
            s_t = t; s_pos = pos; s_entry = entry;
        }
        __syncthreads();
    }
}
