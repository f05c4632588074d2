#include "pattern.h"

#include <chrono>
#include <filesystem>
#include <list>
#include <mutex>
#include <sstream>
#include <utility>

namespace blocksparse {

using attncore::plugin::DenseMask;
using attncore::plugin::Interval;

namespace {

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }
int64_t mod(int64_t a, int64_t m) { return ((a % m) + m) % m; }

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool varies_by_head(const Pattern& p, const MaskFile* file) {
  if (p.name == "explicit") return file && file->heads > 1;
  return p.per_head && (p.name == "bigbird" || p.name == "strided" || p.name == "dilated");
}

// A uniform draw in [0, n) from 64 random bits (Lemire's multiply-shift: no division).
uint64_t below(uint64_t bits, uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * n) >> 64); }

// The key blocks one row of the pattern keeps among [lo, hi) (the blocks the problem's own mask
// leaves that row): ascending, without duplicates, in O(blocks kept) (explicit: O(hi - lo)).
class RowBuilder {
 public:
  RowBuilder(const Pattern& p, const MaskFile* file, int32_t blocks)
      : p_(p), file_(file), kind_(kind_of(p.name)), taken_((static_cast<size_t>(blocks) + 63) / 64, 0) {}

  void build(int32_t head, int64_t i, int64_t lo, int64_t hi, std::vector<int32_t>& out) {
    out.clear();
    if (hi <= lo) return;
    if (kind_ == Kind::explicit_file) {
      const int32_t fh = file_->heads == 1 ? 0 : head;
      for (int64_t j = lo; j < hi; ++j)
        if (file_->kept(fh, static_cast<int32_t>(i), static_cast<int32_t>(j))) out.push_back(static_cast<int32_t>(j));
      return;
    }
    if (kind_ == Kind::dilated) {  // j = c + t * r for |t| <= window, in [lo, hi): already ascending
      const int64_t r = p_.dilation, c = i - (p_.per_head ? head % r : 0);
      const int64_t t0 = std::max(-p_.window, ceil_div(lo - c, r)), t1 = std::min(p_.window, floor_div(hi - 1 - c, r));
      for (int64_t t = t0; t <= t1; ++t) out.push_back(static_cast<int32_t>(c + t * r));
      return;
    }
    auto range = [&](int64_t a, int64_t b) {
      for (int64_t j = std::max(a, lo); j < std::min(b, hi); ++j) take(j, out);
    };
    range(i - p_.window, i + p_.window + 1);
    if (kind_ == Kind::strided) {
      const int64_t s = p_.stride, phase = mod(i - (p_.per_head ? head % s : 0), s);
      for (int64_t j = lo + mod(phase - lo, s); j < hi; j += s) take(j, out);
    } else if (kind_ == Kind::global_local || kind_ == Kind::bigbird) {
      range(0, p_.global);
      if (i < p_.global) range(lo, hi);
    } else if (kind_ == Kind::streaming) {
      range(0, p_.sink);
    }
    if (kind_ == Kind::bigbird && p_.random > 0) draw_random(head, i, lo, hi, out);
    for (int32_t j : out) taken_[j >> 6] &= ~(uint64_t{1} << (j & 63));
    std::sort(out.begin(), out.end());
  }

 private:
  enum class Kind { local, strided, dilated, global_local, bigbird, streaming, explicit_file };
  static Kind kind_of(const std::string& n) {
    return n == "strided" ? Kind::strided : n == "dilated" ? Kind::dilated : n == "global_local" ? Kind::global_local
         : n == "bigbird" ? Kind::bigbird : n == "streaming" ? Kind::streaming : n == "explicit" ? Kind::explicit_file
                          : Kind::local;
  }
  bool taken(int64_t j) const { return (taken_[j >> 6] >> (j & 63)) & 1; }
  void take(int64_t j, std::vector<int32_t>& out) {
    if (taken(j)) return;
    taken_[j >> 6] |= uint64_t{1} << (j & 63);
    out.push_back(static_cast<int32_t>(j));
  }

