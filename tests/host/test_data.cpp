// The deterministic data: conversions match the hardware's, values do not depend on sharding.
#include "runtime/comm.h"
#include "runtime/data.h"
#include "runtime/device.h"
#include "runtime/services.h"

#include <doctest/doctest.h>

#if ATTNHOST_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <cmath>
#include <cstring>
#include <random>

using namespace attnhost;

TEST_CASE("fp16 rounding matches the compiler's conversion for every class of value") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = bits(rng);
    if (i % 4 == 1) u = (u & 0x807fffffu) | ((100u + u % 60u) << 23);  // around fp16's range, subnormals too
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    _Float16 want = static_cast<_Float16>(f);
    uint16_t want_bits;
    std::memcpy(&want_bits, &want, 2);
    REQUIRE_MESSAGE(data::to_fp16(f) == want_bits, "f = ", f);
    CHECK(data::from_fp16(want_bits) == static_cast<float>(want));
    ++checked;
  }
  CHECK(checked > 1000000);
}

TEST_CASE("bf16 rounding is round-to-nearest-even") {
  CHECK(data::to_bf16(1.0f) == 0x3f80);
  float halfway;  // 1 + 2^-8: exactly between two bf16 values, rounds to even (1.0)
  uint32_t u = 0x3f808000u;
  std::memcpy(&halfway, &u, 4);
  CHECK(data::to_bf16(halfway) == 0x3f80);
  u = 0x3f818000u;  // between 0x3f81 and 0x3f82: rounds to even 0x3f82
  std::memcpy(&halfway, &u, 4);
  CHECK(data::to_bf16(halfway) == 0x3f82);
  CHECK(std::isnan(data::from_bf16(data::to_bf16(std::nanf("")))));
}

