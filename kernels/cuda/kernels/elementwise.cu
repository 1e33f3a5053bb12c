// Elementwise ops, copies and the embedding gather.
#include "common.cuh"

// copy_rows copies rows×cols elements of T with strides (Copy).
template <typename T>
INLINE void copy_rows(T *dst, const T *src, int rows, int cols, int dst_stride, int src_stride) {
  GRID_LOOP(i, (i64)rows * cols) {
    i64 r = i / cols, c = i % cols;
    dst[r * dst_stride + c] = src[r * src_stride + c];
  }
}
KERNEL copy_rows_b32(u32 *dst, const u32 *src, int rows, int cols, int ds, int ss) { copy_rows(dst, src, rows, cols, ds, ss); }
KERNEL copy_rows_b16(u16 *dst, const u16 *src, int rows, int cols, int ds, int ss) { copy_rows(dst, src, rows, cols, ds, ss); }

KERNEL fill_f32(float *dst, i64 n, float v) {
  GRID_LOOP(i, n) dst[i] = v;
}
KERNEL fill_bf16(u16 *dst, i64 n, float v) {
  u16 bits = to_bf16_rne(v);
  GRID_LOOP(i, n) dst[i] = bits;
}

// embedding gathers rows of a table of table_rows rows: out[i,:] = table[ids[i],:].
template <typename W>
INLINE void embedding(float *out, const W *table, const int *ids, int n, int dim, i64 table_rows) {
  GRID_LOOP(i, (i64)n * dim) {
    i64 r = i / dim, c = i % dim;
    int id = ids[r];
    if (id < 0 || id >= table_rows) trap();
    out[i] = to_f32(table[(i64)id * dim + c]);
  }
}
WEIGHT_KERNELS(embedding, (float *out, const void *table, const int *ids, int n, int dim, i64 table_rows),
               (out, (const W *)table, ids, n, dim, table_rows))

KERNEL add_f32(float *out, const float *a, const float *b, i64 n) {
  GRID_LOOP(i, n) out[i] = a[i] + b[i];
}

KERNEL swiglu(float *out, const float *gate, const float *up, i64 n) {
  GRID_LOOP(i, n) out[i] = siluf_(gate[i]) * up[i];
}

KERNEL mul_sigmoid(float *x, const float *gate, i64 n) {
  GRID_LOOP(i, n) x[i] *= sigmoidf_(gate[i]);
}

// grouped_conv is DFlash2's block-local convolution (GroupedConv): per row
// r and channel c, the sum over taps t <= r of (base[t,c] + the row's
// dynamic tap of c's group) times x[r-t,c].
KERNEL grouped_conv(float *out, const float *x, const float *base, const float *delta, int rows, int dim, int taps,
                    int group_size, int delta_stride) {
  int groups = dim / group_size;
  GRID_LOOP(i, (i64)rows * dim) {
    int r = (int)(i / dim), c = (int)(i % dim);
    float acc = 0.f;
    for (int t = 0; t < taps && t <= r; t++) {
      float w = base[(i64)t * dim + c] + delta[(i64)r * delta_stride + t * groups + c / group_size];
      acc += w * x[(i64)(r - t) * dim + c];
    }
    out[i] = acc;
  }
}