  // `random` more blocks of [lo, hi) not kept yet, the same on every rank and device: a
  // splitmix64 stream seeded by (seed, head, row).
  void draw_random(int32_t head, int64_t i, int64_t lo, int64_t hi, std::vector<int32_t>& out) {
    const int64_t span = hi - lo, free = span - static_cast<int64_t>(out.size());
    const int64_t want = std::min(p_.random, free);
    if (want <= 0) return;
    uint64_t state = static_cast<uint64_t>(p_.seed) * 0x9e3779b97f4a7c15ull +
                     static_cast<uint64_t>(p_.per_head ? head : 0) * 0xd1b54a32d192ed03ull +
                     static_cast<uint64_t>(i) * 0x8cb92ba72f3d8dd7ull;
    if (free <= 4 * want) {  // few left: draw without replacement from the list of free blocks
      std::vector<int32_t> candidates;
      for (int64_t j = lo; j < hi; ++j)
        if (!taken(j)) candidates.push_back(static_cast<int32_t>(j));
      for (int64_t k = 0; k < want; ++k) {
        const int64_t pick = k + static_cast<int64_t>(below(splitmix64(state), static_cast<uint64_t>(free - k)));
        std::swap(candidates[k], candidates[pick]);
        take(candidates[k], out);
      }
      return;
    }
    // Many left: draw and reject what is taken (fewer than 4/3 tries per block on average).
    for (int64_t got = 0; got < want;) {
      const int64_t j = lo + static_cast<int64_t>(below(splitmix64(state), static_cast<uint64_t>(span)));
      if (!taken(j)) {
        take(j, out);
        ++got;
      }
    }
  }

  const Pattern& p_;
  const MaskFile* file_;
  Kind kind_;
  std::vector<uint64_t> taken_;  // the blocks of the row being built: a bit each, cleared after
};

}  // namespace

Pattern Pattern::from(const attnhost::Problem& p) {
  using attnhost::fail;
  Pattern out;
  out.name = p.get_string("pattern");
  static const char* const kNames[] = {"local", "strided", "dilated", "global_local", "bigbird", "streaming", "explicit"};
  if (std::find(std::begin(kNames), std::end(kNames), out.name) == std::end(kNames))
    fail(ATTNHOST_ERR_INVALID_ARGUMENT, "unknown pattern '" + out.name +
                                            "' (local, strided, dilated, global_local, bigbird, streaming, explicit)");
  const int64_t block = p.get_int("block_size");
  if (block != 64 && block != 128)
    fail(ATTNHOST_ERR_INVALID_ARGUMENT, "block_size must be 64 or 128, got " + std::to_string(block));
  out.block_size = static_cast<int32_t>(block);
  auto count = [&](const char* name, int64_t least) {
    const int64_t v = p.get_int(name);
    if (v < least || v > (int64_t{1} << 31))
      fail(ATTNHOST_ERR_INVALID_ARGUMENT, std::string(name) + " must be in [" + std::to_string(least) + ", 2^31], got " +
                                              std::to_string(v));
    return v;
  };
  out.window = count("window_blocks", 0);
  out.stride = count("stride_blocks", 1);
  out.dilation = count("dilation", 1);
  out.global = count("global_blocks", 0);
  out.random = count("random_blocks", 0);
  out.sink = count("sink_blocks", 0);
  out.seed = count("seed", 0);
  out.per_head = p.get_bool("per_head");
  out.mask_file = p.get_path("mask_file");
  if (out.name == "explicit" && out.mask_file.empty())
    fail(ATTNHOST_ERR_INVALID_ARGUMENT, "pattern 'explicit' needs mask_file, a block mask file (plugins/blocksparse/README.md)");
  return out;
}

std::string Pattern::describe() const {
  std::ostringstream s;
  s << name << " (";
  if (name == "local") s << "window " << window;
  else if (name == "strided") s << "stride " << stride << ", window " << window;
  else if (name == "dilated") s << "dilation " << dilation << ", window " << window;
  else if (name == "global_local") s << "global " << global << ", window " << window;
  else if (name == "bigbird") s << "global " << global << ", window " << window << ", random " << random << ", seed " << seed;
  else if (name == "streaming") s << "sink " << sink << ", window " << window;
  else s << "mask file " << mask_file;
  if (per_head) s << ", per head";
  s << ")";
  return s.str();
}