// FP8 by brute force: the nearest finite value of the format, ties to the even code, the largest
// finite beyond it.
uint8_t nearest_fp8(float x, data::Fp8Format f) {
  int best = -1;
  double best_distance = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = data::from_fp8(static_cast<uint8_t>(c), f);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(static_cast<double>(v) - x);
    if (best < 0 || d < best_distance || (d == best_distance && (c & 1) == 0)) {
      best = c;
      best_distance = d;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST_CASE("fp8 rounding is round-to-nearest-even, saturating, with subnormals, in both formats") {
  for (data::Fp8Format f : {data::e4m3(), data::e5m2()}) {
    for (int c = 0; c < 256; ++c) {  // every finite code round-trips
      const float v = data::from_fp8(static_cast<uint8_t>(c), f);
      if (std::isfinite(v) && v != 0) CHECK(data::to_fp8(v, f) == c);
    }
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> wide(-70000.f, 70000.f), narrow(-0.02f, 0.02f), mid(-500.f, 500.f);
    for (int i = 0; i < 30000; ++i)
      for (float x : {wide(rng), narrow(rng), mid(rng)}) {
        INFO("x = ", x, " mantissa bits ", f.mantissa);
        CHECK(data::from_fp8(data::to_fp8(x, f), f) == data::from_fp8(nearest_fp8(x, f), f));
      }
    CHECK(std::isnan(data::from_fp8(data::to_fp8(std::nanf(""), f), f)));
  }
  CHECK(data::to_fp8(448.f, data::e4m3()) == 0x7e);
  CHECK(data::to_fp8(1000.f, data::e4m3()) == 0x7e);             // saturates
  CHECK(data::to_fp8(std::ldexp(1.f, -9), data::e4m3()) == 0x01);  // the smallest subnormal
  CHECK(data::to_fp8(1.0625f, data::e4m3()) == 0x38);             // halfway between 1 and 1.125: even
  CHECK(data::to_fp8(57344.f, data::e5m2()) == 0x7b);
  CHECK(std::isinf(data::from_fp8(0x7c, data::e5m2())));
}

TEST_CASE("an FP8 input is its value scaled by a power of two within the format, rounded, and the reference reads it back") {
  for (int32_t dist : {data::kNormal, data::kUniform})
    for (int32_t dtype : {ATTNHOST_DTYPE_FP8_E4M3, ATTNHOST_DTYPE_FP8_E5M2}) {
      data::Params p;
      p.distribution = dist;
      p.scale = dist == data::kUniform ? 3.f : 1.f;
      const data::Fp8Format f = fp8_format(dtype);
      const float scale = data::fp8_scale(p, f);
      int exponent = 0;
      CHECK(std::frexp(scale, &exponent) == 0.5f);  // a power of two
      CHECK(data::value_bound(p) * scale <= data::from_fp8(static_cast<uint8_t>(f.max_code), f));
      CHECK(data::value_bound(p) * scale * 2 > data::from_fp8(static_cast<uint8_t>(f.max_code), f));
      CHECK(input_descale(p, dtype) == 1.0 / scale);
      GenerateSpec spec{p, data::kK, dtype, 2, 40, 3, 16, {{100, 0, 40}}};
      std::vector<uint8_t> stored(2 * 40 * 3 * 16);
      generate_cpu(stored.data(), spec);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t t = 0; t < 40; ++t)
          for (int32_t d = 0; d < 16; ++d) {
            const size_t i = ((b * 40 + t) * 3 + 2) * 16 + d;
            const double seen = generated_element(p, data::kK, dtype, b, 100 + t, 2, d);
            CHECK(seen == load_element(stored.data(), dtype, i) * input_descale(p, dtype));
            const float exact = data::element_value(p, data::kK, b, 100 + t, 2, d);
            CHECK(std::fabs(seen - exact) <= std::fabs(exact) / (1 << (f.mantissa + 1)) + 1e-3);
          }
    }
  CHECK(output_dtype(ATTNHOST_DTYPE_FP8_E4M3) == ATTNHOST_DTYPE_BF16);
  CHECK(output_dtype(ATTNHOST_DTYPE_FP16) == ATTNHOST_DTYPE_FP16);
}

TEST_CASE("generated values depend on the global token, not on where it is stored") {
  data::Params p;
  p.seed = 42;
  GenerateSpec whole{p, data::kK, ATTNHOST_DTYPE_BF16, 2, 64, 3, 16, {{0, 0, 64}}};
  std::vector<uint16_t> a(2 * 64 * 3 * 16);
  generate_cpu(a.data(), whole);
  // The second half, held by "rank 1" with two padding slots in front.
  GenerateSpec half{p, data::kK, ATTNHOST_DTYPE_BF16, 2, 34, 3, 16, {{32, 2, 32}}};
  std::vector<uint16_t> b(2 * 34 * 3 * 16);
  generate_cpu(b.data(), half);
  for (int64_t batch = 0; batch < 2; ++batch)
    for (int64_t t = 0; t < 32; ++t)
      for (int i = 0; i < 3 * 16; ++i)
        REQUIRE(a[(batch * 64 + 32 + t) * 48 + i] == b[(batch * 34 + 2 + t) * 48 + i]);
  CHECK(b[0] == 0);  // padding is zero
  CHECK(generated_element(p, data::kK, ATTNHOST_DTYPE_BF16, 1, 40, 2, 5) == data::from_bf16(a[(64 + 40) * 48 + 2 * 16 + 5]));
}

TEST_CASE("the normal distribution has mean 0 and variance 1 and tensors and seeds differ") {
  data::Params p;
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double v = data::element_value(p, data::kQ, 0, i, 0, 0);
    sum += v;
    sq += v * v;
  }
  CHECK(std::fabs(sum / n) < 0.01);
  CHECK(std::fabs(sq / n - 1.0) < 0.02);
  CHECK(data::element_value(p, data::kQ, 0, 5, 0, 0) != data::element_value(p, data::kK, 0, 5, 0, 0));
  data::Params other = p;
  other.seed = 2;
  CHECK(data::element_value(p, data::kQ, 0, 5, 0, 0) != data::element_value(other, data::kQ, 0, 5, 0, 0));
  data::Params uniform = p;
  uniform.distribution = data::kUniform;
  uniform.scale = 3.0f;
  for (int i = 0; i < 1000; ++i) {
    float v = data::element_value(uniform, data::kV, 0, i, 1, 2);
    REQUIRE(v >= -3.0f);
    REQUIRE(v < 3.0f);
  }
}

