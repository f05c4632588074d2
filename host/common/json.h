// A small JSON value with a writer and a strict parser: results.json, results.jsonl, baselines
// and the records an isolated case sends back to the host. (No JSON library is among the
// project's dependencies; this is the few hundred lines it needs.)
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace attnhost::json {

class Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion order is kept

class Value {
 public:
  Value() : v_(nullptr) {}
  Value(std::nullptr_t) : v_(nullptr) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(int64_t i) : v_(i) {}
  Value(uint64_t i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(Array a) : v_(std::move(a)) {}
  Value(Object o) : v_(std::move(o)) {}

  bool is_null() const { return std::holds_alternative<std::nullptr_t>(v_); }
  bool is_object() const { return std::holds_alternative<Object>(v_); }
  bool is_array() const { return std::holds_alternative<Array>(v_); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_number() const { return std::holds_alternative<double>(v_) || std::holds_alternative<int64_t>(v_); }

  double number() const;                 // int or double
  int64_t integer() const;
  bool boolean() const;
  const std::string& string() const;
  const Array& array() const;
  const Object& object() const;
  Object& object();
  Array& array();

  const Value* find(const std::string& key) const;   // nullptr when absent or not an object
  const Value& operator[](const std::string& key) const; // throws when absent
  Value& set(const std::string& key, Value v);          // object only
  void push(Value v);                                   // array only

  std::string dump(int indent = -1) const;              // -1: one line

 private:
  std::variant<std::nullptr_t, bool, int64_t, double, std::string, Array, Object> v_;
};

struct ParseError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
Value parse(const std::string& text);  // throws ParseError with the offset

}  // namespace attnhost::json
