// foxhunt GPU environment: one thread per environment, the same arithmetic as foxhunt-env's
// exec::transition, next_entry, observe and episode_start (crates/env/src/{exec,vec_env}.rs).
// Compiled by NVRTC with --fmad=false: the CPU reference does not fuse multiply-adds, so
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

__device__ void observe(const Market& m, u32 lookback, int max_position, float upnl_scale, double tick_size,
                        u32 t, int position, double entry, float* out) {
    for (u32 k = 0; k < lookback; ++k) {
        u32 row = (t + k + 1 >= lookback) ? (t + k + 1 - lookback) : 0;
        const float* src = m.features + (size_t)row * m.cols;
        float* dst = out + (size_t)k * m.cols;
        for (u32 c = 0; c < m.cols; ++c) dst[c] = src[c];
    }
    u32 n = lookback * m.cols;
    out[n] = (float)position / (float)max_position;
    double upnl_ticks = position == 0 ? 0.0 : (m.close[t] - entry) * (double)position / tick_size;
    out[n + 1] = (float)upnl_ticks / upnl_scale;
}

extern "C" __global__ void env_reset(
    const float* features, const double* open, const double* close, const u32* session, const u32* contract, u32 cols,
    u32 split_start, u32 split_end, u32 lookback, int max_position, float upnl_scale, double tick_size, u64 seed,
    u32* t_arr, int* pos_arr, double* entry_arr, u32* steps_arr, u32* episode_arr, float* obs, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Market m = {features, open, close, session, contract, cols};
    u32 t = episode_start(seed, i, 0, split_start, split_end);
    t_arr[i] = t; pos_arr[i] = 0; entry_arr[i] = 0.0; steps_arr[i] = 0; episode_arr[i] = 0;
    observe(m, lookback, max_position, upnl_scale, tick_size, t, 0, 0.0, obs + (size_t)i * (lookback * cols + 2));
}

// One replay row per step: the state before the step (bar, position, entry), the action, the
// reward and the done code, at slot row_base + env. Replay by index: observations are rebuilt
// from (t, position, entry) and the resident market data when a batch is sampled.
struct Ring {
    u32* t; int* position; double* entry; unsigned char* action; float* reward; unsigned char* done;
    u64 row_base;
};

__device__ __forceinline__ void step_one(
    const float* features, const double* open, const double* close, const u32* session, const u32* contract, u32 cols,
    u32 split_start, u32 split_end, u32 lookback, int max_position, float upnl_scale, double tick_size, u64 seed,
    double multiplier, double cost_per_side, double slippage_price, u32 episode_steps, double reward_scale,
    double risk_penalty, int flatten_at_close,
    u32* t_arr, int* pos_arr, double* entry_arr, u32* steps_arr, u32* episode_arr,
    const unsigned char* actions, float* obs, float* rewards, unsigned char* dones, u32 i, const Ring* ring) {
    Market m = {features, open, close, session, contract, cols};
    u32 t = t_arr[i];
    int position = pos_arr[i];
    double entry = entry_arr[i];
    u32 a = actions[i];
    u32 amax = 2u * (u32)max_position;
    int target = (int)(a < amax ? a : amax) - max_position;

    // exec::transition
    bool last = (t + 1 >= split_end) || (flatten_at_close && session[t + 1] != session[t]);
    u32 next_t; int new_pos; double hold_pnl = 0.0, bar_pnl = 0.0, cost; bool terminal; bool has_fill = false; double fill = 0.0;
    if (last) {
        u32 traded = (u32)abs(position);
        next_t = t; new_pos = 0; cost = (double)traded * cost_per_side; terminal = true;
    } else {
        double o = open[t + 1], ct = close[t], cn = close[t + 1];
        u32 traded = (u32)abs(target - position);
        if (contract[t + 1] != contract[t] && isign(position) * isign(target) > 0) {
            u32 ap = (u32)abs(position), at = (u32)abs(target);
            traded += 2u * (ap < at ? ap : at);
        }
        if (target != position) { has_fill = true; fill = o + slippage_price * (double)isign(target - position); }
        next_t = t + 1; new_pos = target;
        hold_pnl = (double)position * (o - ct) * multiplier;
        bar_pnl = (double)target * (cn - o) * multiplier;
        cost = (double)traded * cost_per_side;
        terminal = false;
    }
    double pnl = hold_pnl + bar_pnl - cost;
    double penalty = risk_penalty * (double)abs(new_pos);
    rewards[i] = (float)((pnl - penalty) / reward_scale);

    // exec::next_entry
    double new_entry;
    if (new_pos == 0) new_entry = 0.0;
    else if (!has_fill) new_entry = entry;
    else if (position == 0 || isign(position) != isign(new_pos)) new_entry = fill;
    else if (abs(new_pos) > abs(position))
        new_entry = (entry * (double)abs(position) + fill * (double)(abs(new_pos) - abs(position))) / (double)abs(new_pos);
    else new_entry = entry;

    u32 steps = steps_arr[i] + 1;
    unsigned char code = terminal ? 1 : ((episode_steps > 0 && steps >= episode_steps) ? 2 : 0);
    u32 episode = episode_arr[i];
    if (code != 0) {
        episode += 1;
        next_t = episode_start(seed, i, episode, split_start, split_end);
        new_pos = 0; new_entry = 0.0; steps = 0;
    }
    if (ring) {
        u64 s = ring->row_base + i;
        ring->t[s] = t; ring->position[s] = position; ring->entry[s] = entry;
        ring->action[s] = (unsigned char)a; ring->reward[s] = rewards[i]; ring->done[s] = code;
    }
    t_arr[i] = next_t; pos_arr[i] = new_pos; entry_arr[i] = new_entry; steps_arr[i] = steps; episode_arr[i] = episode;
    dones[i] = code;
    observe(m, lookback, max_position, upnl_scale, tick_size, next_t, new_pos, new_entry, obs + (size_t)i * (lookback * cols + 2));
}

#define ENV_STEP_PARAMS \
    const float* features, const double* open, const double* close, const u32* session, const u32* contract, u32 cols, \
    u32 split_start, u32 split_end, u32 lookback, int max_position, float upnl_scale, double tick_size, u64 seed, \
    double multiplier, double cost_per_side, double slippage_price, u32 episode_steps, double reward_scale, \
    double risk_penalty, int flatten_at_close, \
    u32* t_arr, int* pos_arr, double* entry_arr, u32* steps_arr, u32* episode_arr, \
    const unsigned char* actions, float* obs, float* rewards, unsigned char* dones, u32 n
#define ENV_STEP_ARGS \
    features, open, close, session, contract, cols, split_start, split_end, lookback, max_position, upnl_scale, \
    tick_size, seed, multiplier, cost_per_side, slippage_price, episode_steps, reward_scale, risk_penalty, \
    flatten_at_close, t_arr, pos_arr, entry_arr, steps_arr, episode_arr, actions, obs, rewards, dones

extern "C" __global__ void env_step(ENV_STEP_PARAMS) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    step_one(ENV_STEP_ARGS, i, 0);
}

// env_step that also writes the replay row of this step (ring rows hold n slots each).
extern "C" __global__ void env_step_record(ENV_STEP_PARAMS,
    u32* r_t, int* r_pos, double* r_entry, unsigned char* r_action, float* r_reward, unsigned char* r_done,
    u64 row_base) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Ring ring = {r_t, r_pos, r_entry, r_action, r_reward, r_done, row_base};
    step_one(ENV_STEP_ARGS, i, &ring);
}
