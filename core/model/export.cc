#include "core/model/export.h"

#include <zip.h>

#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"

namespace tern {

namespace {

constexpr uint64_t kMaxExportParams = uint64_t{1} << 34;

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// The few pickle opcodes a state_dict needs (protocol 2, as torch.save writes it).
class Pickler {
 public:
  Pickler() { out_ = "\x80\x02"; }
  void Mark() { out_ += '('; }
  void Str(absl::string_view s) {
    out_ += 'X';
    PutLe(&out_, s.size(), 4);
    out_.append(s.data(), s.size());
  }
  void Global(absl::string_view module, absl::string_view name) {
    absl::StrAppend(&out_, "c", module, "\n", name, "\n");
  }
  void Int(int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      PutLe(&out_, static_cast<uint64_t>(v), 1);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      PutLe(&out_, static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
    } else {
      out_ += "\x8a\x08";  // LONG1, 8 bytes two's complement
      PutLe(&out_, static_cast<uint64_t>(v), 8);
    }
  }
  // A tuple of the items pushed since the matching Mark().
  void TupleFromMark() { out_ += 't'; }
  void IntTuple(const std::vector<int64_t>& v) {
    Mark();
    for (int64_t x : v) Int(x);
    TupleFromMark();
  }
  void False() { out_ += '\x89'; }
  void EmptyTuple() { out_ += ')'; }
  void EmptyDict() { out_ += '}'; }
  void Reduce() { out_ += 'R'; }
  void PersistentId() { out_ += 'Q'; }
  void SetItems() { out_ += 'u'; }
  std::string Finish() { return out_ + '.'; }

