#include "runtime/kernel_profiler.h"

namespace attnhost {

std::string kernel_display_name(std::string name) {
  // The parameter list is the parenthesis that closes the name; one found from the front may be
  // "(anonymous namespace)" or a template argument's.
  if (!name.empty() && name.back() == ')') {
    int depth = 0;
    for (size_t i = name.size(); i-- > 0;) {
      if (name[i] == ')') ++depth;
      else if (name[i] == '(' && --depth == 0) {
        name.resize(i);
        break;
      }
    }
  }
  static const std::string kAnonymous = "(anonymous namespace)::";
  for (size_t at; (at = name.find(kAnonymous)) != std::string::npos;) name.erase(at, kAnonymous.size());
  if (name.rfind("void ", 0) == 0) name = name.substr(5);
  if (name.size() > 96) name = name.substr(0, 93) + "...";
  return name;
}

}  // namespace attnhost
