#include "worker/fragments.h"

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/rng.h"

namespace tern {

uint64_t CutFingerprint(const std::vector<std::vector<Piece>>& lanes) {
  uint64_t h = Mix64(lanes.size());
  for (const std::vector<Piece>& lane : lanes) {
    h = Mix64(h ^ (0x9e3779b97f4a7c15ULL + lane.size()));
    for (const Piece& p : lane) {
      h = Mix64(h ^ p.offset);
      h = Mix64(h ^ p.size);
    }
  }
  return h == 0 ? 1 : h;
}

absl::StatusOr<FragmentCut> ParseFragmentCut(absl::string_view name) {
  for (FragmentCut c : {FragmentCut::kContiguous, FragmentCut::kStrided}) {
    if (name == FragmentCutName(c)) return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--fragment_cut=", name, ": contiguous or strided"));
}

absl::string_view FragmentCutName(FragmentCut cut) {
  return cut == FragmentCut::kStrided ? "strided" : "contiguous";
}

LayerKey LayerOf(absl::string_view tensor_name) {
  const std::vector<absl::string_view> parts = absl::StrSplit(tensor_name, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const absl::string_view p = parts[i];
    if (!p.empty() && std::all_of(p.begin(), p.end(), absl::ascii_isdigit)) {
      return {absl::StrJoin(parts.begin(), parts.begin() + static_cast<ptrdiff_t>(i) + 1, "."),
              true};
    }
  }
  const size_t dot = tensor_name.rfind('.');
  return {std::string(dot == absl::string_view::npos ? tensor_name : tensor_name.substr(0, dot)),
          false};
}

std::vector<std::vector<size_t>> StridedFragments(const std::vector<ParamTensor>& layout,
                                                  int fragments) {
  const size_t p = static_cast<size_t>(std::max(1, fragments));
  struct Layer {
    bool numbered = false;
    uint64_t numel = 0;
    std::vector<size_t> tensors;
  };
  std::vector<Layer> layers;  // in order of first appearance
  std::map<std::string, size_t> index;
  size_t t = 0;
  for (const ParamTensor& tensor : layout) {
    if (tensor.numel == 0) continue;  // not a block
    const LayerKey key = LayerOf(tensor.name);
    auto [it, fresh] = index.emplace(key.key, layers.size());
    if (fresh) layers.push_back({key.numbered, 0, {}});
    Layer& layer = layers[it->second];
    layer.numel += tensor.numel;
    layer.tensors.push_back(t++);
  }
  const bool any_numbered =
      std::any_of(layers.begin(), layers.end(), [](const Layer& l) { return l.numbered; });
  std::vector<std::vector<size_t>> out(p);
  std::vector<uint64_t> filled(p, 0);
  auto give = [&](const Layer& layer, size_t f) {
    out[f].insert(out[f].end(), layer.tensors.begin(), layer.tensors.end());
    filled[f] += layer.numel;
  };
  size_t dealt = 0;
  for (const Layer& layer : layers) {
    if (layer.numbered || !any_numbered) give(layer, dealt++ % p);
  }
  for (const Layer& layer : layers) {
    if (layer.numbered || !any_numbered) continue;
    give(layer,
         static_cast<size_t>(std::min_element(filled.begin(), filled.end()) - filled.begin()));
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const auto& f) { return f.empty(); }),
            out.end());
  for (auto& f : out) std::sort(f.begin(), f.end());
  std::sort(out.begin(), out.end());  // by first tensor (fragments never share one)
  return out;
}

}  // namespace tern
