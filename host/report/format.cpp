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

std::string sig(double v, int digits) {
  if (v == 0 || !std::isfinite(v)) return v == 0 ? "0" : fixed(v, 0);
  const int magnitude = static_cast<int>(std::floor(std::log10(std::fabs(v))));
  const int decimals = std::clamp(digits - 1 - magnitude, 0, 12);
  return fixed(v, decimals);
}

std::string general(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string signed_percent(double f) { return (f >= 0 ? "+" : "") + fixed(100 * f, 1) + "%"; }

std::string ratio(double r) { return fixed(r, 2) + "x"; }

std::string duration(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%lds", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  return buf;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {
// Columns are measured in characters, not bytes: a sparkline's blocks are 3 bytes of UTF-8 each.
size_t display_width(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}
}  // namespace

std::string Table::str() const {
  std::vector<size_t> width(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size() && i < width.size(); ++i) width[i] = std::max(width[i], display_width(r[i]));
  };
  measure(header_);
  for (const auto& r : rows_) measure(r);
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < width.size(); ++i) {
      std::string cell = i < r.size() ? r[i] : "";
      std::string pad(width[i] - std::min(width[i], display_width(cell)), ' ');
      out << (i ? "  " : "") << (i < left_ ? cell + pad : pad + cell);
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
    for (size_t i = 0; i < header_.size(); ++i) {
      std::string cell = i < r.size() ? r[i] : "";
      for (size_t at = cell.find('|'); at != std::string::npos; at = cell.find('|', at + 2)) cell.replace(at, 1, "\\|");
      out << ' ' << cell << " |";
    }
    out << '\n';
  };
  line(header_);
  out << '|';
  for (size_t i = 0; i < header_.size(); ++i) out << (i < left_ ? " --- |" : " ---: |");
  out << '\n';
  for (const auto& r : rows_) line(r);
  return out.str();
}

std::string Table::html() const {
  std::ostringstream out;
  out << "<table>\n<thead><tr>";
  for (const std::string& h : header_) out << "<th>" << html_escape(h) << "</th>";
  out << "</tr></thead>\n<tbody>\n";
  for (const auto& r : rows_) {
    out << "<tr>";
    for (size_t i = 0; i < header_.size(); ++i)
      out << (i < left_ ? "<td>" : "<td class=\"n\">") << html_escape(i < r.size() ? r[i] : "") << "</td>";
    out << "</tr>\n";
  }
  out << "</tbody>\n</table>\n";
  return out.str();
}

}  // namespace attnhost::fmt
