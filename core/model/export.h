// A model's tensors out of tern, in the files other tools read: NumPy's .npz (numpy.load) and
// PyTorch's state_dict file (torch.load), both zip archives (libzip, stored entries) of
// little-endian fp32 arrays. docs/export.md describes both as written here.
//
//   .npz: NAME.npy per tensor (NPY format 1.0, '<f4', C order)
//   .pt:  archive/data.pkl (pickle protocol 2: {NAME: torch._utils._rebuild_tensor_v2(...)}),
//         archive/data/I (tensor I's bytes), archive/version ("3"), as torch.save writes them
//
// Thread-safety: free functions.
#ifndef TERN_CORE_MODEL_EXPORT_H_
#define TERN_CORE_MODEL_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/layout.h"
#include "kernels/registry.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

struct NamedArray {
  std::string name;
  std::vector<int64_t> shape;  // row-major; empty for a scalar
  std::vector<float> values;   // product(shape) of them
};

// The tensors of a bundle, decoded with `codecs` (any codec), shapes as the bundle gives them
// (a tensor without one is 1-D).
absl::StatusOr<std::vector<NamedArray>> ArraysFromBundle(const v1::TensorBundle& bundle,
                                                         const CodecRegistry& codecs);

// The flat vector of `layout` as one array per entry.
std::vector<NamedArray> ArraysFromFlat(const std::vector<ParamTensor>& layout,
                                       const std::vector<float>& values);

// Whether the arrays are a built-in MLP's (fcN.weight as [in, out], each followed by its bias of
// size out, or the one-layer "linear"): the transpose of torch.nn.Linear's [out, in]. A model
// whose every layer is square cannot be told apart and is not one here.
bool IsBuiltinMlpLayout(const std::vector<NamedArray>& arrays);

// Transposes every 2-D ".weight" array: the built-in MLP's layout to torch.nn.Linear's.
void TransposeWeights(std::vector<NamedArray>* arrays);

// One array in NPY format 1.0.
std::string NpyBytes(const NamedArray& a);
// The pickle of a state_dict of these arrays, tensor i stored as archive/data/i.
std::string TorchStateDictPickle(const std::vector<NamedArray>& arrays);

absl::Status WriteNpz(const std::string& path, const std::vector<NamedArray>& arrays);
absl::Status WriteTorchStateDict(const std::string& path, const std::vector<NamedArray>& arrays);

}  // namespace tern

#endif  // TERN_CORE_MODEL_EXPORT_H_
