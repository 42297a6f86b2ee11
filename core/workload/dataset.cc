#include "core/workload/dataset.h"

#include <zlib.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/rng.h"
#include "common/status_macros.h"

namespace tern {
namespace {

constexpr float kMean = 0.2860f;
constexpr float kStd = 0.3530f;
constexpr size_t kMaxIdxBytes = size_t{1} << 30;

uint32_t BigEndian32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  TERN_ASSIGN_OR_RETURN(std::string bytes, ReadGzipFile(path, kMaxIdxBytes));
  auto parsed = ParseIdx(bytes, kMaxIdxBytes);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", parsed.status().message()));
  }
  return parsed;
}

absl::StatusOr<Dataset> LoadSplit(const std::string& dir, absl::string_view prefix) {
  const std::string images_path = absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz");
  const std::string labels_path = absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz");
  TERN_ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(images_path));
  TERN_ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(labels_path));
  if (images.dims.size() != 3 || labels.dims.size() != 1 || images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, " and ", labels_path, " do not hold matching images/labels"));
  }
  Dataset d;
  d.dim = size_t{images.dims[1]} * images.dims[2];
  d.num_classes = 10;
  d.source = dir;
  d.labels = std::move(labels.data);
  for (uint8_t y : d.labels) {
    if (y >= d.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", int{y}, " >= 10"));
    }
  }
  d.features.resize(images.data.size());
  for (size_t i = 0; i < images.data.size(); ++i) {
    d.features[i] = (images.data[i] / 255.0f - kMean) / kStd;
  }
  return d;
}

}  // namespace

absl::StatusOr<IdxArray> ParseIdx(absl::string_view bytes, size_t max_elements) {
  ByteReader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  uint8_t zero0, zero1, type, rank;
  if (!r.U8(&zero0) || !r.U8(&zero1) || !r.U8(&type) || !r.U8(&rank)) {
    return absl::InvalidArgumentError("IDX: truncated magic");
  }
  if (zero0 != 0 || zero1 != 0) return absl::InvalidArgumentError("IDX: bad magic");
  if (type != 0x08) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDX: element type 0x", absl::Hex(type), " (only unsigned bytes, 0x08)"));
  }
  if (rank < 1 || rank > 4)
    return absl::InvalidArgumentError(absl::StrCat("IDX: rank ", int{rank}));
  IdxArray out;
  uint64_t count = 1;
  for (int i = 0; i < rank; ++i) {
    const uint8_t* p = r.Take(4);
    if (p == nullptr) return absl::InvalidArgumentError("IDX: truncated dimensions");
    const uint32_t d = BigEndian32(p);
    out.dims.push_back(d);
    count *= d;
    if (count > max_elements) {
      return absl::InvalidArgumentError(absl::StrCat("IDX: more than ", max_elements, " elements"));
    }
  }
  if (r.remaining() != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDX: expected ", count, " data bytes, found ", r.remaining()));
  }
  out.data.assign(r.ptr(), r.ptr() + count);
  return out;
}

absl::StatusOr<std::string> ReadGzipFile(const std::string& path, size_t max_bytes) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string out;
  char buf[1 << 16];
  while (true) {
    const int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int errnum = 0;
      const std::string msg = gzerror(f, &errnum);
      gzclose(f);
      return absl::InvalidArgumentError(absl::StrCat(path, ": corrupt gzip: ", msg));
    }
    if (n == 0) break;
    if (out.size() + n > max_bytes) {
      gzclose(f);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": inflates past ", max_bytes, " bytes"));
    }
    out.append(buf, n);
  }
  gzclose(f);
  return out;
}

absl::StatusOr<TrainTest> LoadFashionMnist(const std::string& dir) {
  TrainTest t;
  TERN_ASSIGN_OR_RETURN(t.train, LoadSplit(dir, "train"));
  TERN_ASSIGN_OR_RETURN(t.test, LoadSplit(dir, "t10k"));
  if (t.train.dim != t.test.dim) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": train and test image sizes differ"));
  }
  return t;
}

TrainTest SyntheticData(size_t train_size, size_t test_size, uint64_t seed) {
  constexpr size_t kDim = 784;
  constexpr int kClasses = 10;
  // Class means with a shared low-rank "style" noise: classes overlap, so accuracy saturates
  // below 100 % like real data.
  const RngKey key = MakeRngKey(seed, 0xda7a);
  std::vector<float> means(kClasses * kDim);
  for (size_t i = 0; i < means.size(); ++i) means[i] = 0.15f * Normal(key, i);
  auto make = [&](size_t n, uint32_t stream) {
    Dataset d;
    d.dim = kDim;
    d.num_classes = kClasses;
    d.source = "synthetic";
    d.features.resize(n * kDim);
    d.labels.resize(n);
    const RngKey k = MakeRngKey(seed, stream);
    for (size_t i = 0; i < n; ++i) {
      const int c = static_cast<int>(Random32(k, i) % kClasses);
      d.labels[i] = static_cast<uint8_t>(c);
      for (size_t j = 0; j < kDim; ++j) {
        d.features[i * kDim + j] = means[c * kDim + j] + Normal(k, (i + 1) * kDim + j);
      }
    }
    return d;
  };
  TrainTest t;
  t.train = make(train_size, 1);
  t.test = make(test_size, 2);
  t.synthetic = true;
  return t;
}

absl::StatusOr<TrainTest> LoadTrainingData(const std::string& dir, uint64_t seed) {
  if (!dir.empty()) return LoadFashionMnist(dir);
  std::error_code ec;
  if (std::filesystem::exists(absl::StrCat(kDefaultFashionMnistDir, "/train-images-idx3-ubyte.gz"),
                              ec)) {
    return LoadFashionMnist(kDefaultFashionMnistDir);
  }
  return SyntheticData(60000, 10000, seed);
}

}  // namespace tern
