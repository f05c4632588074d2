#include "common/json.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace attnhost::json {

double Value::number() const {
  if (auto* i = std::get_if<int64_t>(&v_)) return static_cast<double>(*i);
  if (auto* d = std::get_if<double>(&v_)) return *d;
  if (is_null()) return std::nan("");  // a non-finite number was written as null
  throw std::runtime_error("JSON value is not a number");
}
int64_t Value::integer() const {
  if (auto* i = std::get_if<int64_t>(&v_)) return *i;
  if (auto* d = std::get_if<double>(&v_)) return static_cast<int64_t>(*d);
  throw std::runtime_error("JSON value is not an integer");
}
bool Value::boolean() const {
  if (auto* b = std::get_if<bool>(&v_)) return *b;
  throw std::runtime_error("JSON value is not a boolean");
}
const std::string& Value::string() const {
  if (auto* s = std::get_if<std::string>(&v_)) return *s;
  throw std::runtime_error("JSON value is not a string");
}
const Array& Value::array() const {
  if (auto* a = std::get_if<Array>(&v_)) return *a;
  throw std::runtime_error("JSON value is not an array");
}
Array& Value::array() {
  if (auto* a = std::get_if<Array>(&v_)) return *a;
  throw std::runtime_error("JSON value is not an array");
}
const Object& Value::object() const {
  if (auto* o = std::get_if<Object>(&v_)) return *o;
  throw std::runtime_error("JSON value is not an object");
}
Object& Value::object() {
  if (auto* o = std::get_if<Object>(&v_)) return *o;
  throw std::runtime_error("JSON value is not an object");
}
const Value* Value::find(const std::string& key) const {
  auto* o = std::get_if<Object>(&v_);
  if (!o) return nullptr;
  for (const auto& [k, v] : *o)
    if (k == key) return &v;
  return nullptr;
}
const Value& Value::operator[](const std::string& key) const {
  const Value* v = find(key);
  if (!v) throw std::runtime_error("JSON object has no key '" + key + "'");
  return *v;
}
Value& Value::set(const std::string& key, Value v) {
  Object& o = object();
  for (auto& [k, existing] : o)
    if (k == key) return existing = std::move(v);
  o.emplace_back(key, std::move(v));
  return o.back().second;
}
void Value::push(Value v) { array().push_back(std::move(v)); }

namespace {

void escape(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void dump_to(std::string& out, const Value& v, int indent, int depth);

void newline(std::string& out, int indent, int depth) {
  if (indent < 0) return;
  out += '\n';
  out.append(static_cast<size_t>(indent * depth), ' ');
}

void dump_to(std::string& out, const Value& v, int indent, int depth) {
  if (v.is_null()) {
    out += "null";
  } else if (v.is_string()) {
    escape(out, v.string());
  } else if (v.is_array()) {
    const Array& a = v.array();
    out += '[';
    for (size_t i = 0; i < a.size(); ++i) {
      if (i) out += indent < 0 ? "," : ",";
      newline(out, indent, depth + 1);
      dump_to(out, a[i], indent, depth + 1);
    }
    if (!a.empty()) newline(out, indent, depth);
    out += ']';
  } else if (v.is_object()) {
    const Object& o = v.object();
    out += '{';
    for (size_t i = 0; i < o.size(); ++i) {
      if (i) out += ',';
      newline(out, indent, depth + 1);
      escape(out, o[i].first);
      out += indent < 0 ? ":" : ": ";
      dump_to(out, o[i].second, indent, depth + 1);
    }
    if (!o.empty()) newline(out, indent, depth);
    out += '}';
  } else if (v.is_number()) {
    double d = v.number();
    try {
      int64_t i = v.integer();
      if (static_cast<double>(i) == d && std::fabs(d) < 9e15) {
        out += std::to_string(i);
        return;
      }
    } catch (...) {
    }
    if (!std::isfinite(d)) {
      out += "null";  // JSON has no NaN or infinity
      return;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", d);
    out += buf;
  } else {
    out += v.boolean() ? "true" : "false";
  }
}

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}
  Value document() {
    Value v = value();
    skip();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw ParseError("JSON: " + what + " at offset " + std::to_string(i_));
  }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  Value value() {
    skip();
    if (i_ >= s_.size()) fail("unexpected end");
    char c = s_[i_];
    if (c == '{') return object();
    if (c == '[') return array();
    if (c == '"') return Value(string());
    if (s_.compare(i_, 4, "true") == 0) { i_ += 4; return Value(true); }
    if (s_.compare(i_, 5, "false") == 0) { i_ += 5; return Value(false); }
    if (s_.compare(i_, 4, "null") == 0) { i_ += 4; return Value(); }
    return number();
  }
  Value object() {
    expect('{');
    Object o;
    if (eat('}')) return Value(std::move(o));
    do {
      skip();
      std::string key = string();
      expect(':');
      o.emplace_back(std::move(key), value());
    } while (eat(','));
    expect('}');
    return Value(std::move(o));
  }
  Value array() {
    expect('[');
    Array a;
    if (eat(']')) return Value(std::move(a));
    do a.push_back(value());
    while (eat(','));
    expect(']');
    return Value(std::move(a));
  }
  std::string string() {
    if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string");
    ++i_;
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          unsigned code = std::stoul(s_.substr(i_, 4), nullptr, 16);
          i_ += 4;
          if (code < 0x80) out += static_cast<char>(code);
          else if (code < 0x800) { out += static_cast<char>(0xc0 | (code >> 6)); out += static_cast<char>(0x80 | (code & 0x3f)); }
          else { out += static_cast<char>(0xe0 | (code >> 12)); out += static_cast<char>(0x80 | ((code >> 6) & 0x3f)); out += static_cast<char>(0x80 | (code & 0x3f)); }
          break;
        }
        default: out += e;
      }
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  Value number() {
    size_t start = i_;
    bool is_float = false;
    if (s_[i_] == '-') ++i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' || s_[i_] == 'e' ||
                              s_[i_] == 'E' || s_[i_] == '+' || s_[i_] == '-')) {
      if (!std::isdigit(static_cast<unsigned char>(s_[i_]))) is_float = true;
      ++i_;
    }
    std::string text = s_.substr(start, i_ - start);
    if (text.empty() || text == "-") fail("expected a value");
    try {
      if (!is_float) return Value(static_cast<int64_t>(std::stoll(text)));
      return Value(std::stod(text));
    } catch (const std::exception&) {
      fail("bad number '" + text + "'");
    }
  }
  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace

std::string Value::dump(int indent) const {
  std::string out;
  dump_to(out, *this, indent, 0);
  return out;
}

Value parse(const std::string& text) { return Parser(text).document(); }

}  // namespace attnhost::json
