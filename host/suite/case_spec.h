// A [[case]] as read, before expansion into Cases: what [defaults] gave it, what it wrote itself,
// and where each thing was written. Internal to the suite library.
#pragma once

#include "suite/params.h"
#include "suite/problem_fields.h"

#include <toml++/toml.h>

#include <optional>
#include <string>
#include <vector>

namespace attnhost::suite::detail {

struct Named {
  std::string name;
  SourceLocation where;
};

// What [defaults] and a [[case]] may both write. A case starts from a copy of the defaults:
// plugins, world_sizes and each problem field are replaced, timing/check/data and each plugin
// parameter are overridden key by key.
struct Scope {
  std::vector<Named> plugins;
  Settings fields;  // problem fields
  std::optional<SeqlenSpec> varlen;
  SourceLocation varlen_where;
  PluginParams params;
  std::vector<int> world_sizes;  // empty: not written (the machine's, Case::machine_world_sizes)
  Timing timing;
  Check check;
  Data data;
};

struct CaseSpec {
  SourceLocation where;  // the [[case]] header
  std::string name;      // "" unless written
  std::vector<Named> presets;  // sets expanded; empty for an inline problem
  Scope scope;                 // effective: defaults merged with what the case wrote
  Settings own_fields;         // problem fields the case wrote itself (named in preset case ids)
  bool own_varlen = false;
};

// Reads [defaults] (its problem fields fill inline cases only: a preset is a whole problem).
Scope read_defaults(const toml::node& node, const PresetLibrary& library, const PluginCatalog& catalog);

// Reads one [[case]] on top of the defaults.
CaseSpec read_case(const toml::node& node, const Scope& defaults, const PresetLibrary& library,
                   const PluginCatalog& catalog);

// Expands a case into plugins x presets x sweep points, each problem checked.
std::vector<Case> expand_case(const CaseSpec& spec, const PresetLibrary& library,
                              const PluginCatalog& catalog);

// Keys of [defaults] (a [[case]] also takes name and presets).
std::vector<std::string> scope_keys();

} // namespace attnhost::suite::detail
