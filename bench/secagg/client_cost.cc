// What SecAgg+ costs one client and the server in CPU (docs/benchmarks.md): a round of
// --clients clients over --dim coordinates with --neighbours neighbours, in one process, each
// stage timed per client (keys, shares, masking, reveal) and the server's unmasking with
// --dropped clients lost after masking; beside it, the anchor: one memcpy of the update.
//
//   tern_secagg_cost [--clients=17] [--dim=109386] [--neighbours=16] [--dropped=2] [--repeats=3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/federated/secagg.h"

ABSL_FLAG(int, clients, 17, "clients in the round");
ABSL_FLAG(int, dim, 109386, "coordinates of an update (tern run's default MLP)");
ABSL_FLAG(int, neighbours, 16, "k");
ABSL_FLAG(int, bits, 32, "b");
ABSL_FLAG(int, dropped, 2, "clients lost after masking");
ABSL_FLAG(int, repeats, 3, "rounds timed");

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename T>
T Must(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s\n", v.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(v);
}

void Must(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int n = absl::GetFlag(FLAGS_clients), d = absl::GetFlag(FLAGS_dim);
  const int dropped = absl::GetFlag(FLAGS_dropped);
  tern::v1::SecAggParams p;
  p.set_neighbours(static_cast<uint32_t>(absl::GetFlag(FLAGS_neighbours)));
  const uint32_t degree = std::min<uint32_t>(2 * ((p.neighbours() + 1) / 2), n - 1);
  p.set_threshold(degree / 2 + 1);
  p.set_modulus_bits(static_cast<uint32_t>(absl::GetFlag(FLAGS_bits)));
  p.set_levels(static_cast<uint32_t>(((uint64_t{1} << p.modulus_bits()) - 1) / n));
  p.set_clip_range(0.5f);
  std::vector<float> update(static_cast<size_t>(d));
  for (int i = 0; i < d; ++i) update[static_cast<size_t>(i)] = 0.001f * static_cast<float>(i % 97);
  std::printf("%d clients, %d coordinates, degree %u, t = %u, b = %u, %d dropped after masking\n",
              n, d, degree, p.threshold(), p.modulus_bits(), dropped);
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
    tern::SecAggServerRound server(p, 1, static_cast<size_t>(d), static_cast<uint64_t>(rep));
    std::map<uint32_t, tern::SecAggClient> clients;
    double t0 = Now();
    for (uint32_t id = 0; id < static_cast<uint32_t>(n); ++id) {
      clients.emplace(id, Must(tern::SecAggClient::Start(p, id, 1)));
      Must(server.AddKeys(clients.at(id).Keys()));
    }
    const double keys = Now() - t0;
    Must(server.CloseKeys());
    t0 = Now();
    for (auto& [id, c] : clients) Must(server.AddShares(Must(c.Share(Must(server.KeysFor(id))))));
    const double shares = Now() - t0;
    Must(server.CloseShares());
    double mask = 0, add = 0;
    for (auto& [id, c] : clients) {
      const tern::v1::SecAggSharesReply s = Must(server.SharesFor(id));
      t0 = Now();
      const std::string m = Must(c.Mask(s, update));
      mask += Now() - t0;
      if (static_cast<int>(id) < dropped) continue;
      t0 = Now();
      Must(server.AddMasked(id, 1, m));
      add += Now() - t0;
    }
    Must(server.CloseMasked());
    t0 = Now();
    std::vector<tern::v1::SecAggReveal> reveals;
    for (uint32_t id : server.masked_clients()) {
      reveals.push_back(Must(clients.at(id).Reveal(Must(server.UnmaskRequestFor(id)))));
    }
    const double reveal = Now() - t0;
    for (const auto& r : reveals) Must(server.AddReveal(r));
    t0 = Now();
    (void)Must(server.Finish());
    const double finish = Now() - t0;
    std::vector<float> copy(update.size());
    t0 = Now();
    std::memcpy(copy.data(), update.data(), update.size() * sizeof(float));
    const double memcpy_s = Now() - t0 + 1e-9;
    const double survivors = n - dropped;
    std::printf(
        "round %d: per client: keys %.2f ms, shares %.2f ms, masking %.2f ms, reveal %.3f ms; "
        "server: adding a masked vector %.2f ms, unmasking %.1f ms; memcpy of the update %.3f ms "
        "(masking = %.0fx it)\n",
        rep + 1, 1e3 * keys / n, 1e3 * shares / n, 1e3 * mask / n, 1e3 * reveal / survivors,
        1e3 * add / survivors, 1e3 * finish, 1e3 * memcpy_s, mask / n / memcpy_s);
  }
  return 0;
}
