// Gated DeltaNet: gates and the delta-rule recurrence over chains (prefill,
// decode, replay) and trees (verify, one state per node).
#include "common.cuh"

// gdn_gates: gdn_gate per (row, head).
template <typename W>
INLINE void gdn_gates(float *a, float *b, const W *a_log, const W *dt_bias, int T, int heads) {
  GRID_LOOP(i, (i64)T * heads) gdn_gate(a + i, b + i, a_log, dt_bias, (int)(i % heads));
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

// Mirror of the Go gdnSeqs (gdn.go): the sequences of a gdn_recurrence
// launch, each its rows start..start+rows-1 of the operands, its states and
// tree parents.
#define MAX_GDN_SEQS 16
struct GDNSeq {
  const void *state;
  void *state_out, *node_states;
  const int *parents;
  const int *rows_at; // when set, the rows are read there at run time (a recorded commit)
  const int *slot_at; // when set, state (and state_out when out_slotted) are arrays of slots states: slot_state
  int start, rows, slots, out_slotted;
};
struct GDNSeqs {
  GDNSeq s[MAX_GDN_SEQS];
  int count;
};

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
// blockIdx.z is the sequence.
KERNEL gdn_recurrence(float *out, const float *q, const float *k, const float *v, const float *g, const float *beta,
                      GDNSeqs seqs, int state_bf16, int key_heads, int value_heads, int kd, int vd) {
  DYNAMIC_SHARED(float, smem);
  const GDNSeq &sq = seqs.s[blockIdx.z];
  i64 state_bytes = (i64)value_heads * kd * vd * (state_bf16 ? 2 : 4);
  const void *state = slot_state(sq.state, sq.slot_at, sq.slots, state_bytes);
  void *state_out = slot_state(sq.state_out, sq.out_slotted ? sq.slot_at : nullptr, sq.slots, state_bytes);
  void *node_states = sq.node_states;
  const int *parents = sq.parents;
  int T = sq.rows_at ? *sq.rows_at : sq.rows;
  i64 s0 = sq.start;
  q += s0 * key_heads * kd, k += s0 * key_heads * kd, v += s0 * value_heads * vd;
  g += s0 * value_heads, beta += s0 * value_heads;
  if (out) out += s0 * value_heads * vd;
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

// Chunked prefill (gdn_chunk_prep, then gdn_chunk_scan) computes what a
// chain gdn_recurrence without node states computes, GDN_CHUNK tokens at
// a time in the WY form of flash-linear-attention's chunk kernels (and of
// HF's torch_chunk_gated_delta_rule, kernels/cpu/gdn_chunked.go): inside a
// chunk the delta rule becomes a triangular solve, and the state is read
// and updated once per chunk. The solve and every product that does not
// involve the state run for all chunks in parallel (gdn_chunk_prep); only
// the state's pass over the chunks is sequential (gdn_chunk_scan). Their
// scratch holds, per token t and value head h, at (t·value_heads + h)·dim:
//   gcs  [1]        the cumulative log-decay inside t's chunk, gc_t
//   wks  [kd]       wk_t = Σ_{a<=t} (I+A)⁻¹[t][a]·beta_a·exp(gc_a)·k_a
//   us   [vd]       u_t  = Σ_{a<=t} (I+A)⁻¹[t][a]·beta_a·v_a
//   qks  [CHUNK]    qk_t[a] = (q_t·k_a)·exp(gc_t−gc_a) for a <= t, else 0
// where A[t][a] = beta_t·(k_t·k_a)·exp(gc_t−gc_a) for a < t (a, t in one
// chunk, indices relative to it).
#define GDN_CHUNK 64
#define GDN_SLAB 32  // key dims per shared-memory slab of gdn_chunk_prep
#define GDN_SUB 16   // tokens per shared-memory stage of gdn_chunk_scan
#define GDN_PREP_THREADS 256

// gdn_chunk_prep: block (chunk, value head), GDN_PREP_THREADS threads.
// Rows of keys and queries are staged GDN_SLAB dims at a time with a row
// stride of GDN_SLAB + 1, so the 32 lanes reading dim d of 32 keys hit 32
// banks; the 64×64 products live in registers, 16 per thread.
KERNEL gdn_chunk_prep(float *gcs, float *wks, float *us, float *qks, const float *q, const float *k, const float *v,
                      const float *g, const float *beta, int T, int key_heads, int value_heads, int kd, int vd) {
  const int C = GDN_CHUNK, per_thread = C * C / GDN_PREP_THREADS;
  __shared__ float gc[C], bt[C], wexp[C];
  __shared__ float tri[C][C];  // -A, then (I+A)⁻¹ below the diagonal
  __shared__ float ks[C][GDN_SLAB + 1], qs[C][GDN_SLAB + 1];
  int s = blockIdx.x * C, h = blockIdx.y, kh = h / (value_heads / key_heads), tid = threadIdx.x;
  int n = T - s < C ? T - s : C;
  if (tid == 0) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
      i64 th = (i64)(s + i) * value_heads + h;
      acc += g[th];
      gc[i] = acc, bt[i] = beta[th], wexp[i] = beta[th] * expf_(acc);
      gcs[th] = acc;
    }
  }
  // Thread tid owns entries e = tid + r·GDN_PREP_THREADS: row e / C, column e % C.
  float kk[per_thread], qk[per_thread];
#pragma unroll
  for (int r = 0; r < per_thread; r++) kk[r] = qk[r] = 0.0f;
  for (int d0 = 0; d0 < kd; d0 += GDN_SLAB) {
    for (int e = tid; e < C * GDN_SLAB; e += GDN_PREP_THREADS) {
      int i = e / GDN_SLAB, d = e % GDN_SLAB;
      i64 src = ((i64)(s + i) * key_heads + kh) * kd + d0 + d;
      bool in = i < n && d0 + d < kd;
      ks[i][d] = in ? k[src] : 0.0f;
      qs[i][d] = in ? q[src] : 0.0f;
    }
    sync_threads();
#pragma unroll
    for (int r = 0; r < per_thread; r++) {
      int e = tid + r * GDN_PREP_THREADS, i = e / C, a = e % C;
      float kkv = kk[r], qkv = qk[r];
      for (int d = 0; d < GDN_SLAB; d++) {
        kkv = fmaf_(ks[i][d], ks[a][d], kkv);
        qkv = fmaf_(qs[i][d], ks[a][d], qkv);
      }
      kk[r] = kkv, qk[r] = qkv;
    }
    sync_threads();  // the next slab overwrites ks and qs
  }
#pragma unroll
  for (int r = 0; r < per_thread; r++) {
    int e = tid + r * GDN_PREP_THREADS, i = e / C, a = e % C;
    bool below = i < n && a < i, on = i < n && a <= i;
    float decay = on ? expf_(gc[i] - gc[a]) : 0.0f;
    tri[i][a] = below ? -bt[i] * kk[r] * decay : 0.0f;
    if (i < n) qks[((i64)(s + i) * value_heads + h) * C + a] = on ? qk[r] * decay : 0.0f;
  }
  sync_threads();
  // Forward substitution turns I + tri into (I + A)⁻¹, row by row; each
  // row reads its old values before any are replaced.
  for (int i = 1; i < n; i++) {
    float next = 0.0f;
    if (tid < i) {
      next = tri[i][tid];
      for (int m = tid + 1; m < i; m++) next = fmaf_(tri[i][m], tri[m][tid], next);
    }
    sync_threads();
    if (tid < i) tri[i][tid] = next;
    sync_threads();
  }
  // wk and u, 32 columns at a time: lane = column, warp w rows w, w+8, ...
  // The staged rows (keys, then values) reuse ks.
  int lane = tid & 31, warp = tid >> 5, warps = GDN_PREP_THREADS / 32;
  for (int pass = 0; pass < 2; pass++) {
    const float *src = pass == 0 ? k : v;
    float *dst = pass == 0 ? wks : us;
    const float *coef = pass == 0 ? wexp : bt;
    int dim = pass == 0 ? kd : vd, heads = pass == 0 ? key_heads : value_heads, sh = pass == 0 ? kh : h;
    for (int d0 = 0; d0 < dim; d0 += 32) {
      for (int e = tid; e < C * 32; e += GDN_PREP_THREADS) {
        int i = e / 32, d = e % 32;
        ks[i][d] = i < n && d0 + d < dim ? src[((i64)(s + i) * heads + sh) * dim + d0 + d] : 0.0f;
      }
      sync_threads();
      for (int i = warp; i < n; i += warps) {
        float acc = 0.0f;
        for (int a = 0; a <= i; a++) acc = fmaf_((a < i ? tri[i][a] : 1.0f) * coef[a], ks[a][lane], acc);
        if (d0 + lane < dim) dst[((i64)(s + i) * value_heads + h) * dim + d0 + lane] = acc;
      }
      sync_threads();
    }
  }
}

