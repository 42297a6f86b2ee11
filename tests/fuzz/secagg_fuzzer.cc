// libFuzzer target for SecAgg+'s decoders and both sides' handling of what the other side (or
// anyone) sends (core/federated/secagg.h): a Shamir share, a masked vector, and each stage's
// message to a server round or a client of an honest round of four, set up once and copied for
// each input. The first byte picks which. Any input must give a status, never a crash; a server
// round that refused a message must still finish with the honest messages.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/federated/secagg.h"
#include "core/federated/shamir.h"

namespace {

using tern::SecAggClient;
using tern::SecAggServerRound;
namespace v1 = tern::v1;

constexpr uint64_t kRound = 5;
constexpr size_t kDim = 16;

void Check(bool ok) {
  if (!ok) std::abort();
}

// An honest round of four clients, with a copy of the server and of each client at each stage.
struct Honest {
  v1::SecAggParams params;
  std::vector<SecAggServerRound> server;           // [0]: taking shares, [1] masked, [2] reveal
  std::map<uint32_t, SecAggClient> keyed, shared, masked;  // clients before each stage
  std::map<uint32_t, v1::SecAggShares> shares;
  std::map<uint32_t, std::string> vectors;
  std::map<uint32_t, v1::SecAggReveal> reveals;

  Honest() {
    params.set_threshold(2);
    params.set_neighbours(2);
    params.set_modulus_bits(20);
    params.set_levels(1024);
    params.set_clip_range(1.0f);
    SecAggServerRound s(params, kRound, kDim, 1);
    for (uint32_t id = 0; id < 4; ++id) {
      absl::StatusOr<SecAggClient> c = SecAggClient::Start(params, id, kRound);
      Check(c.ok() && s.AddKeys(c->Keys()).ok());
      keyed.emplace(id, *c);
    }
    Check(s.CloseKeys().ok());
    server.push_back(s);
    shared = keyed;
    for (auto& [id, c] : shared) {
      absl::StatusOr<v1::SecAggShares> sh = c.Share(*s.KeysFor(id));
      Check(sh.ok() && s.AddShares(*sh).ok());
      shares[id] = *sh;
    }
    Check(s.CloseShares().ok());
    server.push_back(s);
    masked = shared;
    const std::vector<float> update(kDim, 0.25f);
    for (auto& [id, c] : masked) {
      absl::StatusOr<std::string> m = c.Mask(*s.SharesFor(id), update);
      Check(m.ok() && s.AddMasked(id, kRound, *m).ok());
      vectors[id] = *m;
    }
    Check(s.CloseMasked().ok());
    server.push_back(s);
    std::map<uint32_t, SecAggClient> revealing = masked;
    for (auto& [id, c] : revealing) {
      absl::StatusOr<v1::SecAggReveal> r = c.Reveal(*s.UnmaskRequestFor(id));
      Check(r.ok());
      reveals[id] = *r;
    }
  }
};

const Honest& Round() {
  static const Honest* honest = new Honest();
  return *honest;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t pick = data[0], arg = data[1];
  const std::string bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  const Honest& h = Round();
  const uint32_t id = arg % 4;
  switch (pick % 8) {
    case 0:
      (void)tern::DecodeShamirShare(bytes);
      break;
    case 1: {
      absl::StatusOr<std::vector<uint32_t>> v = tern::DecodeMasked(bytes, arg % 64, 1 + arg % 40);
      if (v.ok()) Check(v->size() == arg % 64);
      break;
    }
    case 2: {  // shares to the server, then the honest ones
      v1::SecAggShares m;
      if (!m.ParseFromString(bytes)) return 0;
      SecAggServerRound s = h.server[0];
      const bool took = s.AddShares(m).ok();
      for (const auto& [i, sh] : h.shares) {
        if (!took) Check(s.AddShares(sh).ok());
      }
      break;
    }
    case 3: {  // a masked vector to the server, then the honest round to its end
      SecAggServerRound s = h.server[1];
      if (s.AddMasked(id, kRound + (arg >> 7), bytes).ok()) return 0;
      for (const auto& [i, v] : h.vectors) Check(s.AddMasked(i, kRound, v).ok());
      Check(s.CloseMasked().ok());
      for (const auto& [i, r] : h.reveals) Check(s.AddReveal(r).ok());
      Check(s.Finish().ok());
      break;
    }
    case 4: {  // a reveal to the server, then the honest ones; Finish may fail, never crash
      v1::SecAggReveal m;
      if (!m.ParseFromString(bytes)) return 0;
      SecAggServerRound s = h.server[2];
      (void)s.AddReveal(m);
      for (const auto& [i, r] : h.reveals) (void)s.AddReveal(r);
      (void)s.Finish();
      break;
    }
    case 5: {  // the server's neighbour list to a client
      v1::SecAggKeysReply m;
      if (!m.ParseFromString(bytes)) return 0;
      SecAggClient c = h.keyed.at(id);
      (void)c.Share(m);
      break;
    }
    case 6: {  // the shares addressed to a client
      v1::SecAggSharesReply m;
      if (!m.ParseFromString(bytes)) return 0;
      SecAggClient c = h.shared.at(id);
      absl::StatusOr<std::string> v = c.Mask(m, std::vector<float>(kDim, 0.5f));
      if (v.ok()) Check(v->size() == tern::MaskedBytes(kDim, 20));
      break;
    }
    case 7: {  // an unmask request to a client
      v1::SecAggUnmaskRequest m;
      if (!m.ParseFromString(bytes)) return 0;
      SecAggClient c = h.masked.at(id);
      (void)c.Reveal(m);
      break;
    }
  }
  return 0;
}
