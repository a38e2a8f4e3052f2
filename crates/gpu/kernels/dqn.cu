// foxhunt fused DQN engine: the Q-network's forward and backward passes, the TD loss, gradient
// clipping, Adam and the target update as plain CUDA kernels over one flat parameter vector, so
// that a training step never leaves the device; the per-row and per-parameter rules are
// dqn.cuh's. Sums run in a fixed order, so a step is deterministic.
//
// Layouts: matrices are row-major; a dense layer's weight is [d_in, d_out] (burn's layout), so
// y[r, c] = sum_k x[r, k] * w[k * d_out + c] + b[c].

// y = x w + b, [rows, d_out]; one thread per output element (threads of a warp share a row, so
// their weight reads are contiguous).
extern "C" __global__ void dense_fwd(const float* x, const float* p, u64 w_off, u64 b_off, float* y,
                                     u32 rows, u32 d_in, u32 d_out) {
    const float* w = p + w_off;
    const float* b = p + b_off;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)rows * d_out) return;
    u32 r = (u32)(i / d_out), c = (u32)(i % d_out);
    const float* xr = x + (u64)r * d_in;
    float acc = 0.0f;
    for (u32 k = 0; k < d_in; ++k) acc += xr[k] * w[(u64)k * d_out + c];
    y[i] = acc + b[c];
}

// After a hidden dense layer: optional layer norm (population variance, eps 1e-5, as burn),
// then the activation. One thread per row. Keeps what the backward pass needs: h (the
// activation's input), xhat and 1/sigma per row.
extern "C" __global__ void hidden_post_fwd(const float* z, const float* p, u64 g_off, u64 b_off,
                                           float* h, float* xhat, float* rstd, float* a, u32 rows,
                                           u32 width, int use_norm, int act) {
    const float* gamma = p + g_off;
    const float* beta = p + b_off;
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* zr = z + (u64)r * width;
    float* hr = h + (u64)r * width;
    float* ar = a + (u64)r * width;
    if (use_norm) {
        float* xr = xhat + (u64)r * width;
        float mean, inv;
        norm_stats(zr, width, &mean, &inv);
        rstd[r] = inv;
        for (u32 j = 0; j < width; ++j) {
            float xh = (zr[j] - mean) * inv;
            xr[j] = xh;
            hr[j] = xh * gamma[j] + beta[j];
        }
    } else {
        for (u32 j = 0; j < width; ++j) hr[j] = zr[j];
    }
    for (u32 j = 0; j < width; ++j) ar[j] = act_f(hr[j], act);
}

// Dueling head: q = v + adv - mean(adv), [rows, actions]; one thread per row.
extern "C" __global__ void dueling_fwd(const float* v, const float* adv, float* q, u32 rows,
                                       u32 actions) {
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* ar = adv + (u64)r * actions;
    float mean = 0.0f;
    for (u32 j = 0; j < actions; ++j) mean += ar[j];
    mean /= (float)actions;
    for (u32 j = 0; j < actions; ++j) q[(u64)r * actions + j] = v[r] + ar[j] - mean;
}

// Epsilon-greedy actions from q [rows, actions]: greedy is the first of equal maxima; with
// probability epsilon a uniform action instead. Philox keyed by the seed, counter (env, step).
extern "C" __global__ void select_actions(const float* q, u32 rows, u32 actions, float epsilon,
                                          u64 seed, u64 step, unsigned char* out) {
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    out[r] = (unsigned char)select_action(q + (u64)r * actions, actions, epsilon, seed, step, r);
}

// TD loss of a batch and its gradient with respect to q (td_row's), one thread per row:
// dq [rows, actions] and terms [rows, 3].
extern "C" __global__ void td_loss(const float* q, const int* act, const float* q_next_online,
                                   const float* q_next_target, const float* ret, const float* disc,
                                   const float* weight, u32 rows, u32 actions, int double_dqn,
                                   int loss_kind, float delta, float* dq, float* terms) {
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    u64 o = (u64)r * actions;
    td_row(q + o, act[r], q_next_online + o, q_next_target + o, ret[r], disc[r], weight[r], rows,
           actions, double_dqn, loss_kind, delta, dq + o, terms + 3 * (u64)r);
}

// The update's statistics from the per-row terms: (loss, mean q, mean |td|) into out[0..3].
// One block; each thread sums a fixed stride of rows, then a fixed tree: deterministic.
extern "C" __global__ void batch_stats(const float* terms, u32 rows, float* stats, u64 at) {
    float* out = stats + at;
    __shared__ float s[3][256];
    u32 t = threadIdx.x;
    float a = 0.0f, b = 0.0f, c = 0.0f;
    for (u32 r = t; r < rows; r += 256) { a += terms[3 * r]; b += terms[3 * r + 1]; c += terms[3 * r + 2]; }
    s[0][t] = a; s[1][t] = b; s[2][t] = c;
    __syncthreads();
    for (u32 k = 128; k > 0; k >>= 1) {
        if (t < k) { s[0][t] += s[0][t + k]; s[1][t] += s[1][t + k]; s[2][t] += s[2][t + k]; }
        __syncthreads();
    }
    if (t == 0) {
        out[0] = s[0][0] / (float)rows;
        out[1] = s[1][0] / (float)rows;
        out[2] = s[2][0] / (float)rows;
    }
}

