// Partial NeoX RoPE. Angles in double, as in the CPU reference, so that
// large positions stay exact.
#include "common.cuh"

// rope: one thread per (row, frequency i); it rotates the pair (i, i+half)
// of every head of the row. x is [rows, heads, head_dim].
KERNEL rope(float *x, const int *positions, const float *inv_freq, int rows, int heads, int head_dim, int half,
            float scale) {
  GRID_LOOP(t, (i64)rows * half) {
    i64 r = t / half;
    int i = (int)(t % half);
    double s, c;
    sincos_((double)positions[r] * (double)inv_freq[i], &s, &c);
    float cs = (float)c * scale, sn = (float)s * scale;
    for (int h = 0; h < heads; h++) {
      float *d = x + (r * heads + h) * head_dim;
      float x1 = d[i], x2 = d[i + half];
      d[i] = x1 * cs - x2 * sn;
      d[i + half] = x2 * cs + x1 * sn;
    }
  }
}
