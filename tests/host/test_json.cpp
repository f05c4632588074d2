#include "common/json.h"
#include "report/serialize.h"

#include <doctest/doctest.h>

#include <cmath>

using namespace attnhost;

TEST_CASE("json: values round-trip through text") {
  json::Value v = json::Object{{"a", 1}, {"b", 2.5}, {"s", "quote \" and \\ and \n"}, {"t", true}, {"n", nullptr},
                               {"list", json::Array{1, 2, 3}}, {"big", int64_t{1} << 52}};
  json::Value back = json::parse(v.dump());
  CHECK(back["a"].integer() == 1);
  CHECK(back["b"].number() == 2.5);
  CHECK(back["s"].string() == "quote \" and \\ and \n");
  CHECK(back["t"].boolean());
  CHECK(back["n"].is_null());
  CHECK(back["list"].array().size() == 3);
  CHECK(back["big"].integer() == (int64_t{1} << 52));
  CHECK(json::parse(v.dump(2)).dump() == v.dump());
}

TEST_CASE("json: non-finite numbers become null, and malformed text names its offset") {
  json::Value v = json::Array{std::nan(""), 1.0 / 0.0};
  CHECK(v.dump() == "[null,null]");
  CHECK_THROWS_WITH(json::parse("{\"a\": }"), "JSON: expected a value at offset 6");
  CHECK_THROWS_WITH(json::parse("[1, 2] x"), "JSON: trailing characters at offset 7");
}

TEST_CASE("json: a case result survives serialization") {
  CaseResult c;
  c.spec.id = "naive_attention/tiny";
  c.spec.plugin = "naive_attention";
  c.spec.problem.batch = 2;
  c.spec.problem.seqlen_q = c.spec.problem.seqlen_kv = 1024;
  c.spec.problem.heads_q = c.spec.problem.heads_kv = 8;
  c.spec.problem.head_dim = 64;
  c.spec.params["cpu_accumulate"] = std::string("fp64");
  c.spec.params["threads_per_block"] = int64_t{64};
  RunResult r;
  r.world_size = 2;
  r.status = "FAILED";
  r.error = "check failed";
  PassResult p;
  p.pass = "fwd";
  p.time_ms = summarize({1.0, 2.0, 3.0});
  r.passes.push_back(p);
  r.peak_bytes = {100, 200};
  r.check.ran = true;
  r.check.ok = false;
  r.check.tensors.push_back({"O", 10, 0, 0.5, 1.0, 0.1, 0.01, 0.05, "b=0 h=1 t=2 d=3", false});
  r.trace.push_back({1, "step 0", "compute", 1.5, 2.5});
  c.runs.push_back(r);
  CaseResult back = report::case_from_json(json::parse(report::to_json(c).dump()));
  CHECK(back.spec.id == c.spec.id);
  CHECK(std::get<std::string>(back.spec.params["cpu_accumulate"]) == "fp64");
  CHECK(std::get<int64_t>(back.spec.params["threads_per_block"]) == 64);
  REQUIRE(back.runs.size() == 1);
  CHECK(back.runs[0].status == "FAILED");
  CHECK(back.runs[0].passes[0].time_ms.median == 2.0);
  CHECK(back.runs[0].peak_bytes[1] == 200);
  CHECK(back.runs[0].check.tensors[0].worst == "b=0 h=1 t=2 d=3");
  CHECK(back.runs[0].trace[0].name == "step 0");
  CHECK(back.failed());
}
