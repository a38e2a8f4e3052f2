// foxhunt GPU environment kernels: one thread per environment, stepping as foxhunt-env's VecEnv
// does (the device functions are env.cuh's), writing the replay ring's row when asked.

extern "C" __global__ void env_reset(
    const float* features, const double* open, const double* close, const u32* session, const u32* contract, u32 cols,
    u32 split_start, u32 split_end, u32 lookback, int max_position, float upnl_scale, double tick_size, u64 seed,
    u32* t_arr, int* pos_arr, double* entry_arr, u32* steps_arr, u32* episode_arr, float* obs, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Market m = {features, open, close, session, contract, cols};
    u32 t = episode_start(seed, i, 0, split_start, split_end);
    t_arr[i] = t; pos_arr[i] = 0; entry_arr[i] = 0.0; steps_arr[i] = 0; episode_arr[i] = 0;
    observe(m, lookback, max_position, upnl_scale, tick_size, t, 0, 0.0, obs + (size_t)i * (lookback * cols + 2), 0, 1);
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
    const unsigned char* actions, float* obs, float* rewards, unsigned char* dones, u32 i, const Ring* ring,
    bool observe_next) {
    Market m = {features, open, close, session, contract, cols};
    u32 t = t_arr[i];
    int position = pos_arr[i];
    double entry = entry_arr[i];
    u32 a = actions[i];
    u32 amax = 2u * (u32)max_position;
    int target = (int)(a < amax ? a : amax) - max_position;

    Exec x = {multiplier, cost_per_side, slippage_price};
    Trans tr = transition(m, x, t, split_end, flatten_at_close, position, target);
    u32 next_t = tr.next_t;
    int new_pos = tr.position;
    bool terminal = tr.terminal;
    double pnl = tr.hold_pnl + tr.bar_pnl - tr.cost;
    double penalty = risk_penalty * (double)abs(new_pos);
    rewards[i] = (float)((pnl - penalty) / reward_scale);
    double new_entry = next_entry(entry, position, tr);

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
    // The one-launch epoch observes its block's environments afterwards, many threads to one
    // environment (observe_next false): one thread's loads of the look-back rows, one after
    // another, took about 3 of the 12 us its agent's acting took a step.
    if (observe_next)
        observe(m, lookback, max_position, upnl_scale, tick_size, next_t, new_pos, new_entry, obs + (size_t)i * (lookback * cols + 2), 0, 1);
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
    step_one(ENV_STEP_ARGS, i, 0, true);
}

// env_step that also writes the replay row of this step (ring rows hold n slots each).
extern "C" __global__ void env_step_record(ENV_STEP_PARAMS,
    u32* r_t, int* r_pos, double* r_entry, unsigned char* r_action, float* r_reward, unsigned char* r_done,
    u64 row_base) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Ring ring = {r_t, r_pos, r_entry, r_action, r_reward, r_done, row_base};
    step_one(ENV_STEP_ARGS, i, &ring, true);
}
