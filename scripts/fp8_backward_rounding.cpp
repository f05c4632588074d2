// What rounding the backward's operands to FP8 costs its gradients, in float64 on the CPU
// (docs/KERNELS.md, "FP8 backward"). Rows of N keys, 256 sampled queries, D = 128, normal data
// (scores of unit variance); each figure is a rel L2 error against the unrounded product.
//  1. dV = P^T dO for 64 keys: P rounded to e4m3 times 2^8 for every row, against times a power of
//     two a key row (the largest keeping the row's greatest P within 2^8).
//  2. dK = dS^T Q for 256 keys: dS^T rounded with a power of two a key row, e4m3 and e5m2.
//  3. dQ = dS K over all N keys: dS rounded with a power of two a query row and step of 128 keys,
//     or one a step of 64 queries x 128 keys, e4m3 and e5m2.
//   g++ -O3 -o fp8_backward_rounding scripts/fp8_backward_rounding.cpp && ./fp8_backward_rounding
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// Nearest value of an FP8 format (man mantissa bits, smallest normal exponent emin, largest value
// top), saturating, sign kept.
static double fp8(double x, int man, int emin, double top) {
  if (x == 0) return 0;
  const double a = std::fabs(x);
  const double step = std::ldexp(1.0, std::max(int(std::floor(std::log2(a))), emin) - man);
  return std::copysign(std::fmin(std::nearbyint(a / step) * step, top), x);
}
static double e4m3(double x) { return fp8(x, 3, -6, 448); }
static double e5m2(double x) { return fp8(x, 2, -14, 57344); }

// The power of two that puts `largest` in [2^top, 2^(top + 1)).
static double scale_for(double largest, int top) {
  return largest > 0 ? std::ldexp(1.0, top - int(std::floor(std::log2(largest)))) : 1;
}

struct Error {
  double ref = 0, err = 0;
  void add(double got, double want) { ref += want * want, err += (got - want) * (got - want); }
  double rel() const { return std::sqrt(err / ref); }
};

