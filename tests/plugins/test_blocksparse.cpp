// blocksparse through the host's runtime: every pattern at world sizes 1 to 4 on the CPU against
// the float64 reference (and on GPUs, label gpu); pair counts against brute-force definitions of
// the patterns; per-head and shared masks, GQA, partial last blocks, ranks without blocks, rows
// without keys; K/V that travels only to the ranks that attend it; mask files and their errors.
#include "harness.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

using attnhost::DeviceKind;
using test::run_on;

namespace {

struct Spec {
  std::string pattern = "local";
  int64_t block = 64, window = 1, stride = 3, dilation = 2, global = 1, random = 2, sink = 1, seed = 7;
  bool per_head = false;
  std::string mask_file;
};

struct Shape {
  int64_t seqlen = 500;  // 7 blocks of 64 and one of 52
  int32_t heads = 4, kv_heads = 2, head_dim = 32;
  bool causal = true;
  int64_t window_left = -1, window_right = -1;
};

attnhost::suite::Case bs_case(const Spec& s, std::vector<int> world_sizes, const Shape& shape = {}) {
  attnhost::suite::Case c = test::dense_case("blocksparse", std::move(world_sizes), shape.seqlen, shape.heads,
                                             shape.kv_heads, shape.head_dim, shape.causal);
  c.id = "blocksparse/" + s.pattern;
  c.problem.window_left = shape.window_left;
  c.problem.window_right = shape.window_right;
  c.params["pattern"] = s.pattern;
  c.params["block_size"] = s.block;
  c.params["window_blocks"] = s.window;
  c.params["stride_blocks"] = s.stride;
  c.params["dilation"] = s.dilation;
  c.params["global_blocks"] = s.global;
  c.params["random_blocks"] = s.random;
  c.params["sink_blocks"] = s.sink;
  c.params["seed"] = s.seed;
  c.params["per_head"] = s.per_head;
  c.params["mask_file"] = s.mask_file;
  return c;
}

int64_t mod(int64_t a, int64_t m) { return ((a % m) + m) % m; }

// The patterns as README.md defines them, block by block (bigbird's random blocks aside).
bool keeps(const Spec& s, int32_t h, int64_t i, int64_t j) {
  if (s.pattern == "dilated") {
    const int64_t c = i - (s.per_head ? h % s.dilation : 0);
    return mod(c - j, s.dilation) == 0 && std::llabs(c - j) <= s.window * s.dilation;
  }
  if (std::llabs(i - j) <= s.window) return true;
  if (s.pattern == "strided") return mod(i - (s.per_head ? h % s.stride : 0) - j, s.stride) == 0;
  if (s.pattern == "global_local" || s.pattern == "bigbird") return j < s.global || i < s.global;
  if (s.pattern == "streaming") return j < s.sink;
  return false;
}

bool visible(const Shape& s, int64_t q, int64_t k) {
  return (!s.causal || k <= q) && (s.window_left < 0 || k >= q - s.window_left) &&
         (s.window_right < 0 || k <= q + s.window_right);
}

// Visible pairs of the whole problem (batch 2, every query head), by brute force.
template <class Keep>
int64_t brute_force_pairs(const Shape& s, int64_t block, Keep keep) {
  int64_t n = 0;
  for (int32_t h = 0; h < s.heads; ++h)
    for (int64_t q = 0; q < s.seqlen; ++q)
      for (int64_t k = 0; k < s.seqlen; ++k) n += visible(s, q, k) && keep(h, q / block, k / block);
  return 2 * n;
}

int64_t brute_force_pairs(const Spec& spec, const Shape& s) {
  return brute_force_pairs(s, spec.block, [&](int32_t h, int64_t i, int64_t j) { return keeps(spec, h, i, j); });
}



// A mask file in the temporary folder, removed with the object.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& text)
      : path_((std::filesystem::temp_directory_path() / ("attnhost_blocksparse_" + std::to_string(::getpid()) + "_" + name))
                  .string()) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A mask file of `heads` masks over a square of `blocks` blocks, kept where keep(h, i, j).
template <class Keep>
std::string mask_text(int64_t block, int64_t blocks, int32_t heads, Keep keep) {
  std::string t = "# written by test_blocksparse.cpp\nattnhost-block-mask 1\nblock_size " + std::to_string(block) +
                  "\nblocks " + std::to_string(blocks) + " " + std::to_string(blocks) + "\nheads " +
                  std::to_string(heads) + "\n";
  for (int32_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < blocks; ++i) {
      for (int64_t j = 0; j < blocks; ++j) t += keep(h, i, j) ? '1' : '0';
      t += i == 0 ? "   # query block 0\n" : "\n";
    }
  return t;
}

}  // namespace