#if ATTNHOST_HAVE_CUDA
TEST_CASE("gpu: the CUDA kernel generates bit-identical data to the CPU with zero padding" * doctest::test_suite("gpu")) {
  REQUIRE_MESSAGE(attnhost::cuda_device_count() > 0, "no GPU visible");
  auto device = attnhost::make_cuda_device(0);
  for (int32_t dtype : {ATTNHOST_DTYPE_BF16, ATTNHOST_DTYPE_FP16, ATTNHOST_DTYPE_FP32, ATTNHOST_DTYPE_FP8_E4M3,
                        ATTNHOST_DTYPE_FP8_E5M2})
    for (int32_t dist : {data::kNormal, data::kUniform}) {
      data::Params p;
      p.seed = 1234567;
      p.distribution = dist;
      p.scale = dist == data::kUniform ? 7.5f : 1.0f;
      GenerateSpec spec{p, data::kV, dtype, 3, 300, 5, 72, {{1000, 4, 200}, {70000, 210, 80}}};
      const size_t bytes = 3 * 300 * 5 * 72 * dtype_bytes(dtype);
      std::vector<char> want(bytes), got(bytes);
      generate_cpu(want.data(), spec);
      void* buffer = device->alloc(bytes);
      device->generate(buffer, spec);
      device->copy_to_host(got.data(), buffer, bytes);
      device->free(buffer);
      INFO("dtype ", dtype, " distribution ", dist);
      CHECK(std::memcmp(want.data(), got.data(), bytes) == 0);
    }
}
// A transfer on an auxiliary stream at the default priority waited behind every block of the kernel
// it should have hidden under (a 1.1 ms hop took 14 ms under a backward, docs/KERNELS.md, "Communication streams at the greatest priority").
// Stream 3 (ABI 1.8) fills the SMs stream 0's kernels leave: at their priority, it waits for their
// blocks to be placed rather than cutting ahead (docs/KERNELS.md, "Filling the last wave").
TEST_CASE("gpu: the auxiliary streams run at the device's greatest priority and stream 0 and the fill stream at its least" *
          doctest::test_suite("gpu")) {
  REQUIRE_MESSAGE(attnhost::cuda_device_count() > 0, "no GPU visible");
  auto device = attnhost::make_cuda_device(0);
  int least = 0, greatest = 0;
  REQUIRE(cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess);
  REQUIRE(greatest != least);  // (lower numbers are greater priorities)
  for (int index : {0, 1, 2, 3}) {
    int priority = 0;
    REQUIRE(cudaStreamGetPriority(static_cast<cudaStream_t>(device->stream(index)), &priority) == cudaSuccess);
    CHECK(priority == (index == 0 || index == 3 ? least : greatest));
  }
  CHECK(device->stream(4) == nullptr);
  // What a plugin is lent through the host API: every stream the device has, and no other (the
  // fill stream was once the device's and not the plugins').
  InprocWorld world(1, std::chrono::milliseconds(1000));
  auto comm = world.communicator(0);
  Tracer tracer(*device, 0);
  RankServices services(*device, *comm, tracer, 0);
  const attnhost_host_api* api = services.api();
  for (int index : {0, 1, 2, 3}) CHECK(api->stream(api->context, index) == device->stream(index));
  CHECK(api->stream(api->context, 4) == nullptr);
  CHECK(api->stream(api->context, -1) == nullptr);
}
#endif
