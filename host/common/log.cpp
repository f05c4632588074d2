#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace attnhost::log {
namespace {
std::atomic<bool> g_quiet{false};
std::atomic<bool> g_verbose{false};
std::mutex g_mutex;
std::string g_prefix = "attnhost";
}  // namespace

void set_quiet(bool quiet) { g_quiet = quiet; }
void set_verbose(bool verbose) { g_verbose = verbose; }
void set_prefix(std::string prefix) {
  std::lock_guard lock(g_mutex);
  g_prefix = std::move(prefix);
}

void write(Level level, const std::string& message) {
  if (level == Level::info && g_quiet) return;
  if (level == Level::debug && !g_verbose) return;
  const char* tag = level == Level::warning ? "warning: " : level == Level::error ? "error: " : "";
  std::lock_guard lock(g_mutex);
  std::fprintf(stderr, "%s: %s%s\n", g_prefix.c_str(), tag, message.c_str());
  std::fflush(stderr);
}

}  // namespace attnhost::log
