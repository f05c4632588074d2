// What the FP8 kernels' e4m3 products share on Hopper: operands whose reduction index must be
// contiguous (V^T in the forward's P V, dO^T in the backward's dV += P^T dO) transposed once per
// call with that index in the order the score registers hold it, and probabilities packed straight
// from those registers into e4m3 A fragments.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "../launch.h"

namespace attncore::cuda::sm90 {

// The key at position x of a 32-key group of V^T: position 4 t + i (i < 4) of the FP8 A fragment's
// first half is the lane's (t = lane % 4) i-th score of the group's first two n8 tiles (keys 2 t,
// 2 t + 1, 8 + 2 t, 9 + 2 t); the second half, from 16 on, likewise over the last two.
__host__ __device__ constexpr int v_key_at(int x) {
  return (x & 16) | ((x & 2) << 2) | (((x >> 2) & 3) << 1) | (x & 1);
}

constexpr bool v_key_order_is_a_permutation() {
  bool seen[32] = {};
  for (int x = 0; x < 32; ++x) {
    if (seen[v_key_at(x)]) return false;
    seen[v_key_at(x)] = true;
  }
  return v_key_at(5) == 3 && v_key_at(6) == 10 && v_key_at(22) == 26;
}
static_assert(v_key_order_is_a_permutation(), "each key of a group once, where the lane's scores hold it");

// A transpose's tokens per row: the tensor's rounded up to whole 32-token groups (the rest zeros),
// as forward_workspace_bytes counts V^T's (the backward's dO^T lives in the slot of widened dO).
inline int64_t v_fp8_keys(int64_t seqlen) { return (seqlen + 31) / 32 * 32; }

// V ([batch, key, kv head, dim], FP8 bytes) -> V^T, keys in v_key_at order within each 32-key group
// (and the backward's dO -> dO^T, its queries so ordered). A CTA of D threads moves 64 keys x D of
// one (batch, head): rows of V in 16-byte pieces into shared memory, then each thread turns 16 keys
// x 4 dims into 4 rows of 16 V^T bytes, 4 x 4 bytes at a time by byte permutes, and stores each
// row's 16 bytes at once. A warp takes 16 dim groups of two 16-key groups: with the tile's rows an
// odd number of words apart (D / 4 + 1), its column reads hit 32 distinct banks.
template <int D> __global__ void __launch_bounds__(D) transpose_v_fp8(TensorRef v, uint8_t* vt, int32_t seqlen, int64_t keys) {
  constexpr int kKeys = 64, kPitch = D + 4;
  __shared__ uint32_t tile[kKeys * kPitch / 4];
  const int64_t k0 = int64_t(blockIdx.x) * kKeys;
  const int head = blockIdx.y, batch = blockIdx.z;
  const uint8_t* src = static_cast<const uint8_t*>(v.data) + batch * v.batch_stride + head * v.head_stride;
  // 1. 64 rows of V (zeros past the sequence), each in D / 16 pieces of 16 bytes.
  for (int c = threadIdx.x; c < kKeys * D / 16; c += D) {
    const int key = c / (D / 16), col = c % (D / 16) * 16;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (k0 + key < seqlen) x = *reinterpret_cast<const uint4*>(src + (k0 + key) * v.token_stride + col);
    uint32_t* row = tile + key * (kPitch / 4) + col / 4;
    row[0] = x.x, row[1] = x.y, row[2] = x.z, row[3] = x.w;
  }
  __syncthreads();
  // 2. This thread's dims d .. d + 3 and tile positions x0 .. x0 + 15.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int d = 4 * (16 * (warp % (D / 64)) + lane % 16);
  const int x0 = 16 * (2 * (warp / (D / 64)) + lane / 16);
  if (k0 + x0 >= keys) return; // (keys: whole 32-key groups, so a 16-position run is all in or out)
  uint32_t out[4][4]; // [dim d + j][positions x0 + 4 q ..]
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int x = x0 + 4 * q;
    uint32_t w[4]; // keys at positions x .. x + 3, dims d .. d + 3
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = tile[((x & ~31) + v_key_at((x + i) & 31)) * (kPitch / 4) + d / 4];
    const uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140), hi01 = __byte_perm(w[0], w[1], 0x7362);
    const uint32_t lo23 = __byte_perm(w[2], w[3], 0x5140), hi23 = __byte_perm(w[2], w[3], 0x7362);
    out[0][q] = __byte_perm(lo01, lo23, 0x5410);
    out[1][q] = __byte_perm(lo01, lo23, 0x7632);
    out[2][q] = __byte_perm(hi01, hi23, 0x5410);
    out[3][q] = __byte_perm(hi01, hi23, 0x7632);
  }
  // 3. Four rows of V^T, 16 bytes each.
  uint8_t* dst = vt + ((int64_t(batch) * gridDim.y + head) * D + d) * keys + k0 + x0;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    *reinterpret_cast<uint4*>(dst + j * keys) = make_uint4(out[j][0], out[j][1], out[j][2], out[j][3]);
}

