// Small formatting helpers shared by the reporters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attnhost::fmt {

std::string fixed(double v, int decimals);       // "12.35"
std::string bytes(double b);                      // "1.50 GiB", "320.0 MiB"
std::string si(double v);                         // "1.23 M", "456.0 k"
std::string ms(double v);                         // "12.345 ms", "850.2 us"
std::string percent(double fraction);            // "93.1%"
// Significant digits, never exponent notation: a CPU's 0.00171 TFLOP/s must not print as "0.0".
std::string sig(double v, int digits = 3);        // "0.00171", "12.3", "1234"
std::string general(double v, int digits = 2);    // printf %g: "0.0015", "4.7e-08" (errors span decades)
std::string signed_percent(double fraction);     // "+12.3%", "-4.0%"
std::string ratio(double r);                      // "1.23x"
std::string duration(double seconds);             // "45s", "3m05s", "1h02m"
std::string html_escape(const std::string& s);

// A plain text table: columns right-aligned except the first.
class Table {
 public:
  // The first `left` columns are left-aligned (names), the rest right-aligned (numbers).
  explicit Table(std::vector<std::string> header, size_t left = 1) : header_(std::move(header)), left_(left) {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  std::string str() const;
  std::string markdown() const;
  std::string html() const;                       // a <table>, cells escaped
  bool empty() const { return rows_.empty(); }

 private:
  std::vector<std::string> header_;
  size_t left_ = 1;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace attnhost::fmt
