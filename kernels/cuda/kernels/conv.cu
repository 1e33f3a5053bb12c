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

// causal_conv: out[t,c] = silu(Σ_j w[c,j]·in_j), one thread per (t, c).
template <typename W>
INLINE void causal_conv(float *out, const float *x, const void *state, int state_bf16, const W *w,
                        const int *parents, int T, int channels, int K) {
  GRID_LOOP(e, (i64)T * channels) {
    int t = (int)(e / channels), c = (int)(e % channels);
    float in[MAX_CONV_K];
    conv_window(in, x, state, state_bf16, parents, t, c, channels, K);
    float sum = 0.0f;
    for (int j = 0; j < K; j++) sum += to_f32(w[(i64)c * K + j]) * in[j];
    out[e] = siluf_(sum);
  }
}
WEIGHT_KERNELS(causal_conv,
               (float *out, const float *x, const void *state, int state_bf16, const void *w, const int *parents,
                int T, int channels, int K),
               (out, x, state, state_bf16, (const W *)w, parents, T, channels, K))

// conv_commit sets the state to node's window minus its oldest input; one
// thread per channel reads all it needs before it writes.
KERNEL conv_commit(void *state, int state_bf16, const float *x, const int *parents, int node, int channels, int K) {
  GRID_LOOP(c, channels) {
    float in[MAX_CONV_K];
    conv_window(in, x, state, state_bf16, parents, node, (int)c, channels, K);
    for (int r = 0; r < K - 1; r++) {
      i64 i = (i64)r * channels + c;
      if (state_bf16)
        ((bf16 *)state)[i].bits = to_bf16_rne(in[r + 1]);
      else
        ((float *)state)[i] = in[r + 1];
    }
  }
}
