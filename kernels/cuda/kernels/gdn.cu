// Gated DeltaNet: gates and the delta-rule recurrence over chains (prefill,
// decode, replay) and trees (verify, one state per node).
#include "common.cuh"

// gdn_gates: a = -exp(a_log)·softplus(a + dt_bias) in double; b = sigmoid(b).
template <typename W>
INLINE void gdn_gates(float *a, float *b, const W *a_log, const W *dt_bias, int T, int heads) {
  GRID_LOOP(i, (i64)T * heads) {
    int h = (int)(i % heads);
    double x = (double)(a[i] + to_f32(dt_bias[h]));
    double sp = x > 20 ? x : log1p_(exp_(x));  // torch's softplus threshold
    a[i] = (float)(-exp_((double)to_f32(a_log[h])) * sp);
    b[i] = sigmoidf_(b[i]);
  }
}
WEIGHT_KERNELS(gdn_gates, (float *a, float *b, const void *a_log, const void *dt_bias, int T, int heads),
               (a, b, (const W *)a_log, (const W *)dt_bias, T, heads))

#define ROWS_PER_THREAD 32  // state rows one thread keeps in registers

// Recurrent states (state, state_out, node_states) are F32 or, when
// state_bf16 != 0, BF16: widened as they are loaded and rounded to nearest
// even when stored. load_state and store_state move one thread's column j
// of rows r0.. of the head whose state [kd, vd] starts at element head.
INLINE void load_state(float *S, const void *src, int state_bf16, i64 head, int r0, int j, int kd, int vd, bool col) {
#pragma unroll
  for (int e = 0; e < ROWS_PER_THREAD; e++) {
    i64 i = head + (i64)(r0 + e) * vd + j;
    bool in = col && r0 + e < kd;
    S[e] = !in ? 0.0f : state_bf16 ? to_f32(((const bf16 *)src)[i]) : ((const float *)src)[i];
  }
}
INLINE void store_state(const float *S, void *dst, int state_bf16, i64 head, int r0, int j, int kd, int vd, bool col) {
#pragma unroll
  for (int e = 0; e < ROWS_PER_THREAD; e++) {
    if (!col || r0 + e >= kd) continue;
    i64 i = head + (i64)(r0 + e) * vd + j;
    if (state_bf16)
      ((bf16 *)dst)[i].bits = to_bf16_rne(S[e]);
    else
      ((float *)dst)[i] = S[e];
  }
}

