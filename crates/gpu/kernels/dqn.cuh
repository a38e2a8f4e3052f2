// foxhunt's DQN learning rule as device functions, shared by the eager kernels (dqn.cu) and the
// one-launch epoch (epoch.cu): activations, a row's layer-norm statistics, the exploration
// choice, one row's TD loss, one parameter's Adam step. The arithmetic follows foxhunt-dqn's
// burn agent operation by operation (crates/dqn/src/agent.rs, burn's Adam). Needs philox.cuh in
// the same module.

typedef unsigned int u32;
typedef unsigned long long u64;

// Activations: 0 relu, 1 tanh, 2 gelu (exact, with erf, as burn's gelu).
__device__ __forceinline__ float act_f(float h, int act) {
    if (act == 0) return h > 0.0f ? h : 0.0f;
    if (act == 1) return tanhf(h);
    return 0.5f * h * (1.0f + erff(h * 0.70710678118654752f));
}

// d act(h) / dh.
__device__ __forceinline__ float act_d(float h, int act) {
    if (act == 0) return h > 0.0f ? 1.0f : 0.0f;
    if (act == 1) { float t = tanhf(h); return 1.0f - t * t; }
    float cdf = 0.5f * (1.0f + erff(h * 0.70710678118654752f));
    float pdf = 0.3989422804014327f * expf(-0.5f * h * h);
    return cdf + h * pdf;
}

// Layer norm's statistics of one row z[0..w): its mean and 1 / sigma (biased variance, eps
// 1e-5), each sum in order, as burn's layer norm.
__device__ __forceinline__ void norm_stats(const float* z, u32 w, float* mean, float* inv) {
    float m = 0.0f;
    for (u32 j = 0; j < w; ++j) m += z[j];
    m /= (float)w;
    *mean = m;
    float var = 0.0f;
    for (u32 j = 0; j < w; ++j) { float d = z[j] - m; var += d * d; }
    var /= (float)w;
    *inv = 1.0f / sqrtf(var + 1e-5f);
}

// Epsilon-greedy choice for environment `env` from its Q-values `qr` [actions]: greedy is the
// first of equal maxima; with probability epsilon a uniform action instead. Philox keyed by the
// seed, counter (env, step counter) -- foxhunt-dqn's explore.rs draws the same on the host.
__device__ __forceinline__ u32 select_action(const float* qr, u32 actions, float epsilon, u64 seed,
                                             u64 step, u32 env) {
    u32 best = 0;
    for (u32 j = 1; j < actions; ++j) if (qr[j] > qr[best]) best = j;
    if (epsilon > 0.0f) {
        Philox4 p = philox4x32_10(env, (u32)step, (u32)(step >> 32), 0xAC7u, (u32)seed,
                                  (u32)(seed >> 32));
        float u = (float)(p.v[0] >> 8) * (1.0f / 16777216.0f);
        if (u < epsilon) best = p.v[1] % actions;
    }
    return best;
}

// One row's TD loss and its gradient with respect to the row's Q-values `q` [actions]. The
// target: double DQN takes the online network's argmax at the next state and the target
// network's value of it; vanilla takes the target network's max; y = ret + disc * that.
// loss_kind 0 = Huber(delta), 1 = MSE; the batch's loss is mean(w * l(td)) over `rows` rows.
// Writes dq [actions] (zero but at the taken action) and terms = (w * l(td), q_taken, |td|).
__device__ __forceinline__ void td_row(const float* q, int action, const float* qn_o,
                                       const float* qn_t, float ret, float disc, float w, u32 rows,
                                       u32 actions, int double_dqn, int loss_kind, float delta,
                                       float* dq, float* terms) {
    float next;
    if (double_dqn) {
        u32 best = 0;
        for (u32 j = 1; j < actions; ++j) if (qn_o[j] > qn_o[best]) best = j;
        next = qn_t[best];
    } else {
        next = qn_t[0];
        for (u32 j = 1; j < actions; ++j) next = fmaxf(next, qn_t[j]);
    }
    float y = ret + disc * next;
    u32 a = (u32)action;
    float qa = q[a];
    float td = qa - y;
    float l, dl;
    if (loss_kind == 1) {
        l = td * td;
        dl = 2.0f * td;
    } else {
        float abs_td = fabsf(td);
        if (abs_td > delta) {
            l = (abs_td - 0.5f * delta) * delta;
            dl = td > 0.0f ? delta : -delta;
        } else {
            l = td * td * 0.5f;
            dl = td;
        }
    }
    for (u32 j = 0; j < actions; ++j) dq[j] = 0.0f;
    dq[a] = w * dl / (float)rows;
    terms[0] = l * w;
    terms[1] = qa;
    terms[2] = fabsf(td);
}

// One parameter's update: gradient clipping (scale min(1, max / (norm + 1e-6)) when clip > 0),
// L2 weight decay, burn's Adam: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (m * cf) / (sqrt(v) + eps * c2), with c2 = sqrt(1 - b2^t), cf = c2 / (1 - b1^t).
__device__ __forceinline__ void adam_one(float* p, float gi, float* m, float* v, float norm,
                                         float clip, float lr, float b1, float b2, float eps_c2,
                                         float cf, float weight_decay) {
    if (clip > 0.0f) {
        float scale = fminf(clip / (norm + 1e-6f), 1.0f);
        gi = gi * scale;
    }
    if (weight_decay > 0.0f) gi = *p * weight_decay + gi;
    float mi = *m * b1 + gi * (1.0f - b1);
    float vi = *v * b2 + gi * gi * (1.0f - b2);
    *m = mi;
    *v = vi;
    *p = *p - (mi * cf) / (sqrtf(vi) + eps_c2) * lr;
}

// Soft target update of one parameter: target = online * tau + target * (1 - tau).
__device__ __forceinline__ float polyak_one(float online, float target, float tau) {
    return online * tau + target * (1.0f - tau);
}
