// Options shared by several commands, and their parsing with Boost.Program_options.
#pragma once

#include "cli/app.h"

#include <boost/program_options.hpp>

#include <string>
#include <vector>

namespace attnhost::cli {

namespace po = boost::program_options;

po::options_description common_options(CommonOptions& o);
po::options_description timing_options();   // --timing-method, --warmup-runs, --warmup-seconds, --timing-runs, --rounds, --world-sizes
po::options_description problem_options();  // --batch --seqlen --heads --kv-heads --head-dim --dtype --causal ...
po::options_description output_options();   // --out --format
po::options_description gate_options();     // --baseline --threshold --history
double parse_threshold(const std::string& text);  // "20" or "20%" -> 0.2; throws UsageError

// Parses args against desc (+ positionals); prints help and returns false on --help.
bool parse(const std::vector<std::string>& args, const po::options_description& desc,
           const po::positional_options_description& positional, po::variables_map& vm, const std::string& usage);

// --quiet, --debug and --comm-timeout, once the command line is parsed.
void apply_common(Context& ctx, const po::variables_map& vm);

suite::Overrides overrides_from(const po::variables_map& vm);
std::vector<int> parse_int_list(const std::string& text, const char* option);

}  // namespace attnhost::cli