// gdn_recurrence runs one value head's state S [kd, vd] over T tokens.
// Block (value head, 32 state columns); thread (x, y) keeps column
// blockIdx.y*32+x of rows y*32 .. y*32+31 in registers. Per token:
//   S = exp(g)·S; S += k ⊗ beta·(v − Sᵀk); out = Sᵀq.
// Chain (parents null): S starts from state and ends in state_out; with
// node_states, S after token t is also stored there. Tree: token t starts
// from node_states[parents[t]] (or state when -1; a token whose parent is
// the token before keeps S in registers) and stores its S there. A BF16
// state is rounded after every token's output, in registers too, so that a
// chain or tree computes exactly what one launch per token does.
// A thread only ever touches its own state elements, so state_out may be
// state and the tree needs no synchronisation beyond the block.
// Shared memory (dynamic): q and k of two tokens [2][2*kd] (the next
// token's load overlaps this one's work), then partial sums [blockDim.y * 32].
KERNEL gdn_recurrence(float *out, const float *q, const float *k, const float *v, const float *g, const float *beta,
                      const void *state, void *state_out, void *node_states, int state_bf16, const int *parents,
                      int T, int key_heads, int value_heads, int kd, int vd) {
  DYNAMIC_SHARED(float, smem);
  float *part = smem + 4 * kd;
  int h = blockIdx.x, kh = h / (value_heads / key_heads);
  int x = threadIdx.x, y = threadIdx.y, tid = y * 32 + x, threads = 32 * blockDim.y;
  int j = blockIdx.y * 32 + x, r0 = y * ROWS_PER_THREAD;
  bool col = j < vd;
  i64 state_len = (i64)value_heads * kd * vd, head = (i64)h * kd * vd;
  // load_qk puts token t's q and k into buffer t % 2.
  auto load_qk = [&](int t) {
    const float *qt = q + ((i64)t * key_heads + kh) * kd, *kt = k + ((i64)t * key_heads + kh) * kd;
    float *buf = smem + (t & 1) * 2 * kd;
    for (int i = tid; i < kd; i += threads) buf[i] = qt[i], buf[kd + i] = kt[i];
  };
  float S[ROWS_PER_THREAD];
  if (!parents) load_state(S, state, state_bf16, head, r0, j, kd, vd, col);
  if (T > 0) load_qk(0);
  sync_threads();
  for (int t = 0; t < T; t++) {
    if (parents) {
      int p = parents[t];
      if (p < -1 || p >= t) trap();
      if (t == 0 || p != t - 1)
        load_state(S, p < 0 ? state : node_states, state_bf16, p < 0 ? head : p * state_len + head, r0, j, kd, vd, col);
    }
    if (t + 1 < T) load_qk(t + 1);  // the other buffer: last read by token t-1
    const float *q_s = smem + (t & 1) * 2 * kd, *k_s = q_s + kd;
    float decay = expf_(g[(i64)t * value_heads + h]), b = beta[(i64)t * value_heads + h];
    float u = 0.0f;
#pragma unroll
    for (int e = 0; e < ROWS_PER_THREAD; e++)
      if (r0 + e < kd) u = fmaf_(S[e], k_s[r0 + e], u);
    part[tid] = u;
    sync_threads();
    u = 0.0f;
    for (int yy = 0; yy < (int)blockDim.y; yy++) u += part[yy * 32 + x];
    float delta = col ? b * (v[((i64)t * value_heads + h) * vd + j] - decay * u) : 0.0f;
    float o = 0.0f;
#pragma unroll
    for (int e = 0; e < ROWS_PER_THREAD; e++)
      if (r0 + e < kd) {
        S[e] = fmaf_(k_s[r0 + e], delta, decay * S[e]);
        o = fmaf_(S[e], q_s[r0 + e], o);
      }
    sync_threads();  // every thread has read part
    part[tid] = o;
    sync_threads();
    if (out && y == 0 && col) {
      o = 0.0f;
      for (int yy = 0; yy < (int)blockDim.y; yy++) o += part[yy * 32 + x];
      out[((i64)t * value_heads + h) * vd + j] = o;
    }
    if (state_bf16) {
#pragma unroll
      for (int e = 0; e < ROWS_PER_THREAD; e++) S[e] = to_f32(bf16{to_bf16_rne(S[e])});
    }
    if (node_states) store_state(S, node_states, state_bf16, t * state_len + head, r0, j, kd, vd, col);
    sync_threads();  // part is rewritten, and token t+1's q and k are in place
  }
  if (!parents) store_state(S, state_out, state_bf16, head, r0, j, kd, vd, col);
}

#define GDN_CHUNK 16  // tokens per chunk of gdn_chunked

