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

// A plain text table: columns right-aligned except the first.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  std::string str() const;
  std::string markdown() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace attnhost::fmt