TEST_CASE("blocksparse: every pattern at world sizes 1 to 4, causal and full, with exact pair counts") {
  for (const char* pattern : {"local", "strided", "dilated", "global_local", "streaming", "bigbird"})
    for (bool causal : {true, false}) {
      Spec spec;
      spec.pattern = pattern;
      Shape shape;
      shape.causal = causal;
      attnhost::CaseResult r = run_on(DeviceKind::cpu, bs_case(spec, {1, 2, 3, 4}, shape));
      INFO(std::string(pattern), std::string(causal ? " causal" : " full"));
      test::all_pass(r);
      test::error_does_not_grow(r);
      const int64_t definition = brute_force_pairs(spec, shape);
      if (spec.pattern != "bigbird") {
        CHECK(r.runs[0].total_pairs == definition);
      } else {  // global_local plus random blocks: more pairs, fewer than dense
        CHECK(r.runs[0].total_pairs > definition);
        CHECK(r.runs[0].total_pairs < brute_force_pairs(shape, 64, [](int32_t, int64_t, int64_t) { return true; }));
      }
    }
}

TEST_CASE("blocksparse: per-head masks follow each head's offset, shared masks serve every head, GQA and MQA") {
  for (const char* pattern : {"strided", "dilated"}) {
    Spec spec;
    spec.pattern = pattern;
    spec.per_head = true;
    Shape shape;
    shape.seqlen = 600;
    attnhost::CaseResult r = run_on(DeviceKind::cpu, bs_case(spec, {1, 2, 4}, shape));
    test::all_pass(r);
    CHECK(r.runs[0].total_pairs == brute_force_pairs(spec, shape));
    spec.per_head = false;
    CHECK(r.runs[0].total_pairs != brute_force_pairs(spec, shape));  // the offsets change the mask
  }
  // bigbird draws each head's random blocks apart; 8 query heads on 2 and on 1 key/value heads.
  for (int32_t kv_heads : {2, 1}) {
    Spec spec;
    spec.pattern = "bigbird";
    spec.per_head = true;
    spec.global = 0;
    Shape shape;
    shape.seqlen = 333;
    shape.heads = 8;
    shape.kv_heads = kv_heads;
    attnhost::CaseResult per_head = run_on(DeviceKind::cpu, bs_case(spec, {1, 2, 3, 4}, shape));
    test::all_pass(per_head);
    test::error_does_not_grow(per_head);
    spec.per_head = false;
    attnhost::CaseResult shared = run_on(DeviceKind::cpu, bs_case(spec, {1, 3}, shape));
    test::all_pass(shared);
  }
}

TEST_CASE("blocksparse: partial last blocks, fewer blocks than ranks, block size 128, token windows on top") {
  Spec spec;
  spec.pattern = "streaming";
  Shape tiny;
  tiny.seqlen = 100;  // two blocks of 64: at world size 3 and 4 some ranks hold nothing
  attnhost::CaseResult r = run_on(DeviceKind::cpu, bs_case(spec, {1, 2, 3, 4}, tiny));
  test::all_pass(r);
  CHECK(r.runs[0].total_pairs == brute_force_pairs(spec, tiny));

  spec.pattern = "local";
  spec.block = 128;
  Shape two;
  two.seqlen = 130;  // a block of 128 and one of 2
  two.causal = false;
  test::all_pass(run_on(DeviceKind::cpu, bs_case(spec, {1, 2, 3}, two)));

  // The suite's long causal window in small: a window of tokens as a local pattern of 128-blocks. The
  // pattern keeps every block the window touches, so it computes exactly the window's pairs.
  spec.window = 2;
  Shape window;
  window.seqlen = 1000;
  window.window_left = 200;
  window.window_right = 0;
  attnhost::CaseResult w = run_on(DeviceKind::cpu, bs_case(spec, {1, 2, 4}, window));
  test::all_pass(w);
  // A window on both sides of full attention, cutting through global_local's blocks.
  Spec both;
  both.pattern = "global_local";
  Shape sides;
  sides.causal = false;
  sides.window_left = 70;
  sides.window_right = 30;
  attnhost::CaseResult b = run_on(DeviceKind::cpu, bs_case(both, {1, 3}, sides));
  test::all_pass(b);
  CHECK(b.runs[0].total_pairs == brute_force_pairs(both, sides));

  auto ring = test::dense_case("ring", {1}, 1000, 4, 2, 32, true);
  ring.problem.window_left = 200;
  ring.problem.window_right = 0;
  attnhost::CaseResult dense = run_on(DeviceKind::cpu, ring);
  REQUIRE(dense.runs[0].status == "PASSED");
  CHECK(w.runs[0].total_pairs == dense.runs[0].total_pairs);
}

