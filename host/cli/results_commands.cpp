// Commands over results already written: re-render a folder's reports (report), compare two
// folders (diff), and show the trend of a history file (history). They read records only.
#include "cli/app.h"
#include "cli/options.h"
#include "common/errors.h"
#include "common/log.h"
#include "report/console.h"
#include "report/files.h"
#include "report/history.h"
#include "report/result_set.h"

#include <algorithm>
#include <iostream>

namespace attnhost::cli {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> formats_option(const po::variables_map& vm) {
  std::vector<std::string> out;
  if (!vm.count("format")) {
    out = report::file_formats();
    out.insert(out.begin(), "console");
    return out;
  }
  std::string item;
  for (char c : vm["format"].as<std::string>() + ",") {
    if (c != ',') {
      if (c != ' ') item += c;
      continue;
    }
    if (item.empty()) continue;
    if (item != "console" && std::find(report::file_formats().begin(), report::file_formats().end(), item) ==
                                 report::file_formats().end())
      throw UsageError("--format: unknown format '" + item + "'; formats: console, json, jsonl, csv, markdown, trace, charts");
    out.push_back(item);
    item.clear();
  }
  return out;
}

report::GateOptions gate_from(const po::variables_map& vm) {
  report::GateOptions g;
  g.threshold = parse_threshold(vm["threshold"].as<std::string>());
  return g;
}

}  // namespace

int report_command(Context& ctx, const std::vector<std::string>& args) {
  po::options_description desc;
  desc.add(common_options(ctx.options));
  po::options_description own("Report");
  own.add_options()("dir", po::value<std::string>(), "result folder (results.json, or results.jsonl of a stopped run)")
                   ("out", po::value<std::string>(), "write the reports here instead of into DIR")
                   ("format", po::value<std::string>(), "comma-separated: console,json,csv,markdown,trace,charts (default: all)")
                   ("baseline", po::value<std::string>(), "add a regression gate against an earlier result")
                   ("threshold", po::value<std::string>()->default_value("20"), "percent change that counts, with --baseline");
  desc.add(own);
  po::positional_options_description pos;
  pos.add("dir", 1);
  po::variables_map vm;
  if (!parse(args, desc, pos, vm, "usage: attnhost report DIR [options]\n\nWrites every report of DIR again from its "
                                  "results.json (or results.jsonl), and prints the summary.")) return kExitOk;
  apply_common(ctx, vm);
  if (!vm.count("dir")) throw UsageError("report: which result folder? (attnhost report DIR)");
  const fs::path dir = vm["dir"].as<std::string>();
  report::ResultSet results = report::load_results(dir);
  std::vector<std::string> formats = formats_option(vm);
  if (vm.count("baseline"))
    results.gate = report::regression_gate(report::load_results(vm["baseline"].as<std::string>()).cases, results.cases,
                                           gate_from(vm), vm["baseline"].as<std::string>());
  const fs::path out = vm.count("out") ? fs::path(vm["out"].as<std::string>()) : (fs::is_directory(dir) ? dir : dir.parent_path());
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw UsageError("cannot create " + out.string() + ": " + ec.message());
  // The journal stays as the run wrote it: it is the record, the rest is rendered from it.
  formats.erase(std::remove(formats.begin(), formats.end(), "jsonl"), formats.end());
  const bool console = std::find(formats.begin(), formats.end(), "console") != formats.end();
  if (console) {
    if (ctx.options.verbose)
      for (const CaseResult& c : results.cases) report::print_case(std::cout, c);
    report::print_summary(std::cout, results.cases);
    if (results.gate) report::print_gate(std::cout, *results.gate);
  }
  // A run that was stopped: the cases its suite had that never ran.
  std::vector<std::string> never;
  for (const std::string& id : results.planned)
    if (std::none_of(results.cases.begin(), results.cases.end(), [&](const CaseResult& c) { return c.spec.id == id; }))
      never.push_back(id);
  if (!never.empty()) {
    std::string ids;
    for (size_t i = 0; i < never.size() && i < 5; ++i) ids += (i ? ", " : "") + never[i];
    if (never.size() > 5) ids += ", ...";
    std::cout << "attnhost: " << never.size() << " of " << results.planned.size() << " cases of suite '"
              << results.suite_name << "' never ran (the run was stopped before them: " << ids
              << "); attnhost run SUITE --resume " << dir.string() << " runs them\n";
  }
  report::ReportsWritten written = report::write_reports(out, results, formats);
  if (!written.notice.empty()) log::warn(written.notice);
  if (!ctx.options.quiet)
    for (const fs::path& f : written.files) std::cout << "wrote " << f.string() << "\n";
  const bool failed = std::any_of(results.cases.begin(), results.cases.end(), [](const CaseResult& c) { return c.failed(); });
  return failed || (results.gate && results.gate->slower()) ? kExitCheckFailed : kExitOk;
}

