#include "common/payload_pieces.h"

namespace tern {

void PayloadPieces::Append(absl::string_view piece, const std::shared_ptr<const void>& owner) {
  if (piece.empty()) return;
  pieces.push_back(piece);
  size += piece.size();
  if (owners.empty() || owners.back() != owner) owners.push_back(owner);
}

std::string PayloadPieces::Flatten() const {
  std::string out;
  out.reserve(size);
  for (absl::string_view p : pieces) out.append(p.data(), p.size());
  return out;
}

}  // namespace tern
