// Errors a user can cause, and the exit codes they map to (documented in README.md).
#pragma once

#include <stdexcept>
#include <string>

namespace attnhost {

enum ExitCode : int {
  kExitOk = 0,           // everything ran and every check passed
  kExitCheckFailed = 1,  // a correctness check, a case error, or the regression gate failed
  kExitUsage = 2,        // bad usage or bad input (command line, suite, plugin folder)
};

// Bad command line or input file: printed as one line, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An error a plugin returned through the ABI (code is an attnhost_status).
struct PluginError : std::runtime_error {
  PluginError(int code, const std::string& message) : std::runtime_error(message), code(code) {}
  int code;
};

// A device or communicator failure inside the host.
struct RuntimeFailure : std::runtime_error {
  RuntimeFailure(int code, const std::string& message) : std::runtime_error(message), code(code) {}
  int code; // attnhost_status
};

}  // namespace attnhost