 private:
  std::string out_;
};

// Row-major strides of `shape`, in elements.
std::vector<int64_t> Strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

std::string RawBytes(const std::vector<float>& v) {
  // Little-endian fp32 on every machine tern builds for (x86-64, aarch64).
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

absl::Status WriteZip(const std::string& path,
                      std::vector<std::pair<std::string, std::string>> entries) {
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  if (z == nullptr) {
    zip_error_t e;
    zip_error_init_with_code(&e, err);
    absl::Status s =
        absl::InternalError(absl::StrCat("cannot create ", path, ": ", zip_error_strerror(&e)));
    zip_error_fini(&e);
    return s;
  }
  for (const auto& [name, bytes] : entries) {
    // The archive takes the bytes when it is closed: they live in `entries` until then.
    zip_source_t* src = zip_source_buffer(z, bytes.data(), bytes.size(), 0);
    const zip_int64_t index =
        src == nullptr ? -1 : zip_file_add(z, name.c_str(), src, ZIP_FL_ENC_UTF_8);
    if (index < 0) {
      if (src != nullptr) zip_source_free(src);
      absl::Status s = absl::InternalError(
          absl::StrCat("cannot add ", name, " to ", path, ": ", zip_strerror(z)));
      zip_discard(z);
      return s;
    }
    zip_set_file_compression(z, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0);
  }
  if (zip_close(z) != 0) {
    absl::Status s =
        absl::InternalError(absl::StrCat("cannot write ", path, ": ", zip_strerror(z)));
    zip_discard(z);
    return s;
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<NamedArray> ArraysFromFlat(const std::vector<ParamTensor>& layout,
                                       const std::vector<float>& values) {
  std::vector<NamedArray> out;
  out.reserve(layout.size());
  for (const ParamTensor& t : layout) {
    NamedArray a;
    a.name = t.name;
    a.shape = t.shape.empty() ? std::vector<int64_t>{static_cast<int64_t>(t.numel)} : t.shape;
    a.values.assign(values.begin() + static_cast<ptrdiff_t>(t.offset),
                    values.begin() + static_cast<ptrdiff_t>(t.offset + t.numel));
    out.push_back(std::move(a));
  }
  return out;
}

absl::StatusOr<std::vector<NamedArray>> ArraysFromBundle(const v1::TensorBundle& bundle,
                                                         const CodecRegistry& codecs) {
  TERN_ASSIGN_OR_RETURN(std::vector<ParamTensor> layout,
                        LayoutFromBundle(bundle, kMaxExportParams));
  std::vector<float> flat(LayoutNumel(layout));
  TERN_RETURN_IF_ERROR(BundleToFlat(bundle, layout, codecs, absl::MakeSpan(flat)));
  return ArraysFromFlat(layout, flat);
}

bool IsBuiltinMlpLayout(const std::vector<NamedArray>& arrays) {
  if (arrays.empty() || arrays.size() % 2 != 0) return false;
  bool any_not_square = false;
  for (size_t i = 0; i < arrays.size(); i += 2) {
    const std::string layer = arrays.size() == 2 ? "linear" : absl::StrCat("fc", i / 2 + 1);
    const NamedArray& w = arrays[i];
    const NamedArray& b = arrays[i + 1];
    if (w.name != layer + ".weight" || b.name != layer + ".bias" || w.shape.size() != 2 ||
        b.shape.size() != 1 || b.shape[0] != w.shape[1]) {
      return false;
    }
    if (i > 0 && arrays[i - 2].shape[1] != w.shape[0]) return false;  // [in, out] chains
    any_not_square = any_not_square || w.shape[0] != w.shape[1];
  }
  return any_not_square;
}

void TransposeWeights(std::vector<NamedArray>* arrays) {
  for (NamedArray& a : *arrays) {
    if (a.shape.size() != 2 || !absl::EndsWith(a.name, ".weight")) continue;
    const size_t rows = static_cast<size_t>(a.shape[0]), cols = static_cast<size_t>(a.shape[1]);
    std::vector<float> t(a.values.size());
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = 0; c < cols; ++c) t[c * rows + r] = a.values[r * cols + c];
    }
    a.values = std::move(t);
    std::swap(a.shape[0], a.shape[1]);
  }
}

std::string NpyBytes(const NamedArray& a) {
  std::string shape = "(";
  for (int64_t d : a.shape) absl::StrAppend(&shape, d, a.shape.size() == 1 ? ",)" : ", ");
  if (a.shape.size() != 1) {
    if (a.shape.size() > 1) shape.resize(shape.size() - 2);
    shape += ')';
  }
  std::string header =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': ", shape, ", }");
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of
  // 64 bytes and ended by a newline, as numpy writes it.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  PutLe(&out, header.size(), 2);
  out += header;
  out += RawBytes(a.values);
  return out;
}

std::string TorchStateDictPickle(const std::vector<NamedArray>& arrays) {
  Pickler p;
  p.EmptyDict();
  p.Mark();
  for (size_t i = 0; i < arrays.size(); ++i) {
    const NamedArray& a = arrays[i];
    p.Str(a.name);
    p.Global("torch._utils", "_rebuild_tensor_v2");
    p.Mark();
    // The storage, by persistent id: ('storage', torch.FloatStorage, key, 'cpu', numel).
    p.Mark();
    p.Str("storage");
    p.Global("torch", "FloatStorage");
    p.Str(absl::StrCat(i));
    p.Str("cpu");
    p.Int(static_cast<int64_t>(a.values.size()));
    p.TupleFromMark();
    p.PersistentId();
    p.Int(0);  // storage offset
    p.IntTuple(a.shape);
    p.IntTuple(Strides(a.shape));
    p.False();                               // requires_grad
    p.Global("collections", "OrderedDict");  // backward hooks: none
    p.EmptyTuple();
    p.Reduce();
    p.TupleFromMark();
    p.Reduce();
  }
  p.SetItems();
  return p.Finish();
}

absl::Status WriteNpz(const std::string& path, const std::vector<NamedArray>& arrays) {
  std::vector<std::pair<std::string, std::string>> entries;
  for (const NamedArray& a : arrays) entries.emplace_back(a.name + ".npy", NpyBytes(a));
  return WriteZip(path, std::move(entries));
}

absl::Status WriteTorchStateDict(const std::string& path, const std::vector<NamedArray>& arrays) {
  std::vector<std::pair<std::string, std::string>> entries;
  entries.emplace_back("archive/data.pkl", TorchStateDictPickle(arrays));
  for (size_t i = 0; i < arrays.size(); ++i) {
    entries.emplace_back(absl::StrCat("archive/data/", i), RawBytes(arrays[i].values));
  }
  entries.emplace_back("archive/version", "3\n");
  return WriteZip(path, std::move(entries));
}

}  // namespace tern
