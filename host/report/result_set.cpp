#include "report/result_set.h"

#include "common/errors.h"
#include "report/serialize.h"

#include <fstream>
#include <map>
#include <sstream>

namespace attnhost::report {

namespace fs = std::filesystem;

namespace {

void check_schema(const json::Value& v) {
  const json::Value* s = v.find("schema_version");
  if (!s) throw std::runtime_error("no schema_version: not an attnhost result");
  if (s->integer() > kSchemaVersion)
    throw std::runtime_error("schema_version " + std::to_string(s->integer()) + " is newer than this attnhost reads (" +
                             std::to_string(kSchemaVersion) + ")");
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw UsageError(p.string() + ": cannot read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Adds or replaces a case by id, keeping the order of first appearance.
void put_case(std::vector<CaseResult>& cases, CaseResult c) {
  for (CaseResult& existing : cases)
    if (existing.spec.id == c.spec.id) {
      existing = std::move(c);
      return;
    }
  cases.push_back(std::move(c));
}

}  // namespace

json::Value journal_header(const Environment& env, const std::string& suite_name, const std::string& suite_text,
                           const std::vector<std::string>& planned) {
  json::Array ids;
  for (const std::string& id : planned) ids.push_back(id);
  return json::Object{{"schema_version", kSchemaVersion}, {"kind", "run"}, {"suite", suite_name},
                      {"suite_text", suite_text}, {"environment", to_json(env)}, {"planned", ids}};
}

json::Value journal_case(const CaseResult& c) {
  json::Value line = to_json(c);
  line.set("kind", "case");
  return line;
}

json::Value to_json(const ResultSet& r) {
  json::Array cases;
  for (const CaseResult& c : r.cases) cases.push_back(to_json(c));
  json::Value doc = json::Object{{"schema_version", kSchemaVersion}, {"suite", r.suite_name},
                                 {"suite_text", r.suite_text}, {"environment", to_json(r.environment)}};
  if (r.sessions.size() > 1) {
    json::Array sessions;
    for (const Environment& e : r.sessions) sessions.push_back(to_json(e));
    doc.set("sessions", sessions);
  }
  if (r.gate) doc.set("regression_gate", to_json(*r.gate));
  doc.set("cases", cases);
  return doc;
}

ResultSet result_set_from_json(const json::Value& v) {
  check_schema(v);
  ResultSet r;
  r.suite_name = v["suite"].string();
  if (const json::Value* t = v.find("suite_text")) r.suite_text = t->string();
  r.environment = environment_from_json(v["environment"]);
  if (const json::Value* s = v.find("sessions"))
    for (const json::Value& e : s->array()) r.sessions.push_back(environment_from_json(e));
  else
    r.sessions.push_back(r.environment);
  if (const json::Value* g = v.find("regression_gate")) r.gate = gate_from_json(*g);
  for (const json::Value& c : v["cases"].array()) r.cases.push_back(case_from_json(c));
  return r;
}

Journal read_journal(const fs::path& file) {
  const std::string text = read_file(file);
  Journal j;
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    const bool last = end == std::string::npos;
    std::string line = text.substr(at, last ? std::string::npos : end - at);
    at = last ? text.size() : end + 1;
    ++line_no;
    if (line.empty()) continue;
    json::Value v;
    try {
      v = json::parse(line);
    } catch (const json::ParseError& e) {
      if (last) {  // no newline after it: the write was cut short by a kill
        j.cut_tail = true;
        break;
      }
      throw UsageError(file.string() + ":" + std::to_string(line_no) + ": malformed JSON: " + e.what());
    }
    try {
      const json::Value* kind = v.find("kind");
      if (kind && kind->string() == "run") {
        check_schema(v);
        j.results.suite_name = v["suite"].string();
        if (const json::Value* t = v.find("suite_text")) j.results.suite_text = t->string();
        j.results.environment = environment_from_json(v["environment"]);
        j.results.sessions.push_back(j.results.environment);
        j.results.planned.clear();
        if (const json::Value* planned = v.find("planned"))
          for (const json::Value& id : planned->array()) j.results.planned.push_back(id.string());
      } else if (kind && kind->string() == "case") {
        put_case(j.results.cases, case_from_json(v));
      } else {
        throw std::runtime_error("a line that is neither a run header nor a case");
      }
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception& e) {
      throw UsageError(file.string() + ":" + std::to_string(line_no) + ": not an attnhost result line: " + e.what());
    }
    j.lines.push_back(line);
  }
  if (j.results.sessions.empty()) throw UsageError(file.string() + ": no run header: not an attnhost results.jsonl");
  return j;
}

ResultSet load_results(const fs::path& path) {
  fs::path file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    file = path / "results.json";
    if (!fs::exists(file)) file = path / "results.jsonl";
    if (!fs::exists(file)) throw UsageError(path.string() + ": no results.json or results.jsonl in this folder");
  } else if (!fs::exists(path, ec)) {
    throw UsageError(path.string() + ": no such file or folder");
  }
  if (file.extension() == ".jsonl") return read_journal(file).results;
  const std::string text = read_file(file);
  json::Value doc;
  try {
    doc = json::parse(text);
  } catch (const json::ParseError& e) {
    throw UsageError(file.string() + ": malformed JSON: " + e.what());
  }
  try {
    return result_set_from_json(doc);
  } catch (const std::exception& e) {
    throw UsageError(file.string() + ": not an attnhost results.json: " + e.what());
  }
}

}  // namespace attnhost::report