int diff_command(Context& ctx, const std::vector<std::string>& args) {
  po::options_description desc;
  desc.add(common_options(ctx.options));
  po::options_description own("Diff");
  own.add_options()("results", po::value<std::vector<std::string>>(), "baseline and current result folders (or files)")
                   ("threshold", po::value<std::string>()->default_value("20"), "percent change of a median that counts");
  desc.add(own);
  po::positional_options_description pos;
  pos.add("results", 2);
  po::variables_map vm;
  if (!parse(args, desc, pos, vm, "usage: attnhost diff BASELINE CURRENT [--threshold 20]\n\nClassifies every case of "
                                  "CURRENT against BASELINE as FASTER, SAME, SLOWER, NEW, MISSING or MISMATCH (another problem); a SLOWER case "
                                  "exits 1."))
    return kExitOk;
  apply_common(ctx, vm);
  std::vector<std::string> paths = vm.count("results") ? vm["results"].as<std::vector<std::string>>() : std::vector<std::string>{};
  if (paths.size() != 2) throw UsageError("diff: name two result folders (attnhost diff BASELINE CURRENT)");
  report::ResultSet a = report::load_results(paths[0]);
  report::ResultSet b = report::load_results(paths[1]);
  std::cout << "baseline " << paths[0] << ": " << a.environment.date << ", " << a.environment.device << ", git "
            << a.environment.git_revision << "\n"
            << "current  " << paths[1] << ": " << b.environment.date << ", " << b.environment.device << ", git "
            << b.environment.git_revision << "\n";
  report::GateReport g = report::regression_gate(a.cases, b.cases, gate_from(vm), paths[0]);
  report::print_gate(std::cout, g);
  return g.slower() ? kExitCheckFailed : kExitOk;
}

int history_command(Context& ctx, const std::vector<std::string>& args) {
  po::options_description desc;
  desc.add(common_options(ctx.options));
  po::options_description own("History");
  own.add_options()("file", po::value<std::string>(), "history file written by run --history")
                   ("case", po::value<std::string>()->default_value(""), "only cases whose id matches (a glob, or a substring)")
                   ("threshold", po::value<std::string>()->default_value("20"), "percent change that counts as slower")
                   ("chart", po::value<std::string>(), "SVG file for the trend chart (default: FILE with .svg)");
  desc.add(own);
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (!parse(args, desc, pos, vm, "usage: attnhost history FILE [--case PATTERN] [-v]\n\nThe trend of each case's "
                                  "median over the runs in FILE, and a chart of it.")) return kExitOk;
  apply_common(ctx, vm);
  if (!vm.count("file")) throw UsageError("history: which file? (attnhost history FILE)");
  const fs::path file = vm["file"].as<std::string>();
  const double threshold = parse_threshold(vm["threshold"].as<std::string>());
  std::vector<report::HistoryEntry> history = report::read_history(file);
  std::vector<report::Trend> trends = report::trends(history, vm["case"].as<std::string>(), threshold);
  if (trends.empty()) throw UsageError("history: no case matches '" + vm["case"].as<std::string>() + "' in " + file.string());
  report::print_trends(std::cout, history, trends, threshold, ctx.options.verbose);
  fs::path chart = vm.count("chart") ? fs::path(vm["chart"].as<std::string>()) : fs::path(file).replace_extension(".svg");
  chart = fs::absolute(chart);
  report::ChartsDrawn drawn = report::draw_charts(chart.parent_path(), {report::trend_chart(trends, chart.filename().string(), threshold)},
                                                  chart.stem().string() + ".gp");
  if (!drawn.notice.empty()) log::warn(drawn.notice);
  else if (!ctx.options.quiet) std::cout << "\nchart: " << chart.string() << "\n";
  const bool slower = std::any_of(trends.begin(), trends.end(), [](const report::Trend& t) { return t.status == "SLOWER"; });
  return slower ? kExitCheckFailed : kExitOk;
}

}  // namespace attnhost::cli
