#include "report/format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace attnhost::fmt {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return fixed(b, u == 0 ? 0 : 2) + " " + units[u];
}

std::string si(double v) {
  const char* units[] = {"", " k", " M", " G", " T", " P"};
  int u = 0;
  while (std::fabs(v) >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  return fixed(v, u == 0 ? 0 : 2) + units[u];
}

std::string ms(double v) {
  if (v >= 1000) return fixed(v / 1000, 3) + " s";
  if (v >= 1) return fixed(v, 3) + " ms";
  return fixed(v * 1000, 1) + " us";
}

std::string percent(double f) { return fixed(100 * f, 1) + "%"; }

std::string Table::str() const {
  std::vector<size_t> width(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size() && i < width.size(); ++i) width[i] = std::max(width[i], r[i].size());
  };
  measure(header_);
  for (const auto& r : rows_) measure(r);
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < width.size(); ++i) {
      std::string cell = i < r.size() ? r[i] : "";
      std::string pad(width[i] - std::min(width[i], cell.size()), ' ');
      out << (i ? "  " : "") << (i == 0 ? cell + pad : pad + cell);
    }
    out << '\n';
  };
  line(header_);
  size_t total = 0;
  for (size_t w : width) total += w;
  out << std::string(total + 2 * (width.size() - 1), '-') << '\n';
  for (const auto& r : rows_) line(r);
  return out.str();
}

std::string Table::markdown() const {
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& r) {
    out << '|';
    for (size_t i = 0; i < header_.size(); ++i) out << ' ' << (i < r.size() ? r[i] : "") << " |";
    out << '\n';
  };
  line(header_);
  out << '|';
  for (size_t i = 0; i < header_.size(); ++i) out << (i == 0 ? " --- |" : " ---: |");
  out << '\n';
  for (const auto& r : rows_) line(r);
  return out.str();
}

}  // namespace attnhost::fmt