TEST_CASE("blocksparse: rows that attend no key give O = 0, LSE = -inf and no gradients") {
  // Dilated with per-head offsets: head 1's first query block would attend blocks -1, -3, ...
  Spec spec;
  spec.pattern = "dilated";
  spec.per_head = true;
  Shape shape;
  shape.seqlen = 400;
  int64_t empty_rows = 0;
  for (int64_t i = 0; i < 7; ++i) {
    bool any = false;
    for (int64_t j = 0; j <= i; ++j) any = any || keeps(spec, 1, i, j);
    empty_rows += !any;
  }
  REQUIRE(empty_rows > 0);
  test::all_pass(run_on(DeviceKind::cpu, bs_case(spec, {1, 2, 3, 4}, shape)));

  // A mask file whose second head attends nothing at all, and whose other heads skip some rows.
  const auto keep = [](int32_t h, int64_t i, int64_t j) { return h != 1 && i % 3 != 1 && (i + j + h) % 2 == 0; };
  TempFile file("empty_rows.txt", mask_text(64, 7, 4, keep));
  spec = Spec{};
  spec.pattern = "explicit";
  spec.mask_file = file.path();
  attnhost::CaseResult r = run_on(DeviceKind::cpu, bs_case(spec, {1, 2, 3, 4}, shape));
  test::all_pass(r);
  CHECK(r.runs[0].total_pairs == brute_force_pairs(shape, 64, keep));
  auto one_stream = bs_case(spec, {3}, shape);  // transfers on the compute stream
  one_stream.params["overlap"] = false;
  test::all_pass(run_on(DeviceKind::cpu, one_stream));
}

TEST_CASE("blocksparse: K/V travels only to ranks that attend it, and rounds that bring nothing are skipped") {
  // 16 blocks of 64 on 4 ranks, a local window of one block: rank r needs only the last block of
  // rank r - 1 (causal), or the edge blocks of both neighbours (full).
  Spec spec;
  Shape shape;
  shape.seqlen = 1024;
  const uint64_t kv_block = 2 * 64 * 2 * 32 * 2;   // batch x tokens x kv heads x dim x bf16
  const uint64_t grad_block = 2 * 64 * 2 * 32 * 4;  // the same in fp32
  attnhost::CaseResult causal = run_on(DeviceKind::cpu, bs_case(spec, {4}, shape));
  test::all_pass(causal);
  const auto& run = causal.runs[0];
  REQUIRE(run.sent_bytes_fwd.size() == 4);
  for (int r = 0; r < 4; ++r) {
    INFO("rank ", r);
    CHECK(run.sent_bytes_fwd[r] == (r < 3 ? 2 * kv_block : 0));                          // K and V of one block
    CHECK(run.sent_bytes_bwd[r] == (r < 3 ? 2 * kv_block : 0) + (r > 0 ? 2 * grad_block : 0));  // and dK dV home
  }
  // Only round 1 moves anything: every rank exchanges K/V in it in the forward and the backward,
  // and dK/dV once, and takes part in no other round.
  for (int r = 0; r < 4; ++r) {
    int kv = 0, grads = 0, others = 0;
    for (const auto& e : run.trace) {
      if (e.rank != r || e.category != "communication") continue;
      (e.name == "K V round 1" ? kv : e.name == "dK dV round 1" ? grads : others)++;
    }
    INFO("rank ", r);
    CHECK(kv == 2);
    CHECK(grads == 1);
    CHECK(others == 0);
  }
  // The dense ring without a mask sends every rank's whole shard three times.
  attnhost::CaseResult ring = run_on(DeviceKind::cpu, test::dense_case("ring", {4}, 1024, 4, 2, 32, false));
  REQUIRE(ring.runs[0].status == "PASSED");
  for (int r = 0; r < 4; ++r) {
    CHECK(ring.runs[0].sent_bytes_fwd[r] == 3 * 4 * 2 * kv_block);
    CHECK(run.sent_bytes_fwd[r] * 4 < ring.runs[0].sent_bytes_fwd[r]);
  }

  shape.causal = false;
  attnhost::CaseResult full = run_on(DeviceKind::cpu, bs_case(spec, {4}, shape));
  test::all_pass(full);
  for (int r = 0; r < 4; ++r) CHECK(full.runs[0].sent_bytes_fwd[r] == (r == 0 || r == 3 ? 2 : 4) * kv_block);
}

