#include "report/charts.h"

#include "report/derived.h"

#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace attnhost::report {

namespace fs = std::filesystem;

namespace {

// A file name from a group name: letters, digits, '-', '_', '.'.
std::string slug(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_';
  return out.empty() ? "run" : out;
}

// What distinguishes a case within its group besides the sequence length: the plugin and the id's
// other swept values ("naive_attention/sweep/seqlen=256/dtype=fp16" -> "naive_attention dtype=fp16").
std::string series_name(const CaseResult& c, bool drop_seqlen) {
  std::string name = c.spec.plugin;
  std::string rest = c.spec.id;
  const std::string prefix = c.spec.plugin + "/" + c.spec.label;
  if (rest.rfind(prefix, 0) == 0) rest = rest.substr(prefix.size());
  std::istringstream parts(rest);
  for (std::string part; std::getline(parts, part, '/');) {
    if (part.empty() || (drop_seqlen && part.rfind("seqlen=", 0) == 0)) continue;
    name += " " + part;
  }
  return name;
}

// Series kept in order of first appearance, points sorted by x.
class SeriesSet {
 public:
  void add(const std::string& title, double x, double y) {
    auto it = std::find_if(series_.begin(), series_.end(), [&](const ChartSeries& s) { return s.title == title; });
    if (it == series_.end()) it = series_.insert(series_.end(), ChartSeries{title, {}});
    it->points.emplace_back(x, y);
  }
  std::vector<ChartSeries> take() {
    for (ChartSeries& s : series_) std::sort(s.points.begin(), s.points.end());
    return std::move(series_);
  }

 private:
  std::vector<ChartSeries> series_;
};

bool spans(const std::vector<ChartSeries>& series, bool x, double factor) {
  double lo = 0, hi = 0;
  for (const ChartSeries& s : series)
    for (const auto& p : s.points) {
      double v = x ? p.first : p.second;
      if (v <= 0) return false;
      lo = lo == 0 ? v : std::min(lo, v);
      hi = std::max(hi, v);
    }
  return lo > 0 && hi / lo >= factor;
}

void seqlen_charts(const std::string& group, const std::vector<const CaseResult*>& cases, std::vector<Chart>& out) {
  SeriesSet time, tflops, memory;
  for (const CaseResult* c : cases)
    for (const RunResult& r : c->runs) {
      if (!r.ok()) continue;
      const std::string title = series_name(*c, true) + " ws=" + std::to_string(r.world_size);
      const double x = static_cast<double>(c->spec.problem.seqlen_q);
      if (std::optional<PassResult> h = headline_pass(*c, r)) {
        time.add(title, x, h->time_ms.median);
        if (h->tflops_per_gpu > 0) tflops.add(title, x, h->tflops_per_gpu);
      }
      if (uint64_t peak = max_peak_bytes(r); peak > 0) memory.add(title, x, peak / 1048576.0);
    }
  const std::string base = "charts/" + slug(group);
  auto chart = [&](const std::string& kind, const std::string& what, const std::string& ylabel, SeriesSet& data) {
    Chart c{base + "-" + kind + ".svg", group, group + ": " + what + " against sequence length", "sequence length (tokens)",
            ylabel};
    c.series = data.take();
    if (c.series.empty()) return;
    c.log_x = spans(c.series, true, 8);
    c.log_y = spans(c.series, false, 20);
    out.push_back(std::move(c));
  };
  chart("time", "fwd+bwd median time", "median time (ms)", time);
  chart("tflops", "fwd+bwd throughput", "TFLOP/s per GPU", tflops);
  chart("memory", "peak memory", "peak memory per rank (MiB)", memory);
}

void efficiency_chart(const std::string& group, const std::vector<const CaseResult*>& cases, bool many_seqlens,
                      std::vector<Chart>& out) {
  SeriesSet eff;
  for (const CaseResult* c : cases) {
    std::string title = series_name(*c, true);
    if (many_seqlens) title += " S=" + std::to_string(c->spec.problem.seqlen_q);
    for (const RunResult& r : c->runs) {
      if (!r.ok()) continue;
      std::optional<PassResult> h = headline_pass(*c, r);
      if (!h) continue;
      if (r.world_size == 1) eff.add(title, 1, 100);
      else if (h->efficiency > 0) eff.add(title, r.world_size, 100 * h->efficiency);
    }
  }
  Chart c{"charts/" + slug(group) + "-efficiency.svg", group, group + ": parallel efficiency of fwd+bwd against world size",
          "world size (ranks)", "parallel efficiency (%)"};
  c.integer_x = true;
  c.series = eff.take();
  c.series.erase(std::remove_if(c.series.begin(), c.series.end(), [](const ChartSeries& s) { return s.points.size() < 2; }),
                 c.series.end());
  if (!c.series.empty()) out.push_back(std::move(c));
}

std::string quoted(const std::string& s) {  // a gnuplot single-quoted string
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::vector<Chart> plan_charts(const std::vector<CaseResult>& cases) {
  std::vector<std::string> groups;
  for (const CaseResult& c : cases)
    if (std::find(groups.begin(), groups.end(), c.spec.group) == groups.end()) groups.push_back(c.spec.group);
  std::vector<Chart> out;
  for (const std::string& g : groups) {
    std::vector<const CaseResult*> members;
    std::set<int64_t> seqlens;
    std::set<int> sizes;
    for (const CaseResult& c : cases)
      if (c.spec.group == g) {
        members.push_back(&c);
        seqlens.insert(c.spec.problem.seqlen_q);
        for (const RunResult& r : c.runs)
          if (r.ok()) sizes.insert(r.world_size);
      }
    if (seqlens.size() >= 2) seqlen_charts(g, members, out);
    if (sizes.size() >= 2 && sizes.count(1)) efficiency_chart(g, members, seqlens.size() >= 2, out);
  }
  return out;
}

std::optional<fs::path> find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string d; std::getline(dirs, d, ':');) {
    fs::path candidate = fs::path(d.empty() ? "." : d) / "gnuplot";
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) return candidate;
  }
  return std::nullopt;
}

