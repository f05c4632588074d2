// Suggestions for misspelled names: optimal string alignment distance (Levenshtein plus adjacent
// transpositions, so "rnig" is one edit from "ring"), compared without regard to case.
#include "suite/suite.h"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace attnhost::suite {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t substitution = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + substitution});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

// A third of the word, at least one and at most three edits: close enough to be a typo, far
// enough that "tiny" does not suggest "ring".
size_t allowed_edits(const std::string& word) {
  return std::clamp<size_t>(word.size() / 3, 1, 3);
}

} // namespace

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string folded = lower(word);
  std::string best;
  size_t best_distance = allowed_edits(folded) + 1;
  for (const std::string& candidate : candidates) {
    const std::string other = lower(candidate);
    const size_t distance = edit_distance(folded, other);
    // A suggestion that shares nothing with the word (every character replaced) is no suggestion.
    if (distance >= std::max(folded.size(), other.size())) continue;
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

} // namespace attnhost::suite