// gdn_chunked computes what a chain gdn_recurrence without node states
// computes, GDN_CHUNK tokens at a time in the WY form (HF's
// torch_chunk_gated_delta_rule, kernels/cpu/gdn_chunked.go): inside a chunk
// the delta rule becomes a triangular solve, and the state is read and
// updated once per chunk. Same block and thread layout as gdn_recurrence:
// columns are independent, so each block redoes the chunk's small
// matrices for its 32 columns. Shared memory (dynamic, floats):
//   qc, kc, wk [GDN_CHUNK][kd]; tri, qk [GDN_CHUNK][GDN_CHUNK];
//   gc, bt [GDN_CHUNK]; u [GDN_CHUNK][32]; pw, pq [blockDim.y][GDN_CHUNK][32].
// A BF16 state is widened on load and rounded once, on store.
KERNEL gdn_chunked(float *out, const float *q, const float *k, const float *v, const float *g, const float *beta,
                   const void *state, void *state_out, int state_bf16, int T, int key_heads, int value_heads, int kd,
                   int vd) {
  DYNAMIC_SHARED(float, smem);
  const int C = GDN_CHUNK;
  int groups = blockDim.y;
  float *qc = smem, *kc = qc + C * kd, *wk = kc + C * kd, *tri = wk + C * kd, *qk = tri + C * C;
  float *gc = qk + C * C, *bt = gc + C, *u = bt + C, *pw = u + C * 32, *pq = pw + groups * C * 32;
  int h = blockIdx.x, kh = h / (value_heads / key_heads);
  int x = threadIdx.x, y = threadIdx.y, tid = y * 32 + x, threads = 32 * groups;
  int j = blockIdx.y * 32 + x, r0 = y * ROWS_PER_THREAD;
  bool col = j < vd;
  i64 head = (i64)h * kd * vd;
  float S[ROWS_PER_THREAD];
  load_state(S, state, state_bf16, head, r0, j, kd, vd, col);
  for (int s = 0; s < T; s += C) {
    int n = T - s < C ? T - s : C;
    // The chunk's q, k, cumulative log-decay and beta.
    for (int e = tid; e < n * kd; e += threads) {
      int i = e / kd, d = e % kd;
      i64 src = ((i64)(s + i) * key_heads + kh) * kd + d;
      qc[e] = q[src], kc[e] = k[src];
    }
    if (tid == 0) {
      float acc = 0.0f;
      for (int i = 0; i < n; i++) {
        acc += g[(i64)(s + i) * value_heads + h];
        gc[i] = acc;
        bt[i] = beta[(i64)(s + i) * value_heads + h];
      }
    }
    sync_threads();
    // tri = -A with A[i][a] = beta_i·(k_i·k_a)·exp(gc_i-gc_a) for a < i, and
    // qk[i][a] = (q_i·k_a)·exp(gc_i-gc_a) for a <= i.
    for (int e = tid; e < n * n; e += threads) {
      int i = e / n, a = e % n;
      if (a > i) continue;
      float kk = 0.0f, qkv = 0.0f;
      for (int d = 0; d < kd; d++) {
        kk = fmaf_(kc[i * kd + d], kc[a * kd + d], kk);
        qkv = fmaf_(qc[i * kd + d], kc[a * kd + d], qkv);
      }
      float decay = expf_(gc[i] - gc[a]);
      tri[i * C + a] = a < i ? -bt[i] * kk * decay : 0.0f;
      qk[i * C + a] = qkv * decay;
    }
    sync_threads();
    // Forward substitution turns I + tri into (I + A)^-1, row by row; each
    // row reads its old values before any are replaced.
    for (int i = 1; i < n; i++) {
      float next = 0.0f;
      if (tid < i) {
        next = tri[i * C + tid];
        for (int m = tid + 1; m < i; m++) next = fmaf_(tri[i * C + m], tri[m * C + tid], next);
      }
      sync_threads();
      if (tid < i) tri[i * C + tid] = next;
      sync_threads();
    }
    // wk = (I+tri)·(beta·k·exp(gc)).
    for (int e = tid; e < n * kd; e += threads) {
      int i = e / kd, d = e % kd;
      float acc = 0.0f;
      for (int a = 0; a <= i; a++) {
        float coef = a < i ? tri[i * C + a] : 1.0f;
        acc = fmaf_(coef * bt[a] * expf_(gc[a]), kc[a * kd + d], acc);
      }
      wk[e] = acc;
    }
    sync_threads();
    // This thread's rows' share of wk·S and q·S, for every token of the chunk.
    for (int i = 0; i < n; i++) {
      float w = 0.0f, qs = 0.0f;
#pragma unroll
      for (int e = 0; e < ROWS_PER_THREAD; e++)
        if (r0 + e < kd) {
          w = fmaf_(wk[i * kd + r0 + e], S[e], w);
          qs = fmaf_(qc[i * kd + r0 + e], S[e], qs);
        }
      pw[(y * C + i) * 32 + x] = w;
      pq[(y * C + i) * 32 + x] = qs;
    }
    sync_threads();
    // The new values u = (I+tri)·(beta·v) − wk·S and the outputs
    // out_i = exp(gc_i)·q_i·S + Σ_{a<=i} qk[i][a]·u_a, one column per thread.
    if (y == 0) {
      for (int i = 0; i < n; i++) {
        float acc = 0.0f;
        for (int a = 0; a <= i && col; a++) {
          float coef = a < i ? tri[i * C + a] : 1.0f;
          acc = fmaf_(coef * bt[a], v[((i64)(s + a) * value_heads + h) * vd + j], acc);
        }
        float qs = 0.0f;
        for (int yy = 0; yy < groups; yy++) acc -= pw[(yy * C + i) * 32 + x], qs += pq[(yy * C + i) * 32 + x];
        u[i * 32 + x] = acc;
        float o = expf_(gc[i]) * qs;
        for (int a = 0; a <= i; a++) o = fmaf_(qk[i * C + a], u[a * 32 + x], o);
        if (out && col) out[((i64)(s + i) * value_heads + h) * vd + j] = o;
      }
    }
    sync_threads();
    // S = exp(gc_last)·S + Σ_a exp(gc_last-gc_a)·k_a ⊗ u_a.
    float last = gc[n - 1], keep = expf_(last);
#pragma unroll
    for (int e = 0; e < ROWS_PER_THREAD; e++) S[e] *= keep;
    for (int a = 0; a < n; a++) {
      float f = expf_(last - gc[a]) * u[a * 32 + x];
#pragma unroll
      for (int e = 0; e < ROWS_PER_THREAD; e++)
        if (r0 + e < kd) S[e] = fmaf_(kc[a * kd + r0 + e], f, S[e]);
    }
    sync_threads();  // the next chunk overwrites the shared matrices
  }
  store_state(S, state_out, state_bf16, head, r0, j, kd, vd, col);
}