// gdn_chunk_scan runs the state over the chunks, one after the other, with
// gdn_recurrence's block and thread layout: block (value head, 32 state
// columns), thread (x, y) keeping column blockIdx.y*32+x of rows y*32 ..
// y*32+31 in registers. Per chunk, with S the state before it:
//   new values  un_t = u_t − wk_t·S
//   outputs     out_t = exp(gc_t)·q_t·S + Σ_a qk_t[a]·un_a
//   state       S = exp(gc_last)·S + Σ_a exp(gc_last−gc_a)·k_a ⊗ un_a
// Rows of wk, q and k go through shared memory GDN_SUB tokens at a time.
// Shared memory (dynamic, floats): rows [2][GDN_SUB][kd]; partial sums
// pw, pq [blockDim.y][GDN_SUB][32]; un [GDN_CHUNK][32]. A BF16 state is
// widened on load and rounded once, on store.
KERNEL gdn_chunk_scan(float *out, const float *q, const float *k, const float *gcs, const float *wks, const float *us,
                      const float *qks, const void *state, void *state_out, int state_bf16, int T, int key_heads,
                      int value_heads, int kd, int vd) {
  DYNAMIC_SHARED(float, smem);
  const int C = GDN_CHUNK, B = GDN_SUB;
  int groups = blockDim.y;
  float *wr = smem, *qr = wr + B * kd, *pw = qr + B * kd, *pq = pw + groups * B * 32, *un = pq + groups * B * 32;
  int h = blockIdx.x, kh = h / (value_heads / key_heads);
  int x = threadIdx.x, y = threadIdx.y, tid = y * 32 + x, threads = 32 * groups;
  int j = blockIdx.y * 32 + x, r0 = y * ROWS_PER_THREAD;
  bool col = j < vd;
  i64 head = (i64)h * kd * vd;
  float S[ROWS_PER_THREAD];
  load_state(S, state, state_bf16, head, r0, j, kd, vd, col);
  for (int s = 0; s < T; s += C) {
    int n = T - s < C ? T - s : C;
    for (int b = 0; b < n; b += B) {
      int m = n - b < B ? n - b : B;
      for (int e = tid; e < m * kd; e += threads) {
        int i = e / kd, d = e % kd;
        wr[e] = wks[((i64)(s + b + i) * value_heads + h) * kd + d];
        qr[e] = q[((i64)(s + b + i) * key_heads + kh) * kd + d];
      }
      sync_threads();
      // This thread's rows' share of wk_t·S and q_t·S.
      for (int i = 0; i < m; i++) {
        float w = 0.0f, qv = 0.0f;
#pragma unroll
        for (int e = 0; e < ROWS_PER_THREAD; e++)
          if (r0 + e < kd) {
            w = fmaf_(wr[i * kd + r0 + e], S[e], w);
            qv = fmaf_(qr[i * kd + r0 + e], S[e], qv);
          }
        pw[(y * B + i) * 32 + x] = w;
        pq[(y * B + i) * 32 + x] = qv;
      }
      sync_threads();
      // Token i's sums, by the thread of row group i % groups; q_t·S is
      // kept in pq's first group (no other thread reads token i's entries).
      for (int i = y; i < m; i += groups) {
        float w = 0.0f, qv = 0.0f;
        for (int yy = 0; yy < groups; yy++) w += pw[(yy * B + i) * 32 + x], qv += pq[(yy * B + i) * 32 + x];
        un[(b + i) * 32 + x] = col ? us[((i64)(s + b + i) * value_heads + h) * vd + j] - w : 0.0f;
        pq[i * 32 + x] = qv;
      }
      sync_threads();
      for (int i = y; i < m && out; i += groups) {
        i64 th = (i64)(s + b + i) * value_heads + h;
        float o = expf_(gcs[th]) * pq[i * 32 + x];
        for (int a = 0; a <= b + i; a++) o = fmaf_(qks[th * C + a], un[a * 32 + x], o);
        if (col) out[th * vd + j] = o;
      }
      sync_threads();  // the next stage overwrites the rows and pq
    }
    float last = gcs[(i64)(s + n - 1) * value_heads + h], keep = expf_(last);
#pragma unroll
    for (int e = 0; e < ROWS_PER_THREAD; e++) S[e] *= keep;
    for (int b = 0; b < n; b += B) {
      int m = n - b < B ? n - b : B;
      for (int e = tid; e < m * kd; e += threads) {
        int i = e / kd, d = e % kd;
        wr[e] = k[((i64)(s + b + i) * key_heads + kh) * kd + d];
      }
      sync_threads();
      for (int i = 0; i < m; i++) {
        float f = expf_(last - gcs[(i64)(s + b + i) * value_heads + h]) * un[(b + i) * 32 + x];
#pragma unroll
        for (int e = 0; e < ROWS_PER_THREAD; e++)
          if (r0 + e < kd) S[e] = fmaf_(wr[i * kd + r0 + e], f, S[e]);
      }
      sync_threads();  // the next stage or chunk overwrites the rows, and un
    }
  }
  store_state(S, state_out, state_bf16, head, r0, j, kd, vd, col);
}
