// libFuzzer target for the C API a non-C++ client hands the server's bytes to (clients/c/
// tern_c.h): an initial model bundle, a TRAIN task with its payload (MODEL or DELTAS), and a
// task naming the update codec. The first byte picks which; the task variants are fixed so that
// the payload bytes reach the decoders. Any input must give 0 or an error code, and a model
// copy must stay its layout's size.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "clients/c/tern_c.h"
#include "common/crc32.h"
#include "core/model/bundle.h"
#include "tern/v1/server.pb.h"

namespace {

TernClientModel* NewModel() {
  tern::ParamTensor a{"a", {4, 8}, 0, 32}, b{"b", {32}, 32, 32};
  const std::string bytes =
      tern::FlatToBundle({a, b}, std::vector<float>(64, 0.5f))->SerializeAsString();
  TernClientModel* m = nullptr;
  if (tern_client_model_new(bytes.data(), bytes.size(), &m, nullptr, 0) != 0) std::abort();
  return m;
}

std::string Task(uint8_t variant) {
  tern::v1::Task t;
  t.set_kind(tern::v1::Task::TRAIN);
  t.set_round(2);
  t.set_payload((variant & 1) ? tern::v1::Task::DELTAS : tern::v1::Task::MODEL);
  t.set_delta_from(0);
  if (variant & 2) t.set_model_crc32(1234);
  static const char* const kCodecs[] = {"none", "topk:ratio=0.1", "stc:ratio=0.1", "powersgd"};
  t.set_update_codec(kCodecs[(variant >> 2) & 3]);
  t.set_error_feedback((variant & 16) != 0);
  return t.SerializeAsString();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t pick = data[0], variant = data[1];
  data += 2;
  size -= 2;
  char error[128];
  if (pick % 3 == 0) {
    TernClientModel* m = nullptr;
    if (tern_client_model_new(data, size, &m, error, sizeof(error)) == 0) {
      if (tern_client_model_size(m) == 0) std::abort();
      tern_client_model_free(m);
    }
    return 0;
  }
  TernClientModel* m = NewModel();
  if (variant & 32) {
    const uint8_t exact[] = {0, 1};
    if (tern_client_model_set_exact(m, exact, 2, error, sizeof(error)) != 0) std::abort();
  }
  if (pick % 3 == 1) {
    const std::string t = Task(variant);
    int usable = 0;
    tern_client_model_update(m, t.data(), t.size(), data, size, &usable, error, sizeof(error));
  } else {
    // The task itself from the input (any codec spec); the update is zeros.
    const std::vector<float> update(tern_client_model_size(m), 0.0f);
    void* out = nullptr;
    size_t out_size = 0;
    if (tern_client_model_encode(m, data, size, 1, 100, update.data(), update.size(), &out,
                                 &out_size, error, sizeof(error)) == 0) {
      tern_free(out);
    }
  }
  if (tern_client_model_size(m) != 64) std::abort();
  tern_client_model_free(m);
  return 0;
}
