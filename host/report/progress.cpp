#include "report/progress.h"

#include "common/log.h"
#include "report/format.h"

#include <numeric>

namespace attnhost::report {

namespace {

// Attended pairs of one head, over the batch.
double pairs(const suite::Problem& p) {
  const double kv = static_cast<double>(p.seqlen_kv > 0 ? p.seqlen_kv : p.seqlen_q);
  double n = 0;
  if (p.varlen) {
    for (int64_t l : p.varlen->lengths) n += static_cast<double>(l) * static_cast<double>(l);
  } else {
    n = static_cast<double>(p.batch) * static_cast<double>(p.seqlen_q) * kv;
  }
  return p.causal ? n / 2 : n;
}

}  // namespace

double work_estimate(const suite::Case& c) {
  const suite::Problem& p = c.problem;
  const double per_run = pairs(p) * p.heads_q * std::max(1, p.head_dim);
  return std::max(1.0, per_run * std::max<size_t>(1, c.world_sizes.size()) * std::max<size_t>(1, c.timing.passes.size()) *
                           std::max(1, c.timing.rounds));
}

double fwd_bwd_gflop(const suite::Problem& p) { return 3.5 * 4.0 * p.head_dim * pairs(p) * p.heads_q / 1e9; }

Progress::Progress(std::vector<double> weights, bool terminal, bool quiet, std::ostream& out, Clock clock)
    : weights_(std::move(weights)), terminal_(terminal), quiet_(quiet), out_(out), clock_(std::move(clock)) {
  if (!clock_) {
    clock_ = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    };
  }
  start_ = clock_();
}

std::string Progress::position() const {
  const double elapsed = clock_() - start_;
  const double total = std::accumulate(weights_.begin(), weights_.end(), 0.0);
  std::string s = "case " + std::to_string(current_ + 1) + " of " + std::to_string(weights_.size()) + ", " +
                  fmt::duration(elapsed) + " elapsed";
  // The rate of the finished cases (seconds per unit of work) times the work left, less what the
  // running case has already had. Not before a case has finished, nor while the finished ones are
  // under 1% of the work: a tiny first case, all fixed overhead, would predict days.
  if (done_weight_ > 0 && done_weight_ >= 0.01 * total && total > done_weight_) {
    const double rate = done_seconds_ / done_weight_;
    const double left = std::max(0.0, rate * (total - done_weight_) - (clock_() - start_ - done_seconds_));
    s += ", about " + fmt::duration(left) + " left";
  }
  return s;
}

void Progress::draw(const std::string& detail) {
  std::string line = "[" + position() + "] " + id_ + (detail.empty() ? "" : "  " + detail);
  if (line.size() > 160) line = line.substr(0, 157) + "...";
  out_ << "\r\033[2K" << line << std::flush;
  drawn_ = true;
}

void Progress::start_case(size_t index, const std::string& id) {
  current_ = index;
  id_ = id;
  if (quiet_) return;
  if (terminal_) draw("");
  else log::info(position() + ": " + id);
}

void Progress::step(const std::string& line) {
  if (quiet_) return;
  if (terminal_) draw(line.substr(line.find(' ') == std::string::npos ? 0 : line.find(' ') + 1));
  else log::info(line);
}

void Progress::finish_case(size_t index) {
  if (index < weights_.size()) done_weight_ += weights_[index];
  done_seconds_ = clock_() - start_;
}

void Progress::clear() {
  if (!drawn_) return;
  out_ << "\r\033[2K" << std::flush;
  drawn_ = false;
}

}  // namespace attnhost::report
