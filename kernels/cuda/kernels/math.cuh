// Transcendental functions for the kernels, without libdevice. Each is
// accurate to about one rounding of its result type; mathcheck.cc tests
// them on the host against libm (gen.sh check). The includer defines INLINE,
// u32/u64, f32_from_bits and the primitives fmaf_, fma_, rintf_ and rint_.
#pragma once

// ldexp for |n| <= 254, through two power-of-two factors so that results
// in the subnormal range stay correct.
INLINE float scale2f(float x, int n) {
  int a = n / 2, b = n - a;
  return x * f32_from_bits((u32)(a + 127) << 23) * f32_from_bits((u32)(b + 127) << 23);
}

// expf_ is exp(x) within about one ulp: Cody-Waite reduction by ln 2 and a
// degree-7 polynomial on |r| <= ln2/2.
INLINE float expf_(float x) {
  if (x > 88.8f) return f32_from_bits(0x7f800000);
  if (x < -104.0f) return 0.0f;
  if (x != x) return x;
  float n = rintf_(x * 1.44269504088896341f);
  float r = fmaf_(n, -0.693145751953125f, x);  // ln2 high part, exact product
  r = fmaf_(n, -1.42860682030941723212e-6f, r);    // ln2 low part
  float p = 1.98412698e-4f;
  p = fmaf_(p, r, 1.38888889e-3f);
  p = fmaf_(p, r, 8.33333333e-3f);
  p = fmaf_(p, r, 4.16666667e-2f);
  p = fmaf_(p, r, 1.66666667e-1f);
  p = fmaf_(p, r, 0.5f);
  p = fmaf_(p, r, 1.0f);
  p = fmaf_(p, r, 1.0f);
  return scale2f(p, (int)n);
}

INLINE float sigmoidf_(float x) { return 1.0f / (1.0f + expf_(-x)); }
INLINE float siluf_(float x) { return x / (1.0f + expf_(-x)); }

// exp_ is exp(x) in double to a few ulp (range reduction by ln 2, Taylor to r^13).
INLINE double exp_(double x) {
  if (x > 709.0) return __builtin_bit_cast(double, 0x7ff0000000000000ull);
  if (x < -745.0) return 0.0;
  if (x != x) return x;
  double n = rint_(x * 1.4426950408889634);
  double r = fma_(n, -6.93147180369123816490e-01, x);
  r = fma_(n, -1.90821492927058770002e-10, r);
  double p = 1.0 / 6227020800.0;
  double f = 479001600.0;
  for (int i = 12; i >= 1; i--) {  // p = Σ r^i/i!, Horner from the top
    p = fma_(p, r, 1.0 / f);
    f /= i;
  }
  p = fma_(p, r, 1.0);
  long long e = (long long)n;
  long long a = e / 2, b = e - a;
  return p * __builtin_bit_cast(double, (u64)(a + 1023) << 52) * __builtin_bit_cast(double, (u64)(b + 1023) << 52);
}

// log_ is the natural log in double for x > 0: x = m·2^e with m in
// [√½, √2), then log m = 2·atanh(s), s = (m-1)/(m+1), |s| < 0.172.
INLINE double log_(double x) {
  if (!(x > 0)) return x == 0 ? -__builtin_bit_cast(double, 0x7ff0000000000000ull) : __builtin_bit_cast(double, 0x7ff8000000000000ull);
  if (x == __builtin_bit_cast(double, 0x7ff0000000000000ull)) return x;
  int e = 0;
  if (x < 2.2250738585072014e-308) {  // subnormal: normalise first
    x *= 18014398509481984.0;         // 2^54
    e = -54;
  }
  u64 b = __builtin_bit_cast(u64, x);
  e += (int)((b >> 52) & 0x7ff) - 1023;
  double m = __builtin_bit_cast(double, (b & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
  if (m > 1.4142135623730951) {
    m *= 0.5;
    e++;
  }
  double s = (m - 1) / (m + 1), s2 = s * s;
  double p = 1.0 / 23;
  for (int k = 21; k >= 1; k -= 2) p = fma_(p, s2, 1.0 / k);
  return fma_((double)e, 6.93147180559945286227e-01, 2 * s * p + (double)e * 2.31904681384629955842e-17);
}

// log1p_ is log(1+y) for y > -1, exact near zero (Goldberg's correction).
INLINE double log1p_(double y) {
  double u = 1 + y;
  if (u == 1) return y;
  return log_(u) * (y / (u - 1));
}

// sincos_ computes sin and cos of a in double: reduce by π/2 (a three-part
// constant, good for |a| well beyond the 2^20 radians RoPE reaches) and use
// Taylor series on |r| <= π/4.
INLINE void sincos_(double a, double *s, double *c) {
  double n = rint_(a * 0.63661977236758134308);
  double r = fma_(n, -1.57079632673412561417e+00, a);
  r = fma_(n, -6.07710050650619224932e-11, r);
  r = fma_(n, -2.02226624879595063154e-21, r);
  double r2 = r * r;
  double sp = 0, cp = 0;
  // sin r = r·Σ (-1)^i r^2i/(2i+1)!, cos r = Σ (-1)^i r^2i/(2i)!, to r^18
  double fs = 1.0 / 121645100408832000.0, fc = 1.0 / 6402373705728000.0;  // 1/19!, 1/18!
  for (int i = 9; i >= 0; i--) {
    double sign = (i & 1) ? -1.0 : 1.0;
    sp = fma_(sp, r2, sign * fs);
    cp = fma_(cp, r2, sign * fc);
    fs *= (2 * i) * (2 * i + 1);
    fc *= (2 * i - 1) * (2 * i);  // unused after i = 0
  }
  double sn = r * sp, cs = cp;
  switch (((long long)n) & 3) {
    case 0: *s = sn; *c = cs; break;
    case 1: *s = cs; *c = -sn; break;
    case 2: *s = -sn; *c = -cs; break;
    default: *s = -cs; *c = sn; break;
  }
}
