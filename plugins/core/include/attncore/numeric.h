// bf16, fp16 and FP8 on the host, by hand: the CPU reference must build without CUDA headers, and its
// rounding must match the GPU's (round to nearest even, NaN stays NaN, overflow goes to inf).
#pragma once

#include <bit>
#include <cstdint>

namespace attncore {

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u); // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);                                          // nearest, ties to even
  return uint16_t(x >> 16);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) { // zero or subnormal: mant * 2^-24, exact in float
    const float v = float(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t float_to_fp16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u); // >= 65520 rounds to inf
  if (x < 0x38800000u) {                                 // below 2^-14: subnormal half or zero
    if (x <= 0x33000000u) return sign;                   // <= 2^-25 rounds to 0 (tie to even)
    const uint32_t m = (x & 0x7fffffu) | 0x800000u, shift = 126u - (x >> 23);
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = (((x >> 23) - 112u) << 10) | ((x & 0x7fffffu) >> 13);
  const uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r; // a carry rolls into the exponent
  return uint16_t(sign | r);
}

// An FP8 element as the float it encodes (OCP formats; e4m3: no infinity, S.1111.111 is NaN).
inline float fp8_to_float(uint8_t b, bool e4m3) {
  const uint32_t man = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, top = e4m3 ? 15 : 31;
  const uint32_t sign = uint32_t(b & 0x80u) << 24, exp = (b & 0x7fu) >> man, mant = b & ((1u << man) - 1u);
  if (e4m3 ? (b & 0x7fu) == 0x7fu : exp == top)
    return std::bit_cast<float>(sign | 0x7f800000u | (e4m3 || mant ? 0x400000u : 0u));
  if (exp == 0) { // mant x 2^(1 - bias - man), exact in float
    const float v = float(mant) * std::bit_cast<float>((128u - bias - man) << 23);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 127u - bias) << 23) | (mant << (23u - man)));
}

} // namespace attncore
