// Packed variable-length problems: reading a [varlen] table and drawing its lengths. The draw is
// a pure function of the spec (seed included) with its own generator and distributions, so the
// same suite gives the same lengths on every machine and standard library. Internal.
#pragma once

#include "suite/suite.h"

#include <toml++/toml.h>

namespace attnhost::suite::detail {

// Reads and checks a varlen table; a distribution is drawn at once, so `lengths` is always the
// list the case runs.
SeqlenSpec read_varlen(const toml::node& node);

// The lengths of a distribution: whole sequences drawn until total_tokens is reached, each
// within [min_length, max_length]; the last takes what remains of the budget.
std::vector<int64_t> draw_lengths(const SeqlenSpec& spec);

// Makes `problem` the packed problem of `spec`: batch 1, seqlen = the total of the lengths.
void apply_varlen(Problem& problem, const SeqlenSpec& spec);

} // namespace attnhost::suite::detail
