// toml++ is used with TOML_HEADER_ONLY=0 (set on the attnhost_toml target): its implementation
// is compiled once, here, and every other translation unit sees only declarations.
#define TOML_IMPLEMENTATION
#include <toml++/toml.h>
