#include "runtime/isolate.h"

#include "common/errors.h"
#include "common/json.h"
#include "plugins/loader.h"
#include "report/serialize.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

namespace attnhost {

namespace fs = std::filesystem;

namespace {

std::string last_lines(const fs::path& log, int n) {
  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  std::string out;
  for (size_t i = lines.size() > static_cast<size_t>(n) ? lines.size() - n : 0; i < lines.size(); ++i)
    out += (out.empty() ? "" : " | ") + lines[i];
  return out;
}

// Starts `exe args...` with stdout and stderr going to `log`, in its own process group.
pid_t spawn(const std::string& exe, const std::vector<std::string>& args, const fs::path& log) {
  pid_t pid = ::fork();
  if (pid < 0) throw RuntimeFailure(ATTNHOST_ERR_INTERNAL, std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(exe.c_str()));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    std::_Exit(127);
  }
  return pid;
}

}  // namespace

CaseResult run_case_isolated(const suite::Case& c, const IsolateOptions& options) {
  fs::path dir = fs::temp_directory_path() / ("attnhost-isolate-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path case_file = dir / "case.json", result_file = dir / "runs.jsonl", log = dir / "output.log";
  CaseResult spec;
  spec.spec = c;
  std::ofstream(case_file) << report::to_json(spec).dump() << "\n";
  fs::remove(result_file);

  std::vector<std::string> args = {"_case", case_file.string(), result_file.string()};
  args.insert(args.end(), options.child_args.begin(), options.child_args.end());
  pid_t pid = spawn((executable_dir() / "attnhost").string(), args, log);

  int status = 0;
  bool timed_out = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options.timeout_seconds);
  while (true) {
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(-pid, SIGKILL);  // the whole group: the child's rank threads and anything it started
      ::waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  // One line per finished world size, each a case record holding that run.
  CaseResult result;
  result.spec = c;
  std::ifstream in(result_file);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    CaseResult one = report::case_from_json(json::parse(line));
    result.plugin_version = one.plugin_version;
    result.device = one.device;
    result.runs.insert(result.runs.end(), one.runs.begin(), one.runs.end());
  }

  std::string why;
  if (timed_out) {
    std::ostringstream s;
    s << "killed after the " << options.timeout_seconds << " s time limit";
    why = s.str();
  } else if (WIFSIGNALED(status)) {
    why = "the case's process died of signal " + std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) + ")";
  } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0 && result.runs.size() < c.world_sizes.size()) {
    why = "the case's process exited with code " + std::to_string(WEXITSTATUS(status));
  }
  // World sizes the child never finished.
  for (size_t i = result.runs.size(); i < c.world_sizes.size(); ++i) {
    RunResult r;
    r.world_size = c.world_sizes[i];
    r.status = timed_out ? "TIMEOUT" : "CRASHED";
    r.error = why.empty() ? "the case's process ended without a result" : why;
    std::string tail = last_lines(log, 3);
    if (!tail.empty()) r.error += "; last output: " + tail;
    result.runs.push_back(std::move(r));
  }
  fs::remove_all(dir);
  return result;
}

int isolated_child(const std::string& case_file, const std::string& result_file, const RunOne& run) {
  std::ifstream in(case_file);
  std::stringstream text;
  text << in.rdbuf();
  CaseResult spec = report::case_from_json(json::parse(text.str()));
  std::ofstream out(result_file, std::ios::app);
  run(spec.spec, [&](const CaseResult& one) {
    out << report::to_json(one).dump() << "\n" << std::flush;  // flushed: a crash later keeps it
  });
  return 0;
}

}  // namespace attnhost