std::string gnuplot_script(const std::vector<Chart>& charts) {
  std::ostringstream s;
  s << "# Written by attnhost: run this script with gnuplot in the result folder to draw the charts again.\n";
  int block = 0;
  for (const Chart& c : charts) {
    s << "\nreset\n"
      << "set terminal svg size 800,450 dynamic noenhanced font 'Sans,12' background rgb 'white'\n"
      << "set output " << quoted(c.file) << "\n"
      << "set title " << quoted(c.title) << "\n"
      << "set xlabel " << quoted(c.xlabel) << "\nset ylabel " << quoted(c.ylabel) << "\n"
      << "set grid lc rgb '#dddddd'\nset key outside right top noenhanced\nset border 3\nset tics nomirror\n"
      << "set offsets graph 0.03, graph 0.03, graph 0.05, 0\n";
    if (c.log_x) s << "set logscale x 2\nset format x '%.0f'\n";
    if (c.log_y) s << "set logscale y 10\n";
    if (!c.log_y && c.from_zero) s << "set yrange [0:*]\n";
    if (c.integer_x) s << "set xtics 1\nset mxtics 1\n";
    const int first = block;
    for (const ChartSeries& series : c.series) {
      s << "$d" << block++ << " << EOD\n";
      for (const auto& [x, y] : series.points) s << x << " " << y << "\n";
      s << "EOD\n";
    }
    s << "plot ";
    for (size_t i = 0; i < c.series.size(); ++i)
      // gnuplot cycles 8 colours: past them, a dash pattern keeps the lines apart.
      s << (i ? ", \\\n     " : "") << "$d" << first + static_cast<int>(i) << " using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt "
        << 1 + (i / 8) % 4 << " title " << quoted(c.series[i].title);
    if (c.y_mark) s << ", \\\n     " << *c.y_mark << " with lines lw 1 dt 2 lc rgb '#cc0000' title " << quoted(c.y_mark_title);
    s << "\nunset output\n";
  }
  return s.str();
}

ChartsDrawn draw_charts(const fs::path& dir, const std::vector<Chart>& charts, const std::string& script_name) {
  ChartsDrawn drawn;
  if (charts.empty()) return drawn;
  std::optional<fs::path> gnuplot = find_gnuplot();
  if (!gnuplot) {
    drawn.notice = "gnuplot not found on PATH: no charts drawn (install gnuplot-nox); every other report is written";
    return drawn;
  }
  std::error_code ec;
  for (const Chart& c : charts) fs::create_directories((dir / c.file).parent_path(), ec);
  const fs::path script = dir / script_name;
  fs::create_directories(script.parent_path(), ec);
  std::ofstream(script) << gnuplot_script(charts);
  const fs::path log = fs::path(script).replace_extension(".log");
  pid_t pid = ::fork();
  if (pid == 0) {  // gnuplot in the result folder, so the script's relative paths hold
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    if (::chdir(dir.c_str()) != 0) ::_exit(127);
    ::execl(gnuplot->c_str(), "gnuplot", script_name.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::ifstream in(log);
    std::string first;
    std::getline(in, first);
    drawn.notice = "gnuplot failed (" + log.string() + "): " + first;
  }
  for (const Chart& c : charts)
    if (fs::exists(dir / c.file) && fs::file_size(dir / c.file) > 0) drawn.files.push_back(dir / c.file);
  if (drawn.notice.empty() && fs::file_size(log, ec) == 0) fs::remove(log, ec);
  return drawn;
}

}  // namespace attnhost::report
