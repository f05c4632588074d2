#include "mask_file.h"

#include <attnhost/plugin.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace blocksparse {

namespace {

constexpr const char* kMagic = "attnhost-block-mask";
constexpr int64_t kMaxCells = int64_t{1} << 31;  // heads x blocks x blocks: 2 GiB of mask

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  attnhost::fail(ATTNHOST_ERR_INVALID_ARGUMENT, where + ": " + what);
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// Reads one positive integer from `in` (a header's value), or fails naming `key`.
int64_t positive(std::istringstream& in, const std::string& key, const std::string& where) {
  std::string word;
  if (!(in >> word)) bad(where, "'" + key + "' needs a value");
  int64_t v = 0;
  for (char c : word) {
    if (c < '0' || c > '9' || v > (int64_t{1} << 40)) bad(where, "'" + key + "' must be a positive integer, got '" + word + "'");
    v = v * 10 + (c - '0');
  }
  if (v <= 0) bad(where, "'" + key + "' must be a positive integer, got '" + word + "'");
  return v;
}

}  // namespace

MaskFile read_mask_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) attnhost::fail(ATTNHOST_ERR_INVALID_ARGUMENT, "mask file '" + path + "': cannot open (" + std::strerror(errno) + ")");
  MaskFile m;
  m.path = path;
  bool magic = false;
  int64_t rows = 0, expected_rows = 0;
  std::string raw;
  for (int line = 1; std::getline(in, raw); ++line) {
    const std::string where = path + ":" + std::to_string(line);
    const size_t hash = raw.find('#');
    const std::string text = trim(hash == std::string::npos ? raw : raw.substr(0, hash));
    if (text.empty()) continue;
    std::istringstream words(text);
    std::string key;
    words >> key;
    if (!magic) {
      std::string version;
      words >> version;
      if (key != kMagic || version != "1")
        bad(where, "expected 'attnhost-block-mask 1' (the format line), got '" + text + "'");
      magic = true;
      continue;
    }
    const bool header = rows == 0 && key[0] != '0' && key[0] != '1';  // after the first row, rows only
    if (header) {
      if (key == "block_size") {
        if (m.block_size) bad(where, "'block_size' given twice");
        const int64_t v = positive(words, key, where);
        if (v != 64 && v != 128) bad(where, "'block_size' must be 64 or 128, got " + std::to_string(v));
        m.block_size = static_cast<int32_t>(v);
      } else if (key == "blocks") {
        if (m.q_blocks) bad(where, "'blocks' given twice");
        const int64_t q = positive(words, key, where), k = positive(words, key, where);
        if (q > (int64_t{1} << 30) || k > (int64_t{1} << 30)) bad(where, "'blocks' is too large");
        m.q_blocks = static_cast<int32_t>(q);
        m.kv_blocks = static_cast<int32_t>(k);
      } else if (key == "heads") {
        if (m.heads) bad(where, "'heads' given twice");
        const int64_t h = positive(words, key, where);
        if (h > 65535) bad(where, "'heads' is too large");
        m.heads = static_cast<int32_t>(h);
      } else {
        bad(where, "unknown header '" + key + "' (expected block_size, blocks or heads)");
      }
      std::string extra;
      if (words >> extra) bad(where, "unexpected '" + extra + "' after '" + key + "'");
      continue;
    }
    if (rows == 0) {  // the first row: the header must be complete
      const char* missing = !m.block_size ? "block_size" : !m.q_blocks ? "blocks" : !m.heads ? "heads" : nullptr;
      if (missing) bad(where, std::string("a row before the header is complete (missing '") + missing + "')");
      expected_rows = int64_t{m.heads} * m.q_blocks;
      if (expected_rows * m.kv_blocks > kMaxCells) bad(where, "heads x blocks x blocks is too large");
      m.keep.reserve(static_cast<size_t>(expected_rows * m.kv_blocks));
    }
    if (rows == expected_rows)
      bad(where, "more rows than heads x query blocks (" + std::to_string(expected_rows) + ")");
    int64_t columns = 0;
    for (size_t i = 0; i < raw.size() && (hash == std::string::npos || i < hash); ++i) {
      const char c = raw[i];
      if (c == ' ' || c == '\t' || c == '\r') continue;
      if (c != '0' && c != '1')
        bad(where + ":" + std::to_string(i + 1), std::string("expected '0' or '1', got '") + c + "'");
      if (++columns <= m.kv_blocks) m.keep.push_back(c == '1');
    }
    if (columns != m.kv_blocks)
      bad(where, "row has " + std::to_string(columns) + " key blocks, expected " + std::to_string(m.kv_blocks));
    ++rows;
  }
  if (!magic) bad(path, "empty: expected 'attnhost-block-mask 1'");
  if (rows == 0) {
    const char* missing = !m.block_size ? "block_size" : !m.q_blocks ? "blocks" : !m.heads ? "heads" : nullptr;
    if (missing) bad(path, std::string("missing header '") + missing + "'");
  }
  if (rows != expected_rows || rows == 0)
    bad(path, std::to_string(rows) + " rows, expected " + std::to_string(int64_t{m.heads} * m.q_blocks) + " (heads " +
                  std::to_string(m.heads) + " x query blocks " + std::to_string(m.q_blocks) + ")");
  return m;
}

std::string mask_file_mismatch(const MaskFile& m, int32_t block_size, int64_t seqlen, int32_t heads_q) {
  const std::string who = "mask file '" + m.path + "' ";
  if (m.block_size != block_size)
    return who + "has block_size " + std::to_string(m.block_size) + ", the case " + std::to_string(block_size);
  const int64_t blocks = (seqlen + block_size - 1) / block_size;
  if (m.q_blocks < blocks || m.kv_blocks < blocks)
    return who + "has " + std::to_string(m.q_blocks) + " x " + std::to_string(m.kv_blocks) + " blocks; sequence length " +
           std::to_string(seqlen) + " needs " + std::to_string(blocks) + " x " + std::to_string(blocks);
  if (m.heads != 1 && m.heads != heads_q)
    return who + "has " + std::to_string(m.heads) + " heads; the problem has " + std::to_string(heads_q) +
           " query heads (a mask has 1 or one per query head)";
  return "";
}

}  // namespace blocksparse
