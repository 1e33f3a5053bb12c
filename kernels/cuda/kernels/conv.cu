// Depthwise causal conv over chains or trees of rows, and the state commit.
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

// conv_window fills in[0..K) with channel c's inputs for row t, oldest
// first: the K-1 ancestors of t continued into the state, then t itself.
INLINE void conv_window(float *in, const float *x, const float *state, const int *parents, int t, int c,
                        int channels, int K) {
  in[K - 1] = x[(i64)t * channels + c];
  int node = parent_of(parents, t), state_row = K - 2;
  for (int j = K - 2; j >= 0; j--) {
    if (node >= 0) {
      in[j] = x[(i64)node * channels + c];
      node = parent_of(parents, node);
    } else {
      in[j] = state[(i64)state_row-- * channels + c];
    }
  }
}

// causal_conv: out[t,c] = silu(Σ_j w[c,j]·in_j), one thread per (t, c).
template <typename W>
INLINE void causal_conv(float *out, const float *x, const float *state, const W *w, const int *parents, int T,
                        int channels, int K) {
  GRID_LOOP(e, (i64)T * channels) {
    int t = (int)(e / channels), c = (int)(e % channels);
    float in[MAX_CONV_K];
    conv_window(in, x, state, parents, t, c, channels, K);
    float sum = 0.0f;
    for (int j = 0; j < K; j++) sum += to_f32(w[(i64)c * K + j]) * in[j];
    out[e] = siluf_(sum);
  }
}
WEIGHT_KERNELS(causal_conv,
               (float *out, const float *x, const float *state, const void *w, const int *parents, int T,
                int channels, int K),
               (out, x, state, (const W *)w, parents, T, channels, K))

// conv_commit sets the state to node's window minus its oldest input; one
// thread per channel reads all it needs before it writes.
KERNEL conv_commit(float *state, const float *x, const int *parents, int node, int channels, int K) {
  GRID_LOOP(c, channels) {
    float in[MAX_CONV_K];
    conv_window(in, x, state, parents, node, (int)c, channels, K);
    for (int r = 0; r < K - 1; r++) state[(i64)r * channels + c] = in[r + 1];
  }
}
