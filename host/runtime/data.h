// Deterministic problem data (DESIGN.md section 4).
//
// Every element of Q, K, V and dO is a pure function of (seed, tensor, batch, global token, head,
// dim): a counter-based hash whose bits become a value by integer arithmetic and one float
// multiply, then rounding to the storage dtype by integer bit operations. Nothing here depends
// on libm, fused multiply-add or the order of operations, so the CUDA kernel and the CPU loop
// produce bit-identical values, every world size sees the same numbers, and the reference check
// can recompute any element at any time.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ATTNHOST_HD __host__ __device__ __forceinline__
#else
#define ATTNHOST_HD inline
#endif

namespace attnhost::data {

enum Tensor : uint32_t { kQ = 1, kK = 2, kV = 3, kDO = 4 };
enum Distribution : int32_t {
  kNormal = 0,  // approximately standard normal (Irwin-Hall of four uniforms), times scale
  kUniform = 1, // uniform in [-scale, scale)
};

struct Params {
  uint64_t seed = 1;
  int32_t distribution = kNormal;
  float scale = 1.0f;
};

// SplitMix64's finalizer: a bijection with full avalanche.
ATTNHOST_HD uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

ATTNHOST_HD uint64_t element_hash(uint64_t seed, uint32_t tensor, int64_t batch, int64_t token,
                                  int32_t head, int32_t dim) {
  uint64_t h = mix(seed ^ (0x9e3779b97f4a7c15ULL * tensor));
  h = mix(h ^ static_cast<uint64_t>(batch) * 0xd1b54a32d192ed03ULL);
  h = mix(h ^ static_cast<uint64_t>(token));
  h = mix(h ^ ((static_cast<uint64_t>(static_cast<uint32_t>(head)) << 32) | static_cast<uint32_t>(dim)));
  return h;
}

// The value in float before rounding to the storage type. Exact in float arithmetic: the integer
// sum is below 2^24, so converting it is exact and one multiply is correctly rounded everywhere.
ATTNHOST_HD float element_value(const Params& p, uint32_t tensor, int64_t batch, int64_t token,
                                int32_t head, int32_t dim) {
  uint64_t h = element_hash(p.seed, tensor, batch, token, head, dim);
  if (p.distribution == kUniform) {
    int32_t u = static_cast<int32_t>(h >> 41) - (1 << 22);       // [-2^22, 2^22)
    return static_cast<float>(u) * (p.scale * (1.0f / 4194304.0f));
  }
  // Four 16-bit uniforms: mean 4 * 32767.5, variance 4 * (65536^2 - 1) / 12.
  int32_t s = static_cast<int32_t>(h & 0xffff) + static_cast<int32_t>((h >> 16) & 0xffff) +
              static_cast<int32_t>((h >> 32) & 0xffff) + static_cast<int32_t>(h >> 48) - 131070;
  // 2 * s has an exact float representation; 1 / (65536 / sqrt(3)) standardizes it.
  constexpr float kStandardize = 2.6429161e-05f;  // sqrt(3) / 65536
  return static_cast<float>(s) * (p.scale * kStandardize);
}

// Round-to-nearest-even float -> bf16 / fp16 bits, by integer operations only.
ATTNHOST_HD uint32_t float_bits(float f) {
  union { float f; uint32_t u; } v{f};
  return v.u;
}
ATTNHOST_HD float bits_float(uint32_t u) {
  union { uint32_t u; float f; } v{u};
  return v.f;
}

ATTNHOST_HD uint16_t to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40); // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
ATTNHOST_HD float from_bf16(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

ATTNHOST_HD uint16_t to_fp16(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                               // subnormal or zero in fp16
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);           // below half the smallest
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(a >> 23);                        // 14..24
    uint32_t shifted = mant >> shift;                                   // units of 2^-24
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    uint32_t r = shifted;
    if (rem > half || (rem == half && (shifted & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = a - 0x38000000u;                 // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);               // round to nearest even at bit 13
  return static_cast<uint16_t>(sign | (r >> 13));
}
ATTNHOST_HD float from_fp16(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // subnormal: value = mant * 2^-24, exact in float
    float v = static_cast<float>(mant) * 5.9604645e-08f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// The 8-bit float formats (OCP FP8): mantissa bits, exponent bias, and the largest finite code
// without its sign. e4m3 has no infinity (S.1111.111 is NaN); e5m2's top exponent holds
// infinities and NaNs, as in IEEE.
struct Fp8Format {
  uint32_t mantissa, bias, max_code;
};
ATTNHOST_HD Fp8Format e4m3() { return {3, 7, 0x7e}; }   // largest 448
ATTNHOST_HD Fp8Format e5m2() { return {2, 15, 0x7b}; }  // largest 57344

// Round-to-nearest-even float -> FP8 bits, by integer operations only. Beyond the largest finite
// value it saturates (a tensor's scale keeps its values inside); NaN stays NaN.
ATTNHOST_HD uint8_t to_fp8(float f, Fp8Format fmt) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  const uint32_t drop = 23u - fmt.mantissa;  // float mantissa bits the format drops
  uint32_t code;
  if ((a >> 23) + fmt.bias <= 127u) {        // subnormal or zero in the format
    // In units of the smallest subnormal, 2^(1 - bias - mantissa): the float's mantissa shifted.
    const uint32_t shift = 151u - fmt.bias - fmt.mantissa - (a >> 23);
    if (a < 0x00800000u || shift > 25u) return static_cast<uint8_t>(sign);
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    code = mant >> shift;
    if (rem > half || (rem == half && (code & 1u))) ++code;  // 2^mantissa: the smallest normal
  } else {
    uint32_t r = a - ((127u - fmt.bias) << 23);  // rebias the exponent
    r += ((1u << (drop - 1u)) - 1u) + ((r >> drop) & 1u);
    code = r >> drop;
  }
  if (code > fmt.max_code) code = fmt.max_code;
  return static_cast<uint8_t>(sign | code);
}

ATTNHOST_HD float from_fp8(uint8_t b, Fp8Format fmt) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b & 0x7fu) >> fmt.mantissa, mant = b & ((1u << fmt.mantissa) - 1u);
  const uint32_t top = (1u << (7u - fmt.mantissa)) - 1u;
  if (fmt.max_code == e4m3().max_code ? (b & 0x7fu) == 0x7fu : exp == top)
    return bits_float(sign | 0x7f800000u | (fmt.max_code == e4m3().max_code || mant ? 0x400000u : 0u));
  if (exp == 0) {  // mant x 2^(1 - bias - mantissa), exact in float
    const float v = static_cast<float>(mant) * bits_float((128u - fmt.bias - fmt.mantissa) << 23);
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 127u - fmt.bias) << 23) | (mant << (23u - fmt.mantissa)));
}

// The largest |value| the generator makes with these parameters: uniform in [-scale, scale), or
// the standardized sum of four 16-bit uniforms, at most 131070 units.
ATTNHOST_HD float value_bound(const Params& p) {
  return p.distribution == kUniform ? p.scale : 131070.0f * (p.scale * 2.6429161e-05f);
}

// A tensor's FP8 scale: the largest power of two that keeps value_bound within the format's
// largest finite value. A power of two keeps x * scale and the descale exact.
ATTNHOST_HD float fp8_scale(const Params& p, Fp8Format fmt) {
  const float largest = from_fp8(static_cast<uint8_t>(fmt.max_code), fmt);
  return bits_float(float_bits(largest / value_bound(p)) & 0x7f800000u);
}

}  // namespace attnhost::data
