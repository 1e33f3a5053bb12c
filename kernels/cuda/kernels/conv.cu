// Depthwise causal conv over chains or trees of rows, and the state commit.
// The conv state is F32 or BF16 (state_bf16 != 0): read widened, written
// rounded to nearest even.
#include "common.cuh"

#define MAX_CONV_K 16

// parent_of is row t's chain or tree parent; -1 is the committed state. A
// parent that is not an earlier row traps (the CPU backend panics).
INLINE int parent_of(const int *parents, int t) {
  if (!parents) return t - 1;
  int p = parents[t];
  if (p < -1 || p >= t) trap();
  return p;
}

// state_at is element i of an F32 or BF16 conv state.
INLINE float state_at(const void *state, int state_bf16, i64 i) {
  return state_bf16 ? to_f32(((const bf16 *)state)[i]) : ((const float *)state)[i];
}

// conv_window fills in[0..K) with channel c's inputs for row t, oldest
// first: the K-1 ancestors of t continued into the state, then t itself.
// Ancestors are read as the state holds them once committed (rounded for a
// BF16 state), so a row in a block sees what it sees decoded alone.
INLINE void conv_window(float *in, const float *x, const void *state, int state_bf16, const int *parents, int t,
                        int c, int channels, int K) {
  in[K - 1] = x[(i64)t * channels + c];
  int node = parent_of(parents, t), state_row = K - 2;
  for (int j = K - 2; j >= 0; j--) {
    if (node >= 0) {
      float v = x[(i64)node * channels + c];
      in[j] = state_bf16 ? to_f32(bf16{to_bf16_rne(v)}) : v;
      node = parent_of(parents, node);
    } else {
      in[j] = state_at(state, state_bf16, (i64)state_row-- * channels + c);
    }
  }
}

// conv_at is the conv's output for row t and channel c: silu(Σ_j w[c,j]·in_j).
template <typename W>
INLINE float conv_at(const float *x, const void *state, int state_bf16, const W *w, const int *parents, int t, int c,
                     int channels, int K) {
  float in[MAX_CONV_K];
  conv_window(in, x, state, state_bf16, parents, t, c, channels, K);
  float sum = 0.0f;
  for (int j = 0; j < K; j++) sum += to_f32(w[(i64)c * K + j]) * in[j];
  return siluf_(sum);
}

// causal_conv: conv_at for every (t, c), one thread each.
template <typename W>
INLINE void causal_conv(float *out, const float *x, const void *state, int state_bf16, const W *w,
                        const int *parents, int T, int channels, int K) {
  GRID_LOOP(e, (i64)T * channels) {
    out[e] = conv_at(x, state, state_bf16, w, parents, (int)(e / channels), (int)(e % channels), channels, K);
  }
}
WEIGHT_KERNELS(causal_conv,
               (float *out, const float *x, const void *state, int state_bf16, const void *w, const int *parents,
                int T, int channels, int K),
               (out, x, state, state_bf16, (const W *)w, parents, T, channels, K))

// commit_channel sets channel c of the state to node's window minus its
// oldest input, reading all it needs before it writes.
INLINE void commit_channel(void *state, int state_bf16, const float *x, const int *parents, int node, int c, int channels,
                           int K) {
  float in[MAX_CONV_K];
  conv_window(in, x, state, state_bf16, parents, node, c, channels, K);
  for (int r = 0; r < K - 1; r++) {
    i64 i = (i64)r * channels + c;
    if (state_bf16)
      ((bf16 *)state)[i].bits = to_bf16_rne(in[r + 1]);
    else
      ((float *)state)[i] = in[r + 1];
  }
}

// conv_commit: commit_channel, one thread per channel. With node_at the
// node is read there at run time, with slot_at the state is the one it
// names of slots (slot_state): a recorded commit serves any node and slot.
KERNEL conv_commit(void *state, int state_bf16, const float *x, const int *parents, const int *node_at,
                   const int *slot_at, int node, int slots, int channels, int K) {
  if (node_at) node = *node_at;
  void *st = slot_state(state, slot_at, slots, (i64)(K - 1) * channels * (state_bf16 ? 2 : 4));
  GRID_LOOP(c, channels) commit_channel(st, state_bf16, x, parents, node, (int)c, channels, K);
}

// Mirror of the Go gdnConvSeqs (conv.go): the sequences of a
// gdn_conv_inputs launch, each rows rows from row0 with its conv state
// (F32 or BF16; with slot_at, the slot it names of slots states:
// slot_state), its tree parents (null for a chain) and whether its last
// row's window is committed.
#define MAX_CONV_SEQS 32
struct ConvSeq {
  void *state;
  const int *parents, *slot_at;
  int row0, rows, commit, state_bf16, slots;
};
struct ConvSeqs {
  ConvSeq s[MAX_CONV_SEQS];
  int count;
};

// gdn_conv_inputs prepares a GDN layer's recurrence inputs (GDNConvInputs):
// block (part, sequence) over the key heads of q, those of k, then the value
// heads. Each thread convolves its channels of the part row by row as
// causal_conv does; a q or k block then scales the row's head as l2norm
// does (its block size), a value block writes v and its head's gates as
// gdn_gates does. The block's threads then commit their channels as
// conv_commit does: each reads only the state of its own channels, which no
// other thread writes.
template <typename W>
INLINE void gdn_conv_inputs(float *q, float *k, float *v, float *a, float *b, const float *x, const W *conv_w,
                            const W *a_log, const W *dt_bias, const ConvSeqs &seqs, int key_heads, int key_dim,
                            int value_heads, int value_dim, int K, float eps, float q_scale) {
  const ConvSeq &sq = seqs.s[blockIdx.y];
  int part = blockIdx.x, qk = key_heads * key_dim, channels = 2 * qk + value_heads * value_dim;
  void *state = slot_state(sq.state, sq.slot_at, sq.slots, (i64)(K - 1) * channels * (sq.state_bf16 ? 2 : 4));
  bool key = part < 2 * key_heads;
  int h = key ? part % key_heads : part - 2 * key_heads, dim = key ? key_dim : value_dim;
  int c0 = key ? part * key_dim : 2 * qk + h * value_dim, stride = key ? qk : value_heads * value_dim;
  float *out = (key ? (part < key_heads ? q : k) : v) + h * dim;
  float scale = part < key_heads ? q_scale : 1.0f;
  const float *xs = x + (i64)sq.row0 * channels;
  for (int t = 0; t < sq.rows; t++) {
    i64 r = sq.row0 + t;
    float *o = out + r * stride;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
      o[i] = conv_at(xs, state, sq.state_bf16, conv_w, sq.parents, t, c0 + i, channels, K);
    if (key) {
      float f = inv_rms(o, dim, eps, false) * scale;
      for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] *= f;
    } else if (threadIdx.x == 0) {
      gdn_gate(a + r * value_heads + h, b + r * value_heads + h, a_log, dt_bias, h);
    }
  }
  if (sq.commit)
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
      commit_channel(state, sq.state_bf16, xs, sq.parents, sq.rows - 1, c0 + i, channels, K);
}
WEIGHT_KERNELS(gdn_conv_inputs,
               (float *q, float *k, float *v, float *a, float *b, const float *x, const void *conv_w,
                const void *a_log, const void *dt_bias, ConvSeqs seqs, int key_heads, int key_dim, int value_heads,
                int value_dim, int K, float eps, float q_scale),
               (q, k, v, a, b, x, (const W *)conv_w, (const W *)a_log, (const W *)dt_bias, seqs, key_heads, key_dim,
                value_heads, value_dim, K, eps, q_scale))
