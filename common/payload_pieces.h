// A payload read in place: bytes in pieces that other objects own (a received message's gRPC
// slices), kept alive by this. What a receiver holds instead of copying a large payload into one
// string; a reader that needs the bytes in one place flattens them (one copy, at that reader).
//
// Thread-safety: immutable once built; copies share the owners.
#ifndef TERN_COMMON_PAYLOAD_PIECES_H_
#define TERN_COMMON_PAYLOAD_PIECES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tern {

struct PayloadPieces {
  std::vector<absl::string_view> pieces;            // in order, none empty
  std::vector<std::shared_ptr<const void>> owners;  // keep `pieces` valid
  uint64_t size = 0;                                // the pieces' bytes in all

  bool empty() const { return size == 0; }
  // Appends `piece`, kept valid by `owner` (added unless it is the last owner added).
  void Append(absl::string_view piece, const std::shared_ptr<const void>& owner);
  // The bytes in one string.
  std::string Flatten() const;
};

}  // namespace tern

#endif  // TERN_COMMON_PAYLOAD_PIECES_H_
