// One-line diagnostics on stderr, prefixed with the program name; serialized across rank threads.
#pragma once

#include <string>

namespace attnhost::log {

enum class Level { debug, info, warning, error };

void set_quiet(bool quiet);     // drops info lines
void set_verbose(bool verbose); // keeps debug lines
void set_prefix(std::string prefix); // e.g. "attnhost[rank 1]" under MPI
void write(Level level, const std::string& message);

inline void info(const std::string& m) { write(Level::info, m); }
inline void warn(const std::string& m) { write(Level::warning, m); }
inline void error(const std::string& m) { write(Level::error, m); }
inline void debug(const std::string& m) { write(Level::debug, m); }

}  // namespace attnhost::log
