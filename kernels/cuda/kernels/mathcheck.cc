// Host test of math.cuh against libm (run by ../gen.sh check): prints the
// largest error of each function over a sweep of arguments and fails when
// one exceeds its bound. Build: c++ -O2 mathcheck.cc && ./a.out
#include <cmath>
#include <cstdio>
#include <cstring>

typedef unsigned int u32;
typedef unsigned long long u64;
#define INLINE static inline
INLINE float f32_from_bits(u32 b) { float f; std::memcpy(&f, &b, 4); return f; }
INLINE float fmaf_(float a, float b, float c) { return std::fmaf(a, b, c); }
INLINE double fma_(double a, double b, double c) { return std::fma(a, b, c); }
INLINE float rintf_(float x) { return std::round(x); }
INLINE double rint_(double x) { return std::round(x); }
#include "math.cuh"

static int failed = 0;

// report fails when the worst relative error exceeds bound units of the
// result type's unit roundoff u.
static void report(const char *name, double worst, double at, double u, double bound) {
  bool bad = !(worst <= bound * u);
  std::printf("%-8s max rel err %.3g (%.2f u) at %.17g%s\n", name, worst, worst / u, at, bad ? "  FAIL" : "");
  failed |= bad;
}

static double rel(long double got, long double want) {
  if (got == want) return 0;
  return (double)(std::fabs(got - want) / std::fabs(want));
}

int main() {
  const double uf = std::ldexp(1.0, -24), ud = std::ldexp(1.0, -53);
  double worst = 0, at = 0;
  for (double x = -103.0; x <= 88.7; x += 0.000731) {  // float exp, incl. subnormal results
    float xf = (float)x;
    double want = std::exp((double)xf);
    if (want < 1.1754943508222875e-38) continue;  // subnormal results: checked absolutely below
    double e = rel(expf_(xf), want);
    if (e > worst) worst = e, at = xf;
  }
  report("expf_", worst, at, uf, 3);
  float sub = expf_(-100.0f);
  if (std::fabs(sub - std::exp(-100.0f)) > 1e-45) std::printf("expf_(-100) = %g, want %g  FAIL\n", sub, std::exp(-100.0f)), failed = 1;
  worst = 0;
  for (double x = -744.0; x <= 709.0; x += 0.00917) {
    double e = rel(exp_(x), std::exp((long double)x));
    if (std::exp(x) > 2.3e-308 && e > worst) worst = e, at = x;
  }
  report("exp_", worst, at, ud, 4);
  worst = 0;
  for (double x = 1e-300; x < 1e300; x *= 1.0001237) {
    double e = rel(log_(x), std::log((long double)x));
    if (e > worst) worst = e, at = x;
  }
  for (double x = 0.5; x < 2; x += 1e-6) {  // near 1, where log is small
    if (x == 1) continue;
    double e = rel(log_(x), std::log((long double)x));
    if (e > worst) worst = e, at = x;
  }
  report("log_", worst, at, ud, 4);
  worst = 0;
  for (double y = -0.9999; y < 1e6; y = y < 0 ? y * 0.999 + (y > -1e-12 ? 1e-12 : 0) : y * 1.001 + 1e-12) {
    double e = rel(log1p_(y), std::log1p((long double)y));
    if (y != 0 && e > worst) worst = e, at = y;
  }
  report("log1p_", worst, at, ud, 8);
  double ws = 0, wc = 0, as = 0, ac = 0;
  for (double a = 0; a < 262144.0 * 1.0001; a += 0.3171) {  // RoPE angles: position · frequency <= 1
    double s, c;
    sincos_(a, &s, &c);
    // absolute error relative to 1: sin/cos values feed a float product
    double es = std::fabs(s - (double)std::sin((long double)a)), ec = std::fabs(c - (double)std::cos((long double)a));
    if (es > ws) ws = es, as = a;
    if (ec > wc) wc = ec, ac = a;
  }
  report("sin_", ws, as, ud, 64);
  report("cos_", wc, ac, ud, 64);
  return failed;
}
