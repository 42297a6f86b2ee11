// A model's parameters as named tensors over one flat float vector: what the worker, the
// aggregator and every client agree on before any value moves.
//
// Thread-safety: plain values.
#ifndef TERN_CORE_MODEL_LAYOUT_H_
#define TERN_CORE_MODEL_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tern {

struct ParamTensor {
  std::string name;            // "fc1.weight"
  std::vector<int64_t> shape;  // the built-in models store weights [in, out] row-major
  size_t offset = 0;           // into the flat parameter vector
  size_t numel = 0;
};

// The length of the flat vector `layout` covers (its last tensor's end).
inline size_t LayoutNumel(const std::vector<ParamTensor>& layout) {
  return layout.empty() ? 0 : layout.back().offset + layout.back().numel;
}

}  // namespace tern

#endif  // TERN_CORE_MODEL_LAYOUT_H_