TEST_CASE("blocksparse: explicit mask files, per head or shared, and larger than the problem") {
  Shape shape;
  shape.seqlen = 1000;  // 16 blocks of 64; the files have 20, of which the top-left 16 x 16 serve
  const auto per_head = [](int32_t h, int64_t i, int64_t j) { return (i * 7 + j * 3 + h) % 5 < 2 || i == j; };
  TempFile heads("per_head.txt", mask_text(64, 20, 4, per_head));
  Spec spec;
  spec.pattern = "explicit";
  spec.mask_file = heads.path();
  attnhost::CaseResult r = run_on(DeviceKind::cpu, bs_case(spec, {1, 2, 3, 4}, shape));
  test::all_pass(r);
  test::error_does_not_grow(r);
  CHECK(r.runs[0].total_pairs == brute_force_pairs(shape, 64, per_head));

  const auto shared = [](int32_t, int64_t i, int64_t j) { return j == 0 || j + 2 >= i; };
  TempFile one("shared.txt", mask_text(64, 20, 1, shared));
  spec.mask_file = one.path();
  shape.causal = false;
  attnhost::CaseResult s = run_on(DeviceKind::cpu, bs_case(spec, {1, 2}, shape));
  test::all_pass(s);
  CHECK(s.runs[0].total_pairs == brute_force_pairs(shape, 64, shared));
}

