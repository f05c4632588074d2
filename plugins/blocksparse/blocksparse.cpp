// blocksparse: block-sparse attention with named patterns (docs/VARIANTS.md; README.md here).
//
// The mask (pattern.h) is built once per shape on the host and shared by the ranks; each rank
// turns its rows into block lists for the core (routes.h), uploads them once, and runs them on
// the routed schedule (attncore/plugin/routed.h): contiguous block-aligned shards, and a K/V
// block moves only to a rank whose queries attend it, straight from its owner.
#include "list_store.h"
#include "pattern.h"
#include "routes.h"

#include "attncore/plugin/ring_plugin.h"
#include "attncore/plugin/routed.h"

#include <chrono>
#include <cstdio>
#include <memory>

namespace {

using attncore::plugin::BlockCall;
using attncore::plugin::DenseMask;
using attncore::plugin::Interval;
using blocksparse::BlockMask;
using blocksparse::Pattern;
using blocksparse::Sharding;

constexpr attnhost_param_spec param(const char* name, int32_t type, const char* default_value, const char* help,
                                    const char* choices = nullptr) {
  return {ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), name, type, default_value, help, choices};
}

constexpr attnhost_param_spec kParams[] = {
    param("pattern", ATTNHOST_PARAM_STRING, "\"local\"", "which key blocks each query block attends (README.md)",
          "local|strided|dilated|global_local|bigbird|streaming|explicit"),
    param("block_size", ATTNHOST_PARAM_INT, "128", "tokens per block: 64 or 128"),
    param("window_blocks", ATTNHOST_PARAM_INT, "4",
          "blocks on each side of the diagonal (local part of every pattern; dilated: steps of `dilation`)"),
    param("stride_blocks", ATTNHOST_PARAM_INT, "4", "strided: also every stride-th block before (and after) the diagonal"),
    param("dilation", ATTNHOST_PARAM_INT, "2", "dilated: distance in blocks between attended blocks"),
    param("global_blocks", ATTNHOST_PARAM_INT, "1", "global_local, bigbird: leading blocks that attend and are attended by all"),
    param("random_blocks", ATTNHOST_PARAM_INT, "2", "bigbird: random key blocks per query block"),
    param("sink_blocks", ATTNHOST_PARAM_INT, "1", "streaming: leading blocks that every query attends"),
    param("seed", ATTNHOST_PARAM_INT, "0", "bigbird: seed of the random blocks"),
    param("per_head", ATTNHOST_PARAM_BOOL, "false",
          "a mask per query head (bigbird draws per head; strided and dilated offset head h by h mod stride)"),
    param("mask_file", ATTNHOST_PARAM_PATH, "\"\"",
          "explicit: block mask file (format: plugins/blocksparse/README.md), relative to the file that names it"),
    attncore::plugin::ring_param("overlap"),
    attncore::plugin::ring_param("cpu_accumulate"),
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

class BlockSparse {
 public:
  static const attnhost_plugin_info& info() {
    static const attnhost_plugin_info info = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params),
        "blocksparse",
        "1.0.0",
        "block-sparse attention: named block patterns or a mask file, per head or shared; K/V blocks go only "
        "to the ranks that attend them",
        {ATTNHOST_STRUCT_SIZE(attnhost_capabilities, head_dims), attncore::plugin::kRingDevices,
         attncore::plugin::kRingDtypes,
         ATTNHOST_FEATURE_CAUSAL | ATTNHOST_FEATURE_NONCAUSAL | ATTNHOST_FEATURE_WINDOW | ATTNHOST_FEATURE_GQA |
             ATTNHOST_FEATURE_BACKWARD | ATTNHOST_FEATURE_DETERMINISTIC,
         1, 0, 0, nullptr},
        static_cast<int32_t>(std::size(kParams)),
        kParams,
    };
    return info;
  }

  // What the plugin cannot run (packed or cross attention, a dtype or head dim the core lacks) is
  // refused here, and the run is UNSUPPORTED. A bad parameter or mask file is the suite's mistake:
  // it fails create instead, so the run FAILS, with one line saying what and where.
  static void validate(const attnhost::Problem& p) { attncore::plugin::validate_dense(p); }

  BlockSparse(const attnhost::Problem& p, attnhost::Host host)
      : problem_(p), pattern_(Pattern::from(p)), dense_(attncore::plugin::dense_mask(p)) {
    const auto t0 = std::chrono::steady_clock::now();
    const blocksparse::SharedMask shared = blocksparse::shared_mask(pattern_, p->seqlen_q, p->heads_q, dense_);
    mask_ = shared.mask;
    const int rank = p->rank, world = p->world_size;
    shard_ = {p->seqlen_q, mask_->block, mask_->blocks, world};
    layout_.add(shard_.first_token(rank), shard_.tokens(rank));
    layout_.pad(shard_.local_tokens() - shard_.tokens(rank));

    // This rank's calls, one per source rank whose keys its queries attend.
    std::vector<attncore::BlockListData> lists;
    std::vector<std::pair<int, int32_t>> made;  // (source, first query block)
    for (int source = 0; source < world; ++source) {
      blocksparse::CallList c = blocksparse::call_list(*mask_, shard_, rank, source);
      if (c.empty()) continue;
      made.emplace_back(source, c.first_q_block);
      lists.push_back(std::move(c.list));
    }
    lists_ = blocksparse::ListStore(std::move(lists), p->device_type == ATTNHOST_DEVICE_CUDA, host);
    calls_.resize(world);
    for (size_t i = 0; i < made.size(); ++i) {
      const auto [source, first_q] = made[i];
      const attncore::BlockList* list = lists_.get(i);
      BlockCall c;
      c.q_begin = mask_->first_token(first_q) - shard_.first_token(rank);
      c.q_end = std::min(mask_->first_token(first_q + list->num_q_blocks), shard_.first_token(rank + 1)) -
                shard_.first_token(rank);
      c.kv_begin = 0;
      c.kv_end = shard_.tokens(source);
      c.q_pos0 = mask_->first_token(first_q);
      c.kv_pos0 = shard_.first_token(source);
      c.masked = true;  // the list's per-block flags say which blocks take the element mask
      c.blocks = list;
      calls_[source].push_back(c);
    }
    attncore::plugin::RoutedPlan plan;
    plan.calls = [this](int, int source) { return calls_[source]; };
    plan.reads = [this](int r, int source) { return blocksparse::reads(*mask_, shard_, r, source); };
    attention_ = std::make_unique<attncore::plugin::RoutedAttention>(shape(p), plan,
                                                                      attncore::plugin::schedule_options(p, host));
    count_pairs_of_rank(rank);
    if (rank == 0) host.log(ATTNHOST_LOG_INFO, summary(shared, ms_since(t0)));
  }

  attnhost_layout layout(int32_t) { return layout_.view(); }
  void forward(const attnhost_forward_args& a) { attention_->forward(a); }
  void backward(const attnhost_backward_args& a) { attention_->backward(a); }
  attnhost::PairCount count_pairs() { return pairs_; }

  attnhost_span_list enumerate_keys(int64_t, int32_t h, int64_t q) {
    spans_.clear();
    const Interval visible = dense_.keys_of(q);
    int64_t lo = 0, hi = 0;  // the span being built: adjacent blocks join it
    for (int32_t kb : mask_->keys(mask_->heads == 1 ? 0 : h, static_cast<int32_t>(q / mask_->block))) {
      const int64_t b = std::max(mask_->first_token(kb), visible.lo), e = std::min(mask_->end_token(kb), visible.hi);
      if (e <= b) continue;
      if (b != hi) {
        spans_.add(lo, hi);
        lo = b;
      }
      hi = e;
    }
    spans_.add(lo, hi);
    return spans_.view();
  }

  attnhost_span_list enumerate_queries(int64_t, int32_t kv_head, int64_t k) {
    spans_.clear();
    const Interval visible = dense_.queries_of(k);
    const int32_t kb = static_cast<int32_t>(k / mask_->block), group = problem_->heads_q / problem_->heads_kv;
    for (int32_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
      int64_t lo = 0, hi = 0;
      for (int32_t qb = 0; qb < mask_->blocks; ++qb) {
        if (!mask_->has(mask_->heads == 1 ? 0 : h, qb, kb)) continue;
        const int64_t b = std::max(mask_->first_token(qb), visible.lo), e = std::min(mask_->end_token(qb), visible.hi);
        if (e <= b) continue;
        if (b != hi) {
          spans_.add(lo, hi, 1, h);
          lo = b;
        }
        hi = e;
      }
      spans_.add(lo, hi, 1, h);
    }
    return spans_.view();
  }

 private:
  attncore::plugin::RingShape shape(const attnhost::Problem& p) const {
    attncore::plugin::RingShape s;
    s.dtype = p->dtype;
    s.batch = static_cast<int32_t>(p->batch);
    s.heads_q = p->heads_q;
    s.heads_kv = p->heads_kv;
    s.head_dim = p->head_dim;
    s.local_q = s.local_kv = shard_.local_tokens();
    s.softmax_scale = static_cast<float>(p->softmax_scale);
    s.mask = dense_;
    s.deterministic = p->deterministic != 0;
    return s;
  }

  // Pairs with multiplicity 1, every batch entry and query head: this rank's rows and all rows.
  void count_pairs_of_rank(int rank) {
    const int64_t per_mask_head = mask_->heads == 1 ? problem_->heads_q : 1;
    const int32_t q0 = shard_.first_block(rank), q1 = shard_.first_block(rank + 1);
    for (int32_t h = 0; h < mask_->heads; ++h)
      for (int32_t qb = 0; qb < mask_->blocks; ++qb) {
        const int64_t n = mask_->row_pairs[mask_->row(h, qb)] * per_mask_head * problem_->batch;
        pairs_.total_pairs += n;
        if (qb >= q0 && qb < q1) pairs_.rank_pairs += n;
      }
  }

  // One line with every result: the pattern, its density, what the mask cost, what travels.
  std::string summary(const blocksparse::SharedMask& shared, double setup_ms) const {
    const BlockMask& m = *mask_;
    std::string s = "blocksparse: " + pattern_.describe() + ", block " + std::to_string(m.block) + ", " +
                    (m.heads == 1 ? "shared by " + std::to_string(problem_->heads_q) + " heads"
                                  : "one mask per head (" + std::to_string(m.heads) + ")") +
                    ": " + std::to_string(m.blocks) + " x " + std::to_string(m.blocks) + " blocks, " +
                    std::to_string(m.kept()) + " kept: density " + fixed(m.density(), 4) + " of the grid";
    if (dense_.causal || dense_.window_left >= 0 || dense_.window_right >= 0)
      s += ", " + fixed(m.density_of_visible(), 4) + " of the " + std::to_string(m.visible) + " blocks per head the " +
           (dense_.causal ? "causal" : "window") + " mask leaves";
    s += "; mask built in " + fixed(shared.build_ms, 3) + " ms" + (shared.cached ? " (cached)" : "") +
         ", rank 0 set up in " + fixed(setup_ms, 3) + " ms";
    const int world = shard_.world;
    if (world > 1) {
      int pairs = 0;
      int64_t moved = 0;
      for (int r = 0; r < world; ++r)
        for (int src = 0; src < world; ++src) {
          if (src == r) continue;
          int64_t blocks = 0;
          for (const auto& run : blocksparse::reads(m, shard_, r, src)) blocks += (run.length + m.block - 1) / m.block;
          pairs += blocks > 0;
          moved += blocks;
        }
      s += "; " + std::to_string(pairs) + " of " + std::to_string(world * (world - 1)) + " rank pairs exchange K/V, " +
           std::to_string(moved) + " key blocks travel (a ring moves " + std::to_string(int64_t{world - 1} * m.blocks) + ")";
    }
    return s;
  }

  attnhost::Problem problem_;
  Pattern pattern_;
  DenseMask dense_;
  std::shared_ptr<const BlockMask> mask_;
  Sharding shard_;
  attnhost::Layout layout_;
  blocksparse::ListStore lists_;
  std::vector<std::vector<BlockCall>> calls_;  // [source]
  std::unique_ptr<attncore::plugin::RoutedAttention> attention_;
  attnhost::PairCount pairs_;
  attnhost::SpanList spans_;
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(BlockSparse)
