// How the engine cuts a model into lanes: buckets and diloco's fragments (Streaming DiLoCo).
// A lane is a set of whole tensors; `contiguous` lanes are runs of tensors of about equal size
// from the last back (as a backward pass finishes them), `strided` lanes deal the model's layers
// out in turn, layer l to fragment l mod P, so every fragment spans the depth (the paper's cut).
//
// Thread-safety: pure functions.
#ifndef TERN_WORKER_FRAGMENTS_H_
#define TERN_WORKER_FRAGMENTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/layout.h"

namespace tern {

// A run of the model's values: [offset, offset + size).
struct Piece {
  uint64_t offset = 0, size = 0;
};

// A fingerprint of a model cut into lanes (each lane's runs, in order): every message of a cut
// model carries its sender's, and a receiver that cuts another way refuses it, where lanes of
// equal sizes would otherwise be mixed value for wrong value. Never 0 (0: a sender that does
// not say).
uint64_t CutFingerprint(const std::vector<std::vector<Piece>>& lanes);

enum class FragmentCut {
  kContiguous,  // runs of whole tensors of about equal size
  kStrided,     // layer l in fragment l mod P
};
absl::StatusOr<FragmentCut> ParseFragmentCut(absl::string_view name);
absl::string_view FragmentCutName(FragmentCut cut);

// The layer a tensor belongs to, from its name: the path up to its first numeric part
// ("blocks.3.attn.weight" → "blocks.3", numbered) or, without one, its module ("ln.weight" →
// "ln", not numbered).
struct LayerKey {
  std::string key;
  bool numbered = false;
};
LayerKey LayerOf(absl::string_view tensor_name);

// Fragment k's tensors (indices into `layout`'s tensors with values, in order, as the engine's
// blocks are), ascending, for `fragments` strided fragments: the numbered layers (the repeated
// blocks, in order of appearance) dealt out in turn, layer i to fragment i mod P; then each other
// layer (embeddings, the last norm, the head), in model order, to the fragment with the fewest
// values so far. A model with no numbered layer deals all of its layers out in turn. Empty
// fragments are left out, and fragments are ordered by their first tensor.
std::vector<std::vector<size_t>> StridedFragments(const std::vector<ParamTensor>& layout,
                                                  int fragments);

}  // namespace tern

#endif  // TERN_WORKER_FRAGMENTS_H_
