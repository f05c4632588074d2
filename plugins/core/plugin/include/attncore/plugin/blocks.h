// Strided blocks (the ABI's attnhost_block): the rows of a tensor that go to or come from one peer,
// sent as they lie where the host moves blocks (attnhost::Host::blocks()), else packed by the
// engine's copy kernel into a contiguous message.
#pragma once

#include "attncore/plugin/engine.h"

#include <attnhost/plugin.h>

namespace attncore::plugin {

// `slices` slices of `rows` rows of `width` bytes; row r of slice s at data + s * slice_pitch + r * pitch.
inline attnhost_block make_block(void* data, size_t width, size_t rows, size_t pitch, size_t slices = 1,
                                 size_t slice_pitch = 0) {
  return {ATTNHOST_STRUCT_SIZE(attnhost_block, slice_pitch), data, width, rows, pitch, slices, slice_pitch};
}

// A contiguous block of `like`'s shape at `data` (its place in a packed message).
inline attnhost_block packed_like(char* data, const attnhost_block& like) {
  return make_block(data, like.width, like.rows, like.width, like.slices, like.width * like.rows);
}

inline size_t block_bytes(const attnhost_block& b) { return b.width * b.rows * b.slices; }

// dst = src, two blocks of one shape, by the copy kernel: one 2-D copy where both blocks' slices
// follow on at their row pitch, or both blocks' rows are contiguous; else one 3-D copy.
inline void copy_block(Engine& e, const attnhost_block& dst, const attnhost_block& src, void* stream) {
  const auto slices_on = [](const attnhost_block& b) { return b.slices == 1 || b.slice_pitch == b.rows * b.pitch; };
  const auto rows_on = [](const attnhost_block& b) { return b.rows == 1 || b.pitch == b.width; };
  if (slices_on(dst) && slices_on(src))
    return e.copy_rows(dst.data, dst.pitch, src.data, src.pitch, src.width, src.rows * src.slices, stream);
  if (rows_on(dst) && rows_on(src))
    return e.copy_rows(dst.data, dst.slice_pitch, src.data, src.slice_pitch, src.width * src.rows, src.slices, stream);
  e.copy_slices(dst.data, dst.pitch, dst.slice_pitch, src.data, src.pitch, src.slice_pitch, src.width, src.rows,
                src.slices, stream);
}

}  // namespace attncore::plugin
