// attnhost: reads benchmark suites, loads attention plugins, runs, checks and reports them.
#include "cli/app.h"
#include "common/errors.h"
#include "common/log.h"
#include "suite/suite.h"

#include <boost/program_options.hpp>

#include <iostream>

#ifndef ATTNHOST_VERSION
#define ATTNHOST_VERSION "0.0.0"
#endif

namespace po = boost::program_options;
using namespace attnhost;

namespace {

const char* kUsage = R"(usage: attnhost <command> [options]

commands:
  run SUITE.toml            run a benchmark suite
  compare P1 P2 [...]       run plugins side by side on one preset (--config NAME)
  verify [PLUGIN...]        check every plugin (or those named) against the float64 reference
  list configs|plugins|suites [-v]
  info                      devices, driver, CUDA, NCCL and cuDNN versions, plugin folders
  report DIR                write every report of a result folder again (from results.json or .jsonl)
  diff BASELINE CURRENT     classify each case of CURRENT against BASELINE: FASTER SAME SLOWER NEW MISSING MISMATCH
  history FILE [--case P]   the trend of each case over the runs recorded with run --history FILE

run and compare take --baseline FILE (a regression gate: a SLOWER case exits 1), --history FILE,
and run takes --resume DIR (run only the cases missing from DIR, then report them all).

`attnhost <command> --help` describes a command's options.
exit codes: 0 success, 1 a check or the regression gate failed, 2 bad usage or bad input
)";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  cli::Context ctx;
  ctx.argv.assign(argv, argv + argc);
  try {
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
      std::cout << kUsage;
      return args.empty() ? kExitUsage : kExitOk;
    }
    if (args[0] == "--version") {
      std::cout << "attnhost " << ATTNHOST_VERSION << " (plugin ABI " << ATTNHOST_ABI_MAJOR << "." << ATTNHOST_ABI_MINOR
                << ")\n";
      return kExitOk;
    }
    std::string command = args[0];
    std::vector<std::string> rest(args.begin() + 1, args.end());
    if (command == "run") return cli::run_command(ctx, rest);
    if (command == "compare") return cli::compare_command(ctx, rest);
    if (command == "verify") return cli::verify_command(ctx, rest);
    if (command == "list") return cli::list_command(ctx, rest);
    if (command == "info") return cli::info_command(ctx, rest);
    if (command == "report") return cli::report_command(ctx, rest);
    if (command == "diff") return cli::diff_command(ctx, rest);
    if (command == "history") return cli::history_command(ctx, rest);
    if (command == "_case") return cli::isolated_case_command(ctx, rest);
    std::string hint = suite::did_you_mean(command, {"run", "compare", "verify", "list", "info", "report", "diff", "history"});
    throw UsageError("unknown command '" + command + "'" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
                     "; see attnhost --help");
  } catch (const UsageError& e) {
    log::error(e.what());
    return kExitUsage;
  } catch (const suite::SuiteError& e) {
    log::error(e.what());
    return kExitUsage;
  } catch (const po::error& e) {
    log::error(std::string(e.what()) + " (see attnhost " + (args.empty() ? "" : args[0] + " ") + "--help)");
    return kExitUsage;
  } catch (const std::exception& e) {
    log::error(e.what());
    return kExitCheckFailed;
  }
}
