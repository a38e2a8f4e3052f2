// foxhunt device replay: uniform sampling of n-step transitions from the ring that env_step_record
// writes, observations rebuilt from (bar, position, entry) over the resident market data
// (replay by index). Needs philox.cuh and env.cuh's observe() in the same module.

// A load of ring data: plain, or through L2 only (`cg`) where other blocks of the same launch
// wrote it (the first-level cache is not kept coherent between blocks).
template <bool CG, typename T> __device__ __forceinline__ T ring_ld(const T* p) {
    if (CG) return __ldcg(p);
    return *p;
}

// A sampled transition's reference: the ring slots of its first and next states (bar, position,
// entry), whose observations the caller writes (observe), one thread or a block's lanes at a
// time. `ok` is false when the ring holds no complete n-step start yet.
struct Drawn {
    bool ok;
    u32 t0, t1;
    int p0, p1;
    double e0, e1;
};

// Sampled transition b of draw `draw`: writes its action, n-step return, discount and weight and
// returns where its observations come from. Rows are whole steps of all n_env environments; row r
// lives at ring slot (r % cap_rows) * n_env + env. A start row needs its next `nstep` rows
// written.
template <bool CG>
__device__ __forceinline__ Drawn sample_draw(
    const u32* r_t, const int* r_pos, const double* r_entry, const unsigned char* r_action, const float* r_reward,
    const unsigned char* r_done, u32 n_env, u64 cap_rows, u64 written_rows,
    u32 nstep, float gamma, u64 seed, u64 draw,
    int* actions, float* returns, float* discounts, float* weights, u32 b) {
    Drawn out = {false, 0, 0, 0, 0, 0.0, 0.0};
    u64 oldest = written_rows > cap_rows ? written_rows - cap_rows : 0;
    u64 span = written_rows - oldest;
    if (span <= (u64)nstep) { weights[b] = 0.0f; discounts[b] = 0.0f; returns[b] = 0.0f; actions[b] = 0; return out; }
    u64 starts = span - nstep;
    Philox4 r = philox4x32_10(b, (unsigned int)draw, (unsigned int)(draw >> 32), 0x5EED,
                              (unsigned int)seed, (unsigned int)(seed >> 32));
    u64 hi = ((u64)r.v[0] << 32) | r.v[1];
    u64 row = oldest + hi % starts;
    u32 env = r.v[2] % n_env;
    u64 s0 = (row % cap_rows) * n_env + env;
    float ret = 0.0f, disc = 1.0f, weight = 1.0f;
    u32 k = 0;
    for (; k < nstep; ++k) {
        u64 s = ((row + k) % cap_rows) * n_env + env;
        ret += disc * ring_ld<CG>(r_reward + s);
        disc *= gamma;
        unsigned char d = ring_ld<CG>(r_done + s);
        if (d == 1) { disc = 0.0f; k += 1; break; }      // terminal: nothing to bootstrap from
        if (d == 2) { weight = 0.0f; k += 1; break; }    // truncated: the next state is gone
    }
    // After a terminal or truncated step the stored next row is a new episode: its observation
    // is written but weighted out by disc = 0 or weight = 0.
    u64 sn = ((row + k) % cap_rows) * n_env + env;
    out.ok = true;
    out.t0 = ring_ld<CG>(r_t + s0);
    out.p0 = ring_ld<CG>(r_pos + s0);
    out.e0 = ring_ld<CG>(r_entry + s0);
    out.t1 = ring_ld<CG>(r_t + sn);
    out.p1 = ring_ld<CG>(r_pos + sn);
    out.e1 = ring_ld<CG>(r_entry + sn);
    actions[b] = ring_ld<CG>(r_action + s0);
    returns[b] = ret;
    discounts[b] = disc;
    weights[b] = weight;
    return out;
}

// One thread per sampled transition (sample_draw's), observations written by that thread.
extern "C" __global__ void replay_sample(
    const float* features, const double* close, u32 cols, u32 lookback, int max_position, float upnl_scale,
    double tick_size,
    const u32* r_t, const int* r_pos, const double* r_entry, const unsigned char* r_action, const float* r_reward,
    const unsigned char* r_done, u32 n_env, u64 cap_rows, u64 written_rows,
    u32 nstep, float gamma, u64 seed, u64 draw,
    float* obs, int* actions, float* returns, float* next_obs, float* discounts, float* weights, u32 batch) {
    u32 b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    Drawn d = sample_draw<false>(r_t, r_pos, r_entry, r_action, r_reward, r_done, n_env, cap_rows, written_rows,
                                 nstep, gamma, seed, draw, actions, returns, discounts, weights, b);
    if (!d.ok) return;
    Market m = {features, 0, close, 0, 0, cols};
    u32 dim = lookback * cols + 2;
    observe(m, lookback, max_position, upnl_scale, tick_size, d.t0, d.p0, d.e0, obs + (size_t)b * dim, 0, 1);
    observe(m, lookback, max_position, upnl_scale, tick_size, d.t1, d.p1, d.e1, next_obs + (size_t)b * dim, 0, 1);
}
