// What rounding the backward's P^T to e4m3 costs dV, in float64 on the CPU (docs/KERNELS.md, "FP8
// backward"): dV = P^T dO for 64 keys of rows of N keys (256 sampled queries, D = 128, normal data,
// scores of unit variance), P rounded times 2^8 for every row against times a power of two a key row
// (the largest keeping the row's greatest P within 2^8).
//   g++ -O3 -o fp8_p_rounding scripts/fp8_p_rounding.cpp && ./fp8_p_rounding
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// Nearest e4m3 of x >= 0: 3 mantissa bits, subnormals in steps of 2^-9, saturating at 448.
static double e4m3(double x) {
  if (x <= 0) return 0;
  const int e = int(std::floor(std::log2(x)));
  const double step = e < -6 ? std::ldexp(1.0, -9) : std::ldexp(1.0, e - 3);
  return std::fmin(std::nearbyint(x / step) * step, 448.0);
}

int main() {
  const int D = 128, queries = 256, keys = 64;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0, 1);
  for (int N : {4096, 16384, 65536}) {
    std::vector<double> K(size_t(N) * D), Q(size_t(queries) * D), dO(size_t(queries) * D), P(size_t(queries) * keys);
    for (double& x : K) x = normal(rng);
    for (double& x : Q) x = normal(rng);
    for (double& x : dO) x = normal(rng);
    // 1. Each query's P over all N keys (its LSE), kept for the first `keys` keys.
    for (int q = 0; q < queries; ++q) {
      std::vector<double> s(static_cast<size_t>(N));
      double m = -INFINITY, l = 0;
      for (int k = 0; k < N; ++k) {
        double dot = 0;
        for (int i = 0; i < D; ++i) dot += Q[size_t(q) * D + i] * K[size_t(k) * D + i];
        s[size_t(k)] = dot / std::sqrt(double(D));
        m = std::fmax(m, s[size_t(k)]);
      }
      for (int k = 0; k < N; ++k) l += std::exp(s[size_t(k)] - m);
      for (int k = 0; k < keys; ++k) P[size_t(q) * keys + k] = std::exp(s[size_t(k)] - m - std::log(l));
    }
    // 2. dV exact, with one scale, with a scale a key row.
    double ref = 0, one = 0, row = 0;
    for (int k = 0; k < keys; ++k) {
      double largest = 0;
      for (int q = 0; q < queries; ++q) largest = std::fmax(largest, P[size_t(q) * keys + k]);
      const double scale = std::ldexp(1.0, 7 - int(std::floor(std::log2(largest))));
      for (int i = 0; i < D; ++i) {
        double exact = 0, a = 0, b = 0;
        for (int q = 0; q < queries; ++q) {
          const double p = P[size_t(q) * keys + k], o = dO[size_t(q) * D + i];
          exact += p * o;
          a += e4m3(p * 256) / 256 * o;
          b += e4m3(p * scale) / scale * o;
        }
        ref += exact * exact, one += (a - exact) * (a - exact), row += (b - exact) * (b - exact);
      }
    }
    std::printf("N = %5d keys: dV rel L2 %.4f with 2^8 for every row, %.4f with a scale a key row\n", N,
                std::sqrt(one / ref), std::sqrt(row / ref));
  }
}
