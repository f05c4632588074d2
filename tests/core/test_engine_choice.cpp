// engine=auto's rule (attncore/plugin/engine.h): which engine serves a call, per pass, head dim and
// length, and the reason the result line gives. Pure logic: runs everywhere.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "attncore/plugin/engine.h"

using attncore::plugin::native_measured_faster;

// auto once sent every d128 call of 1024 x 1024 or more to cuDNN, the backward too, where the
// native backward measured 1-8% faster; the rule is per pass, head dim and length now.
TEST_CASE("auto takes cuDNN per pass and head dim where it measured faster, and says why not") {
  const auto cudnn = [](bool forward, int32_t d, int64_t keys) {
    return native_measured_faster(forward, 9, d, keys, keys, keys, false).empty();
  };
  CHECK_FALSE(cudnn(false, 128, 8192));
  CHECK_FALSE(cudnn(false, 128, 16384));
  CHECK(cudnn(false, 128, 2048));
  CHECK_FALSE(cudnn(true, 128, 8192));
  CHECK(cudnn(true, 128, 4096));
  for (int32_t d : {64, 256}) {
    CHECK(cudnn(true, d, 8192));
    CHECK(cudnn(false, d, 8192));
  }
  CHECK_FALSE(cudnn(true, 96, 8192));
  CHECK(cudnn(false, 96, 8192));
  CHECK_FALSE(cudnn(true, 80, 8192));
  CHECK_FALSE(cudnn(false, 80, 8192));
  CHECK_FALSE(cudnn(true, 64, 1024));  // shorter blocks are not measured
  CHECK(native_measured_faster(false, 9, 128, 8192, 8192, 8192, false) ==
        "auto: the native backward measured faster or level for head_dim 128, 8192 x 8192");
  CHECK(native_measured_faster(true, 8, 64, 8192, 8192, 8192, false) ==
        "auto: cuDNN not measured faster for sm_8x, head_dim 64, 8192 x 8192");
}

// auto once sent FP8 forwards at head dims 64 and 256 to cuDNN by the bf16 rule, whose Hopper FP8
// graph writes O in FP8 (3-4% more error in O): FP8 stays native under auto.
TEST_CASE("auto keeps FP8 calls native and says why") {
  CHECK(attncore::plugin::auto_keeps_fp8(attncore::DType::fp8_e4m3) ==
        "auto: FP8 stays native (cuDNN's Hopper FP8 graph writes O in FP8: 3-4% more error)");
  CHECK(attncore::plugin::auto_keeps_fp8(attncore::DType::bf16).empty());
  CHECK(attncore::plugin::auto_keeps_fp8(attncore::DType::fp16).empty());
}

// auto once judged a windowed call by its block: 512-key windows over 8192 x 8192 went native, 10%
// slower than cuDNN at world size 1 (medium_window 2.365 -> 2.608 ms fwd+bwd).
TEST_CASE("auto judges a windowed call by the keys its rows reach") {
  attncore::Mask causal_window;
  causal_window.causal = true;
  causal_window.window_left = 512;
  CHECK(attncore::plugin::row_keys(causal_window, 8192) == 513);
  attncore::Mask both;
  both.window_left = 100;
  both.window_right = 27;
  CHECK(attncore::plugin::row_keys(both, 8192) == 128);
  CHECK(attncore::plugin::row_keys(attncore::Mask{}, 8192) == 8192);
  CHECK(native_measured_faster(true, 9, 128, 8192, 8192, 513, false).empty());
  CHECK(native_measured_faster(false, 9, 128, 8192, 8192, 513, false).empty());
  CHECK(native_measured_faster(false, 9, 128, 8192, 8192, 8192, false) ==
        "auto: the native backward measured faster or level for head_dim 128, 8192 x 8192");
  CHECK(native_measured_faster(false, 9, 80, 8192, 8192, 513, false) ==
        "auto: the native backward measured faster or level for head_dim 80, 8192 x 8192 (rows of 513 keys)");
}

// A causal d128 forward went native from 8192 keys, where cuDNN's ran 1-3% ahead: 8192 x 8192, and
// the chunks of a context-parallel rank (2048-4096 rows against 4096-12288 keys).
TEST_CASE("auto gives cuDNN the causal d128 forward up to 12288 keys, not the full one from 8192") {
  CHECK(native_measured_faster(true, 9, 128, 8192, 8192, 8192, true).empty());
  CHECK(native_measured_faster(true, 9, 128, 4096, 12288, 12288, true).empty());
  CHECK(native_measured_faster(true, 9, 128, 4096, 16384, 16384, true) ==
        "auto: the native forward measured faster or level for head_dim 128, 4096 x 16384 causal");
  CHECK(native_measured_faster(true, 9, 128, 4096, 8192, 8192, false) ==
        "auto: the native forward measured faster or level for head_dim 128, 4096 x 8192");
  CHECK(native_measured_faster(false, 9, 128, 4096, 8192, 8192, true) ==
        "auto: the native backward measured faster or level for head_dim 128, 4096 x 8192 causal");
}