BlockMask build_mask(const Pattern& pattern, int64_t seqlen, int32_t heads_q, const DenseMask& dense,
                     const MaskFile* file) {
  BlockMask m;
  m.seqlen = seqlen;
  m.block = pattern.block_size;
  m.blocks = static_cast<int32_t>((seqlen + m.block - 1) / m.block);
  m.heads = pattern.per_head || (file && file->heads > 1) ? heads_q : 1;
  const bool varies = varies_by_head(pattern, file);
  RowBuilder rows(pattern, file, m.blocks);
  m.row_ptr.reserve(static_cast<size_t>(m.heads) * m.blocks + 1);
  m.row_ptr.push_back(0);
  m.row_pairs.reserve(static_cast<size_t>(m.heads) * m.blocks);
  std::vector<int32_t> row;
  for (int32_t h = 0; h < m.heads; ++h) {
    if (h > 0 && !varies) {  // the same rows as head 0
      const int64_t n = m.row_ptr[m.blocks];
      for (int32_t i = 0; i < m.blocks; ++i) {
        m.row_ptr.push_back(m.row_ptr.back() + (m.row_ptr[i + 1] - m.row_ptr[i]));
        m.row_pairs.push_back(m.row_pairs[i]);
      }
      m.col.insert(m.col.end(), m.col.begin(), m.col.begin() + n);
      m.masked.insert(m.masked.end(), m.masked.begin(), m.masked.begin() + n);
      continue;
    }
    for (int32_t i = 0; i < m.blocks; ++i) {
      // The keys the problem's mask leaves rows [q_lo, q_hi) are one interval: its ends never
      // decrease from row to row and move by at most one.
      // So a block of keys is visible in part iff it meets [first.lo, last.hi), and in full iff
      // it lies in both the first row's keys and the last's (DenseMask::block, per row).
      const int64_t q_lo = m.first_token(i), q_hi = m.end_token(i);
      const Interval first = dense.keys_of(q_lo), last = dense.keys_of(q_hi - 1);
      const int64_t lo = first.lo / m.block, hi = last.hi > first.lo ? (last.hi + m.block - 1) / m.block : lo;
      if (h == 0) m.visible += hi - lo;
      rows.build(h, i, lo, hi, row);
      int64_t pairs = 0;
      for (int32_t kb : row) {
        const int64_t kf = m.first_token(kb), kl = m.end_token(kb);
        if (kf >= last.hi || kl <= first.lo) continue;
        const bool full = first.hi >= kl && last.lo <= kf;
        m.col.push_back(kb);
        m.masked.push_back(!full);
        pairs += full ? (q_hi - q_lo) * (kl - kf) : dense.pairs(q_lo, q_hi, kf, kl);
      }
      m.row_ptr.push_back(static_cast<int64_t>(m.col.size()));
      m.row_pairs.push_back(pairs);
    }
  }
  return m;
}

namespace {

// A few recent masks; the mutex also makes the ranks of one run wait for the one that builds.
struct MaskCache {
  struct Entry {
    std::string key;
    std::shared_ptr<const BlockMask> mask;
    double build_ms;
  };
  std::mutex mutex;
  std::list<Entry> entries;  // most recent first
  static constexpr size_t kCapacity = 4;
};

MaskCache& cache() {
  static MaskCache c;
  return c;
}

std::string cache_key(const Pattern& p, int64_t seqlen, int32_t heads_q, const DenseMask& d) {
  std::ostringstream s;
  s << p.name << '|' << p.block_size << '|' << p.window << '|' << p.stride << '|' << p.dilation << '|' << p.global << '|'
    << p.random << '|' << p.sink << '|' << p.seed << '|' << p.per_head << '|' << seqlen << '|' << heads_q << '|'
    << d.causal << '|' << d.window_left << '|' << d.window_right;
  if (p.name == "explicit") {
    std::error_code ec;
    const auto size = std::filesystem::file_size(p.mask_file, ec);
    const auto time = std::filesystem::last_write_time(p.mask_file, ec);
    s << '|' << p.mask_file << '|' << size << '|' << time.time_since_epoch().count();
  }
  return s.str();
}

}  // namespace

SharedMask shared_mask(const Pattern& pattern, int64_t seqlen, int32_t heads_q, const DenseMask& dense) {
  MaskCache& c = cache();
  const std::string key = cache_key(pattern, seqlen, heads_q, dense);
  std::lock_guard lock(c.mutex);
  for (auto it = c.entries.begin(); it != c.entries.end(); ++it)
    if (it->key == key) {
      c.entries.splice(c.entries.begin(), c.entries, it);
      return {it->mask, it->build_ms, true};
    }
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<MaskFile> file;
  if (pattern.name == "explicit") {
    file = std::make_unique<MaskFile>(read_mask_file(pattern.mask_file));
    if (std::string why = mask_file_mismatch(*file, pattern.block_size, seqlen, heads_q); !why.empty())
      attnhost::fail(ATTNHOST_ERR_INVALID_ARGUMENT, why);
  }
  auto mask = std::make_shared<const BlockMask>(build_mask(pattern, seqlen, heads_q, dense, file.get()));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  c.entries.push_front({key, mask, ms});
  if (c.entries.size() > MaskCache::kCapacity) c.entries.pop_back();
  return {mask, ms, false};
}

}  // namespace blocksparse