int main() {
  const int D = 128, queries = 256;
  std::mt19937_64 rng(7), rng_v(8);
  std::normal_distribution<double> normal(0, 1);
  for (int N : {4096, 16384, 65536}) {
    std::vector<double> K(size_t(N) * D), Q(size_t(queries) * D), dO(size_t(queries) * D), V(size_t(N) * D);
    for (double& x : K) x = normal(rng);
    for (double& x : Q) x = normal(rng);
    for (double& x : dO) x = normal(rng);
    for (double& x : V) x = normal(rng_v);
    // Each query's P over all N keys (its LSE), O = P V, delta = dO . O, and dS = P (dP - delta).
    std::vector<double> P(size_t(queries) * N), dS(size_t(queries) * N);
    for (int q = 0; q < queries; ++q) {
      double* p = &P[size_t(q) * N];
      double m = -INFINITY, l = 0;
      for (int k = 0; k < N; ++k) {
        double dot = 0;
        for (int i = 0; i < D; ++i) dot += Q[size_t(q) * D + i] * K[size_t(k) * D + i];
        p[k] = dot / std::sqrt(double(D));
        m = std::fmax(m, p[k]);
      }
      for (int k = 0; k < N; ++k) l += std::exp(p[k] - m);
      std::vector<double> o(D, 0.0);
      for (int k = 0; k < N; ++k) {
        p[k] = std::exp(p[k] - m - std::log(l));
        for (int i = 0; i < D; ++i) o[i] += p[k] * V[size_t(k) * D + i];
      }
      double delta = 0;
      for (int i = 0; i < D; ++i) delta += dO[size_t(q) * D + i] * o[i];
      for (int k = 0; k < N; ++k) {
        double dp = 0;
        for (int i = 0; i < D; ++i) dp += dO[size_t(q) * D + i] * V[size_t(k) * D + i];
        dS[size_t(q) * N + k] = p[k] * (dp - delta);
      }
    }
    // 1. dV.
    Error one, row;
    for (int k = 0; k < 64; ++k) {
      double largest = 0;
      for (int q = 0; q < queries; ++q) largest = std::fmax(largest, P[size_t(q) * N + k]);
      const double scale = scale_for(largest, 7);
      for (int i = 0; i < D; ++i) {
        double exact = 0, a = 0, b = 0;
        for (int q = 0; q < queries; ++q) {
          const double p = P[size_t(q) * N + k], o = dO[size_t(q) * D + i];
          exact += p * o;
          a += e4m3(p * 256) / 256 * o;
          b += e4m3(p * scale) / scale * o;
        }
        one.add(a, exact), row.add(b, exact);
      }
    }
    // 2. dK.
    Error k4, k5;
    for (int k = 0; k < 256; ++k) {
      double largest = 0;
      for (int q = 0; q < queries; ++q) largest = std::fmax(largest, std::fabs(dS[size_t(q) * N + k]));
      const double s4 = scale_for(largest, 3), s5 = scale_for(largest, 14);
      for (int i = 0; i < D; ++i) {
        double exact = 0, a = 0, b = 0;
        for (int q = 0; q < queries; ++q) {
          const double d = dS[size_t(q) * N + k], x = Q[size_t(q) * D + i];
          exact += d * x, a += e4m3(d * s4) / s4 * x, b += e5m2(d * s5) / s5 * x;
        }
        k4.add(a, exact), k5.add(b, exact);
      }
    }
    // 3. dQ: the largest |dS| of each query row and step, and of each 64-query step.
    const int steps = N / 128;
    std::vector<double> row_top(size_t(queries) * steps), step_top(size_t(queries / 64) * steps, 0.0);
    for (int q = 0; q < queries; ++q)
      for (int t = 0; t < steps; ++t) {
        double largest = 0;
        for (int k = 128 * t; k < 128 * t + 128; ++k) largest = std::fmax(largest, std::fabs(dS[size_t(q) * N + k]));
        row_top[size_t(q) * steps + t] = largest;
        step_top[size_t(q / 64) * steps + t] = std::fmax(step_top[size_t(q / 64) * steps + t], largest);
      }
    Error q_row, q_step, q_step5;
    for (int q = 0; q < queries; ++q) {
      std::vector<double> exact(D, 0.0), a(D, 0.0), b(D, 0.0), c(D, 0.0);
      for (int t = 0; t < steps; ++t) {
        const double sr = scale_for(row_top[size_t(q) * steps + t], 3);
        const double ss = scale_for(step_top[size_t(q / 64) * steps + t], 3);
        const double s5 = scale_for(step_top[size_t(q / 64) * steps + t], 14);
        for (int k = 128 * t; k < 128 * t + 128; ++k) {
          const double d = dS[size_t(q) * N + k];
          const double dr = e4m3(d * sr) / sr, ds = e4m3(d * ss) / ss, d5 = e5m2(d * s5) / s5;
          for (int i = 0; i < D; ++i) {
            const double x = K[size_t(k) * D + i];
            exact[i] += d * x, a[i] += dr * x, b[i] += ds * x, c[i] += d5 * x;
          }
        }
      }
      for (int i = 0; i < D; ++i) q_row.add(a[i], exact[i]), q_step.add(b[i], exact[i]), q_step5.add(c[i], exact[i]);
    }
    std::printf("N = %5d keys: dV, P e4m3: 2^8 for every row %.4f, a scale a key row %.4f\n", N, one.rel(), row.rel());
    std::printf("              dK, dS^T a scale a key row: e4m3 %.4f, e5m2 %.4f\n", k4.rel(), k5.rel());
    std::printf("              dQ, dS e4m3 a scale a query row %.4f, a scale a step %.4f; e5m2 a step %.4f\n",
                q_row.rel(), q_step.rel(), q_step5.rel());
  }
}
