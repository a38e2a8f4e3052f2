// foxhunt's trading environment on the device: the same arithmetic as foxhunt-env's
// exec::transition, next_entry, observe and episode_start (crates/env/src/{exec,vec_env}.rs), as
// device functions that the environment's kernels (env_step.cu) and the evaluation's (eval.cu)
// share. Compiled by NVRTC with --fmad=false: the CPU reference does not fuse multiply-adds, so
// neither may we if f64 results are to agree bit for bit.

typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ u32 episode_start(u64 seed, u32 env, u32 episode, u32 split_start, u32 split_end) {
    u64 h = mix64(seed ^ mix64(((u64)env << 32) | (u64)episode));
    u64 starts = (u64)(split_end - split_start - 1);
    return split_start + (u32)(h % starts);
}

__device__ __forceinline__ int isign(int v) { return (v > 0) - (v < 0); }

struct Market {
    const float* features;
    const double* open;
    const double* close;
    const u32* session;
    const u32* contract;
    u32 cols;
};

// The observation's last two inputs of bar t in state (position, entry), as foxhunt-env's
// observe: position / max_position, then the unrealized PnL in ticks / upnl_scale.
__device__ __forceinline__ void observe_state(const Market& m, int max_position, float upnl_scale,
                                              double tick_size, u32 t, int position, double entry,
                                              float* out) {
    out[0] = (float)position / (float)max_position;
    double upnl_ticks = position == 0 ? 0.0 : (m.close[t] - entry) * (double)position / tick_size;
    out[1] = (float)upnl_ticks / upnl_scale;
}

// Input k < lookback * cols of bar t's observation: feature k % cols of look-back row k / cols
// (the oldest first; rows before the first bar repeat it).
__device__ __forceinline__ float lookback_feature(const Market& m, u32 lookback, u32 t, u32 k) {
    u32 j = k / m.cols, c = k % m.cols;
    u32 row = (t + j + 1 >= lookback) ? (t + j + 1 - lookback) : 0;
    return m.features[(size_t)row * m.cols + c];
}

// Observations of bars t0, t0 + 1, ..., t0 + rows - 1 (rows <= R) in one state (position,
// entry), as foxhunt-env's observe: the look-back rows' features, then position / max_position
// and the unrealized PnL in ticks / upnl_scale; row r at out + r * stride. Written by `lanes`
// threads together (lane in [0, lanes), lanes >= rows); every row's loads of a pass are issued
// before any is stored, so R rows wait one trip to memory where row after row would wait R.
template <int R>
__device__ __forceinline__ void observe_rows(const Market& m, u32 lookback, int max_position,
                                             float upnl_scale, double tick_size, u32 t0, u32 rows,
                                             int position, double entry, float* out, u32 stride,
                                             u32 lane, u32 lanes) {
    const u32 n = lookback * m.cols;
    for (u32 k = lane; k < n; k += lanes) {
        float v[R];
#pragma unroll
        for (int r = 0; r < R; ++r)
            if ((u32)r < rows) v[r] = lookback_feature(m, lookback, t0 + r, k);
#pragma unroll
        for (int r = 0; r < R; ++r)
            if ((u32)r < rows) out[(u64)r * stride + k] = v[r];
    }
    if (lane < rows)
        observe_state(m, max_position, upnl_scale, tick_size, t0 + lane, position, entry,
                      out + (u64)lane * stride + n);
}

// Observation of bar t in state (position, entry): observe_rows' one row. One thread passes 0, 1.
__device__ void observe(const Market& m, u32 lookback, int max_position, float upnl_scale, double tick_size,
                        u32 t, int position, double entry, float* out, u32 lane, u32 lanes) {
    observe_rows<1>(m, lookback, max_position, upnl_scale, tick_size, t, 1, position, entry, out,
                    0, lane, lanes);
}

// Contract terms and costs (foxhunt-env's Execution, less the tick size observe takes apart).
struct Exec {
    double multiplier;
    double cost_per_side;
    double slippage_price;
};

// The outcome of one decision (foxhunt-env's Transition).
struct Trans {
    u32 next_t;
    int position;
    double hold_pnl;
    double bar_pnl;
    double cost;
    u32 traded;
    bool terminal;
    bool has_fill;
    double fill;
};

// exec::transition: at the close of bar t the trader holds `position` and asks for `target`.
__device__ __forceinline__ Trans transition(const Market& m, const Exec& x, u32 t, u32 split_end,
                                            int flatten_at_close, int position, int target) {
    Trans tr;
    bool last = (t + 1 >= split_end) || (flatten_at_close && m.session[t + 1] != m.session[t]);
    tr.hold_pnl = 0.0; tr.bar_pnl = 0.0; tr.has_fill = false; tr.fill = 0.0;
    if (last) {
        u32 traded = (u32)abs(position);
        tr.next_t = t; tr.position = 0; tr.cost = (double)traded * x.cost_per_side; tr.traded = traded;
        tr.terminal = true;
    } else {
        double o = m.open[t + 1], ct = m.close[t], cn = m.close[t + 1];
        u32 traded = (u32)abs(target - position);
        if (m.contract[t + 1] != m.contract[t] && isign(position) * isign(target) > 0) {
            u32 ap = (u32)abs(position), at = (u32)abs(target);
            traded += 2u * (ap < at ? ap : at);
        }
        if (target != position) { tr.has_fill = true; tr.fill = o + x.slippage_price * (double)isign(target - position); }
        tr.next_t = t + 1; tr.position = target;
        tr.hold_pnl = (double)position * (o - ct) * x.multiplier;
        tr.bar_pnl = (double)target * (cn - o) * x.multiplier;
        tr.cost = (double)traded * x.cost_per_side;
        tr.traded = traded;
        tr.terminal = false;
    }
    return tr;
}

// exec::next_entry: the average entry price after a step.
__device__ __forceinline__ double next_entry(double entry, int position, const Trans& tr) {
    int new_pos = tr.position;
    if (new_pos == 0) return 0.0;
    if (!tr.has_fill) return entry;
    if (position == 0 || isign(position) != isign(new_pos)) return tr.fill;
    if (abs(new_pos) > abs(position))
        return (entry * (double)abs(position) + tr.fill * (double)(abs(new_pos) - abs(position))) / (double)abs(new_pos);
    return entry;
}
