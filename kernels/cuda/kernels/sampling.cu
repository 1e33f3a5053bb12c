// Log-softmax and top-k over logit rows: one block per row.
#include "common.cuh"

// log_softmax replaces row blockIdx.x of x [rows, n] by its log-probabilities.
KERNEL LAUNCH_BOUNDS(1024) log_softmax(float *x, int n) {
  __shared__ float max_scratch[32];
  __shared__ double sum_scratch[32];
  float *row = x + (i64)blockIdx.x * n;
  float top = -__builtin_inff();
  for (int i = threadIdx.x; i < n; i += blockDim.x) top = __builtin_fmaxf(top, row[i]);
  top = block_max(top, max_scratch);
  double sum = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum += expf_(row[i] - top);
  sum = block_sum_d(sum, sum_scratch);
  float shift = top + (float)log_(sum);
  for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] -= shift;
}

#define TOPK_LIST 16      // candidates one thread keeps between passes
#define TOPK_THREADS 256  // the block size topk assumes

// beats orders candidates by value, then by lower index (the CPU order).
INLINE bool beats(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

// topk_row finds the k best of row's n values in order and hands the
// o-th to emit(o, value, index) (on thread 0). Each thread keeps a sorted
// list of its best TOPK_LIST elements that come after the last one it gave
// up; k rounds of a block-wide argmax over the list heads pick the winners,
// and a thread whose list runs dry refills it from its elements.
template <typename Emit>
INLINE void topk_row(const float *row, int n, int k, Emit emit) {
  __shared__ float win_v[TOPK_THREADS / 32];
  __shared__ int win_i[TOPK_THREADS / 32];
  float list_v[TOPK_LIST];
  int list_i[TOPK_LIST];
  int count = 0, head = 0;
  bool more = true;                         // elements remain beyond the list
  float last_v = __builtin_inff();          // last element given up; +inf, -1 sorts before all
  int last_i = -1;
  const float none_v = -__builtin_inff();
  const int none_i = 0x7fffffff;
  for (int out = 0; out < k; out++) {
    if (head == count && more) {  // refill from the elements after (last_v, last_i)
      count = head = 0;
      int eligible = 0;
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = row[i];
        if (!beats(last_v, last_i, v, i)) continue;
        eligible++;
        if (count == TOPK_LIST && !beats(v, i, list_v[count - 1], list_i[count - 1])) continue;
        int p = count < TOPK_LIST ? count++ : count - 1;
        for (; p > 0 && beats(v, i, list_v[p - 1], list_i[p - 1]); p--) list_v[p] = list_v[p - 1], list_i[p] = list_i[p - 1];
        list_v[p] = v, list_i[p] = i;
      }
      more = eligible > TOPK_LIST;
    }
    float v = head < count ? list_v[head] : none_v;
    int i = head < count ? list_i[head] : none_i;
    for (int o = 16; o > 0; o >>= 1) {
      float w = __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, o, 31);
      int j = __nvvm_shfl_sync_bfly_i32(0xffffffffu, i, o, 31);
      if (beats(w, j, v, i)) v = w, i = j;
    }
    if ((threadIdx.x & 31) == 0) win_v[threadIdx.x >> 5] = v, win_i[threadIdx.x >> 5] = i;
    sync_threads();
    v = win_v[0], i = win_i[0];
    for (int w = 1; w < TOPK_THREADS / 32; w++)
      if (beats(win_v[w], win_i[w], v, i)) v = win_v[w], i = win_i[w];
    sync_threads();  // win_* are rewritten next round
    if (head < count && list_i[head] == i) head++, last_v = v, last_i = i;
    if (threadIdx.x == 0) emit(out, v, i);
  }
}

// topk writes row blockIdx.x's k best values and indices in order.
KERNEL topk(float *vals, int *idx, const float *x, int n, int k) {
  i64 r = blockIdx.x;
  topk_row(x + r * n, n, k, [&](int o, float v, int i) { vals[r * k + o] = v, idx[r * k + o] = i; });
}

// topk_lse reduces row blockIdx.x of x (rows ld apart, the first n of each
// scored) to out [rows, 2k+1]: its k best values in order, their indices
// as floats (exact below 2^24), and the row's log-sum-exp. A device step
// downloads this in one copy instead of the rows (a sampler's or DDTree's
// top-k with the normaliser of the log-probabilities).
KERNEL topk_lse(float *out, const float *x, int n, i64 ld, int k) {
  __shared__ float max_scratch[32];
  __shared__ double sum_scratch[32];
  const float *row = x + blockIdx.x * ld;
  float *o = out + (i64)blockIdx.x * (2 * k + 1);
  topk_row(row, n, k, [&](int j, float v, int i) { o[j] = v, o[k + j] = (float)i; });
  float top = -__builtin_inff();
  for (int i = threadIdx.x; i < n; i += blockDim.x) top = __builtin_fmaxf(top, row[i]);
  top = block_max(top, max_scratch);
  double sum = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum += expf_(row[i] - top);
  sum = block_sum_d(sum, sum_scratch);
  if (threadIdx.x == 0) o[2 * k] = top + (float)log_(sum);
}