TEST_CASE("blocksparse: a bad mask file or parameter fails the run with one line that says where") {
  const std::string header = "attnhost-block-mask 1\nblock_size 64\nblocks 2 2\nheads 1\n";
  struct Bad {
    std::string text, error;  // error after "create: PATH"
  };
  const Bad cases[] = {
      {"", ": empty: expected 'attnhost-block-mask 1'"},
      {"# a comment\nattnhost-block-mask 2\n", ":2: expected 'attnhost-block-mask 1' (the format line), got 'attnhost-block-mask 2'"},
      {"attnhost-block-mask 1\nblok_size 64\n", ":2: unknown header 'blok_size' (expected block_size, blocks or heads)"},
      {"attnhost-block-mask 1\nblock_size 96\n", ":2: 'block_size' must be 64 or 128, got 96"},
      {"attnhost-block-mask 1\nblocks 2 x\n", ":2: 'blocks' must be a positive integer, got 'x'"},
      {"attnhost-block-mask 1\nblock_size 64\nblocks 2 2\n10\n", ":4: a row before the header is complete (missing 'heads')"},
      {header + "10\n1x\n", ":6:2: expected '0' or '1', got 'x'"},
      {header + "10\n101\n", ":6: row has 3 key blocks, expected 2"},
      {header + "10\n", ": 1 rows, expected 2 (heads 1 x query blocks 2)"},
      {header + "10\n11\n11\n", ":7: more rows than heads x query blocks (2)"},
      {header + "10\nheads 2\n11\n", ":6:1: expected '0' or '1', got 'h'"},
      {"attnhost-block-mask 1\nblock_size 128\nblocks 2 2\nheads 1\n10\n11\n", "' has block_size 128, the case 64"},
      {"attnhost-block-mask 1\nblock_size 64\nblocks 1 1\nheads 1\n1\n", "' has 1 x 1 blocks; sequence length 100 needs 2 x 2"},
      {"attnhost-block-mask 1\nblock_size 64\nblocks 2 2\nheads 3\n10\n11\n10\n11\n10\n11\n",
       "' has 3 heads; the problem has 4 query heads (a mask has 1 or one per query head)"},
  };
  Shape shape;
  shape.seqlen = 100;
  int n = 0;
  for (const Bad& b : cases) {
    TempFile file("bad" + std::to_string(n++) + ".txt", b.text);
    Spec spec;
    spec.pattern = "explicit";
    spec.mask_file = file.path();
    attnhost::CaseResult r = run_on(DeviceKind::cpu, bs_case(spec, {1}, shape));
    const std::string expected = b.error[0] == '\''
                                     ? "create: mask file '" + file.path() + b.error
                                     : "create: " + file.path() + b.error;
    CHECK(r.runs[0].status == "ERROR");
    CHECK(r.runs[0].error == expected);
    CHECK(r.runs[0].error.find('\n') == std::string::npos);
  }
  Spec missing;
  missing.pattern = "explicit";
  missing.mask_file = "/nonexistent/mask.txt";
  CHECK(run_on(DeviceKind::cpu, bs_case(missing, {1}, shape)).runs[0].error ==
        "create: mask file '/nonexistent/mask.txt': cannot open (No such file or directory)");
  missing.mask_file = "";
  CHECK(run_on(DeviceKind::cpu, bs_case(missing, {2}, shape)).runs[0].error ==
        "rank 0: create: pattern 'explicit' needs mask_file, a block mask file (plugins/blocksparse/README.md)");
  Spec bad_block;
  bad_block.block = 96;
  CHECK(run_on(DeviceKind::cpu, bs_case(bad_block, {1}, shape)).runs[0].error ==
        "create: block_size must be 64 or 128, got 96");
  Spec bad_stride;
  bad_stride.pattern = "strided";
  bad_stride.stride = 0;
  CHECK(run_on(DeviceKind::cpu, bs_case(bad_stride, {1}, shape)).runs[0].error ==
        "create: stride_blocks must be in [1, 2^31], got 0");
}

#if ATTNHOST_HAVE_CUDA
TEST_CASE("gpu: blocksparse on the GPUs against the float64 reference" * doctest::test_suite("gpu")) {
  const int gpus = attnhost::cuda_device_count();
  REQUIRE_MESSAGE(gpus > 0, "no GPU visible");
  std::vector<int> sizes = {1};
  if (gpus > 1) sizes.push_back(2);
  Shape shape;
  shape.seqlen = 1000;
  shape.heads = 8;
  shape.kv_heads = 2;
  shape.head_dim = 128;
  for (const char* pattern : {"local", "strided", "dilated", "global_local", "streaming", "bigbird"})
    for (int64_t block : {64, 128})
      for (bool causal : {true, false}) {
        Spec spec;
        spec.pattern = pattern;
        spec.block = block;
        spec.per_head = block == 64;
        shape.causal = causal;
        INFO(std::string(pattern), " block ", block, std::string(causal ? " causal" : " full"));
        attnhost::CaseResult r = run_on(DeviceKind::cuda, bs_case(spec, sizes, shape));
        test::all_pass(r);
        test::error_does_not_grow(r);
        if (spec.pattern != "bigbird") CHECK(r.runs[0].total_pairs == brute_force_pairs(spec, shape));
      }
  // Rows without keys, a token window, fp16, head dim 64.
  Spec dilated;
  dilated.pattern = "dilated";
  dilated.per_head = true;
  shape.causal = true;
  test::all_pass(run_on(DeviceKind::cuda, bs_case(dilated, sizes, shape)));
  Spec local;
  local.block = 128;
  local.window = 2;
  shape.window_left = 200;
  shape.window_right = 0;
  auto windowed = bs_case(local, sizes, shape);
  windowed.problem.dtype = "fp16";
  windowed.problem.head_dim = 64;
  test::all_pass(run_on(DeviceKind::cuda, windowed));
}
#endif