// Four floats rounded to e4m3 (saturating), the first in the low byte.
__device__ __forceinline__ uint32_t pack4_e4m3(float x0, float x1, float x2, float x3) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(x0, x1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(x2, x3), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// A fragments of e4m3 products from fp32 score tiles (rows: the product's M; columns: its k index
// in n8 tiles), each row times its factor (row g: row[0], row g + 8: row[1]): k-step kk takes n8
// tiles 4 kk .. 4 kk + 3, a lane's scores of each 32-column group in the order v_key_at gives the
// transposed operand's columns.
template <int kSteps>
__device__ __forceinline__ void pack_e4m3_fragments(uint32_t (&p)[kSteps][4], const float (&sc)[4 * kSteps][4],
                                                    const float (&row)[2]) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const float(&s0)[4] = sc[4 * kk], (&s1)[4] = sc[4 * kk + 1];
    const float(&s2)[4] = sc[4 * kk + 2], (&s3)[4] = sc[4 * kk + 3];
    p[kk][0] = pack4_e4m3(s0[0] * row[0], s0[1] * row[0], s1[0] * row[0], s1[1] * row[0]); // row g, columns 4 t ..
    p[kk][1] = pack4_e4m3(s0[2] * row[1], s0[3] * row[1], s1[2] * row[1], s1[3] * row[1]); // row g + 8
    p[kk][2] = pack4_e4m3(s2[0] * row[0], s2[1] * row[0], s3[0] * row[0], s3[1] * row[0]); // row g, columns 16 + 4 t ..
    p[kk][3] = pack4_e4m3(s2[2] * row[1], s2[3] * row[1], s3[2] * row[1], s3[3] * row[1]);
  }
}
// The same without factors (times 1 is exact, and the compiler drops it).
template <int kSteps>
__device__ __forceinline__ void pack_e4m3_fragments(uint32_t (&p)[kSteps][4], const float (&sc)[4 * kSteps][4]) {
  constexpr float kOnes[2] = {1.f, 1.f};
  pack_e4m3_fragments(p, sc, kOnes);
}

// An FP8 tensor ([batch, token, head, dim]) transposed at `at` by transpose_v_fp8, enqueued:
// [batch][head][dim][tokens rounded to 32] (its `tokens` a row).
struct Fp8Transposed {
  TensorRef ref;
  int64_t tokens;
};
template <int D>
Fp8Transposed transpose_fp8(const TensorRef& src, uint8_t* at, int64_t seqlen, int32_t heads, int32_t batch,
                            cudaStream_t stream, const char* what) {
  const int64_t tokens = v_fp8_keys(seqlen);
  const dim3 grid(unsigned((tokens + 63) / 64), unsigned(heads), unsigned(batch));
  transpose_v_fp8<D><<<grid, D, 0, stream>>>(src, at, int32_t(seqlen), tokens);
  check_launch(what);
  TensorRef t;
  t.data = at;
  t.token_stride = tokens;
  t.head_stride = int64_t(D) * tokens;
  t.batch_stride = int64_t(heads) * D * tokens;
  return {t, tokens};
}

} // namespace attncore::cuda::sm90
