// tern export: a model out of tern, as NumPy's .npz or PyTorch's state_dict file
// (core/model/export.h, docs/export.md). It reads what the daemons and tern run leave behind:
//   a run folder (its final-model.pb), a model file (tern worker --final_model), an aggregator
//   checkpoint (--checkpoint), or a worker's snapshot folder (--snapshot_dir: the latest step,
//   or --step).
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "core/model/export.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/builtin.h"
#include "server/state_store.h"
#include "tern/internal/checkpoint.pb.h"

ABSL_FLAG(std::string, from, "",
          "export: a run folder, a model file (--final_model), an aggregator checkpoint or a "
          "worker's snapshot folder");
ABSL_FLAG(int64_t, step, -1, "export: which snapshot of a snapshot folder (-1: the latest)");
ABSL_FLAG(std::string, layout, "auto",
          "export: auto|torch|as-is: torch transposes the built-in MLP's [in, out] weights to "
          "torch.nn.Linear's [out, in]; auto does so when the model is the built-in MLP");
ABSL_DECLARE_FLAG(std::string, out);

namespace tern {

namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A file is an aggregator checkpoint when it parses as one of a known format with a model, else
// a model bundle when it parses as one with tensors (the two messages' fields do not overlap in
// a way that makes one look like the other).
absl::StatusOr<std::vector<NamedArray>> FromFile(const std::string& path,
                                                 const CodecRegistry& codecs) {
  TERN_ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path));
  bool framed = false;
  absl::StatusOr<internal::AggregatorCheckpoint> ckpt = StateStore::ParseSnapshot(bytes, &framed);
  if (ckpt.ok() && ckpt->format() >= 2 && ckpt->model().tensors_size() > 0) {
    return ArraysFromBundle(ckpt->model(), codecs);
  }
  if (framed && !ckpt.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", ckpt.status().message()));
  }
  v1::TensorBundle bundle;
  if (bundle.ParseFromString(bytes) && bundle.tensors_size() > 0) {
    return ArraysFromBundle(bundle, codecs);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, " is neither a model file nor an aggregator checkpoint"));
}

// DIR/layout.json ({"tensors":[{name, shape, offset, numel}], "steps":[...]}) and DIR/step-S.f32.
absl::StatusOr<std::vector<NamedArray>> FromSnapshots(const std::string& dir, int64_t step) {
  TERN_ASSIGN_OR_RETURN(const std::string json, ReadFile(dir + "/layout.json"));
  google::protobuf::Struct layout_json;
  if (!google::protobuf::util::JsonStringToMessage(json, &layout_json).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/layout.json does not parse"));
  }
  const auto& fields = layout_json.fields();
  if (!fields.count("tensors") || !fields.count("steps")) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/layout.json lacks tensors or steps"));
  }
  std::vector<ParamTensor> layout;
  for (const auto& v : fields.at("tensors").list_value().values()) {
    const auto& t = v.struct_value().fields();
    ParamTensor p;
    p.name = t.count("name") ? t.at("name").string_value() : "";
    if (t.count("shape")) {
      for (const auto& d : t.at("shape").list_value().values()) {
        p.shape.push_back(static_cast<int64_t>(d.number_value()));
      }
    }
    p.offset = t.count("offset") ? static_cast<size_t>(t.at("offset").number_value()) : 0;
    p.numel = t.count("numel") ? static_cast<size_t>(t.at("numel").number_value()) : 0;
    layout.push_back(std::move(p));
  }
  int64_t latest = -1;
  for (const auto& s : fields.at("steps").list_value().values()) {
    latest = std::max(latest, static_cast<int64_t>(s.number_value()));
  }
  const int64_t want = step >= 0 ? step : latest;
  if (want < 0) return absl::NotFoundError(absl::StrCat(dir, " holds no snapshot"));
  TERN_ASSIGN_OR_RETURN(const std::string raw, ReadFile(absl::StrCat(dir, "/step-", want, ".f32")));
  if (raw.size() != 4 * LayoutNumel(layout)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/step-", want, ".f32 holds ", raw.size(),
                                                   " bytes; its layout needs ",
                                                   4 * LayoutNumel(layout)));
  }
  std::vector<float> values(LayoutNumel(layout));
  std::memcpy(values.data(), raw.data(), raw.size());
  return ArraysFromFlat(layout, values);
}

absl::StatusOr<std::vector<NamedArray>> Load(const std::string& from, int64_t step,
                                             const CodecRegistry& codecs) {
  if (!IsDirectory(from)) return FromFile(from, codecs);
  if (FileExists(from + "/final-model.pb")) return FromFile(from + "/final-model.pb", codecs);
  if (FileExists(from + "/layout.json")) return FromSnapshots(from, step);
  return absl::NotFoundError(absl::StrCat(
      from, " holds neither final-model.pb (a run folder) nor layout.json (a snapshot folder)"));
}

}  // namespace

int ExportMain() {
  const std::string from = absl::GetFlag(FLAGS_from), out = absl::GetFlag(FLAGS_out);
  const std::string layout = absl::GetFlag(FLAGS_layout);
  const bool npz = absl::EndsWith(out, ".npz");
  if (from.empty() || (!npz && !absl::EndsWith(out, ".pt") && !absl::EndsWith(out, ".pth")) ||
      (layout != "auto" && layout != "torch" && layout != "as-is")) {
    std::fprintf(stderr,
                 "tern export: need --from=PATH and --out=FILE.npz or FILE.pt "
                 "(--layout=auto|torch|as-is)\n");
    return 2;
  }
  const std::unique_ptr<CodecRegistry> codecs = NewBuiltinCodecRegistry();
  absl::StatusOr<std::vector<NamedArray>> arrays = Load(from, absl::GetFlag(FLAGS_step), *codecs);
  if (!arrays.ok()) {
    std::fprintf(stderr, "tern export: %s\n", arrays.status().ToString().c_str());
    return 1;
  }
  const bool transpose = layout == "torch" || (layout == "auto" && IsBuiltinMlpLayout(*arrays));
  if (transpose) TransposeWeights(&*arrays);
  absl::Status s = npz ? WriteNpz(out, *arrays) : WriteTorchStateDict(out, *arrays);
  if (!s.ok()) {
    std::fprintf(stderr, "tern export: %s\n", s.ToString().c_str());
    return 1;
  }
  size_t params = 0;
  for (const NamedArray& a : *arrays) params += a.values.size();
  std::printf("%s: %zu tensors, %zu parameters%s\n", out.c_str(), arrays->size(), params,
              transpose ? " (weights as torch.nn.Linear's [out, in])" : "");
  return 0;
}

}  // namespace tern
