// Where a long suite is: case i of N, the time spent, and an estimate of the time left. On a
// terminal it is one status line on stdout, redrawn in place and erased before anything else is
// printed; otherwise (a pipe, a CI log) each step is a plain line on stderr, which keeps logs
// readable and stdout the results alone.
#pragma once

#include "suite/suite.h"

#include <chrono>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace attnhost::report {

// The work of a case relative to the others: attended pairs times head dim, times the world sizes
// and passes it runs. Only ratios matter: the estimate scales the time spent so far by them.
double work_estimate(const suite::Case& c);

// A problem's forward and backward in GFLOP, FlashAttention's count (3.5 x 4 D x pairs, causal
// halving them; a window is not counted, so windows read high).
double fwd_bwd_gflop(const suite::Problem& p);

class Progress {
 public:
  using Clock = std::function<double()>;  // seconds, monotonic
  // weights: work_estimate of each case to run, in order. `terminal`: draw the status line on `out`.
  Progress(std::vector<double> weights, bool terminal, bool quiet, std::ostream& out, Clock clock = {});

  void start_case(size_t index, const std::string& id);
  void step(const std::string& line);  // a finished world size: "id ws=2: PASSED"
  void finish_case(size_t index);
  void clear();                        // erase the status line before printing anything else

  std::string position() const;        // "case 3 of 8, 1m05s elapsed, about 2m10s left"

 private:
  void draw(const std::string& detail);
  std::vector<double> weights_;
  bool terminal_, quiet_;
  std::ostream& out_;
  Clock clock_;
  double start_ = 0, done_weight_ = 0, done_seconds_ = 0;  // done_seconds_: when the last case finished
  size_t current_ = 0;
  std::string id_;
  bool drawn_ = false;
};

}  // namespace attnhost::report