// Dueling head backward: dv[r] = sum_j dq[r, j]; dadv[r, j] = dq[r, j] - mean_j dq[r, j].
extern "C" __global__ void dueling_bwd(const float* dq, float* dv, float* dadv, u32 rows,
                                       u32 actions) {
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* g = dq + (u64)r * actions;
    float sum = 0.0f;
    for (u32 j = 0; j < actions; ++j) sum += g[j];
    dv[r] = sum;
    float mean = sum / (float)actions;
    for (u32 j = 0; j < actions; ++j) dadv[(u64)r * actions + j] = g[j] - mean;
}

// Weight and bias gradients of a dense layer: dw[k, c] = sum_r x[r, k] dy[r, c],
// db[c] = sum_r dy[r, c]. One thread per (k, c), k = d_in standing for the bias.
extern "C" __global__ void dense_bwd_params(const float* x, const float* dy, float* grads, u64 w_off,
                                            u64 b_off, u32 rows, u32 d_in, u32 d_out) {
    float* dw = grads + w_off;
    float* db = grads + b_off;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)(d_in + 1) * d_out) return;
    u32 k = (u32)(i / d_out), c = (u32)(i % d_out);
    float acc = 0.0f;
    if (k < d_in) {
        for (u32 r = 0; r < rows; ++r) acc += x[(u64)r * d_in + k] * dy[(u64)r * d_out + c];
        dw[(u64)k * d_out + c] = acc;
    } else {
        for (u32 r = 0; r < rows; ++r) acc += dy[(u64)r * d_out + c];
        db[c] = acc;
    }
}

// Input gradient of a dense layer: dx[r, k] (+)= sum_c dy[r, c] w[k, c]. One thread per (r, k);
// accumulate adds to dx (the last hidden layer feeds both dueling heads).
extern "C" __global__ void dense_bwd_input(const float* dy, const float* p, u64 w_off, float* dx,
                                           u32 rows, u32 d_in, u32 d_out, int accumulate) {
    const float* w = p + w_off;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)rows * d_in) return;
    u32 r = (u32)(i / d_in), k = (u32)(i % d_in);
    const float* g = dy + (u64)r * d_out;
    const float* wk = w + (u64)k * d_out;
    float acc = 0.0f;
    for (u32 c = 0; c < d_out; ++c) acc += g[c] * wk[c];
    dx[i] = accumulate ? dx[i] + acc : acc;
}

// Backward through a hidden layer's activation and layer norm, one thread per row: from da
// (gradient at the activation's output) to dz (at the dense output). Keeps dh (gradient at the
// norm's output) for the norm's parameter gradients.
extern "C" __global__ void hidden_post_bwd(const float* da, const float* h, const float* xhat,
                                           const float* rstd, const float* p, u64 g_off, float* dh,
                                           float* dz, u32 rows, u32 width, int use_norm, int act) {
    const float* gamma = p + g_off;
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    u64 o = (u64)r * width;
    for (u32 j = 0; j < width; ++j) dh[o + j] = da[o + j] * act_d(h[o + j], act);
    if (!use_norm) {
        for (u32 j = 0; j < width; ++j) dz[o + j] = dh[o + j];
        return;
    }
    // dxhat = dh * gamma; dz = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
    float m1 = 0.0f, m2 = 0.0f;
    for (u32 j = 0; j < width; ++j) {
        float g = dh[o + j] * gamma[j];
        m1 += g;
        m2 += g * xhat[o + j];
    }
    m1 /= (float)width;
    m2 /= (float)width;
    float inv = rstd[r];
    for (u32 j = 0; j < width; ++j)
        dz[o + j] = inv * (dh[o + j] * gamma[j] - m1 - xhat[o + j] * m2);
}

// Layer norm parameter gradients: dgamma[j] = sum_r dh[r, j] xhat[r, j], dbeta[j] = sum_r dh.
extern "C" __global__ void norm_bwd_params(const float* dh, const float* xhat, float* grads,
                                           u64 g_off, u64 b_off, u32 rows, u32 width) {
    float* dgamma = grads + g_off;
    float* dbeta = grads + b_off;
    u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    float g = 0.0f, b = 0.0f;
    for (u32 r = 0; r < rows; ++r) {
        float d = dh[(u64)r * width + j];
        g += d * xhat[(u64)r * width + j];
        b += d;
    }
    dgamma[j] = g;
    dbeta[j] = b;
}

// The global gradient norm sqrt(sum g^2) into *norm and out[0]. One block, fixed order.
extern "C" __global__ void grad_norm(const float* g, u64 n, float* norm, float* stats, u64 at) {
    float* out = stats + at;
    __shared__ float s[1024];
    u32 t = threadIdx.x;
    float acc = 0.0f;
    for (u64 i = t; i < n; i += 1024) acc += g[i] * g[i];
    s[t] = acc;
    __syncthreads();
    for (u32 k = 512; k > 0; k >>= 1) {
        if (t < k) s[t] += s[t + k];
        __syncthreads();
    }
    if (t == 0) { float v = sqrtf(s[0]); *norm = v; out[0] = v; }
}

// adam_one over n parameters, one thread each.
extern "C" __global__ void adam_step(float* p, const float* g, float* m, float* v, u64 n,
                                     const float* norm, float clip, float lr, float b1, float b2,
                                     float eps_c2, float cf, float weight_decay) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    adam_one(p + i, g[i], m + i, v + i, *norm, clip, lr, b1, b2, eps_c2, cf, weight_decay);
}

// Soft target update of n parameters, one thread each.
extern "C" __global__ void polyak(const float* online, float* target, u64 n, float tau) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    target[i] = polyak_one(online[i], target[i], tau);
}
