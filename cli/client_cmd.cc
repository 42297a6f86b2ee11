// `tern client`: built-in clients of an aggregator, many simulated clients per process.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/aggregator_flags.h"
#include "cli/client_flags.h"
#include "cli/commands.h"
#include "cli/process.h"
#include "clients/cpp/fed_client.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/service_flags.h"
#include "clients/flags/train_flags.h"
#include "common/status_macros.h"
#include "core/rpc/channel.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(tern::Int<tern::AtLeast(1)>, clients, 100,
          "run/client: clients (run: in all; client: in this process)");
ABSL_FLAG(std::string, attack, "",
          "client, run: experiments: what malicious clients send instead of their update: "
          "signflip[:scale=S], scale:factor=F, noise:std=D, nan (docs/robustness.md)");
ABSL_FLAG(tern::Double<tern::In(0, 1)>, attack_fraction, 0,
          "client, run: the first round(fraction x clients) clients (by partition) attack");
ABSL_FLAG(std::string, client_delay_s, "",
          "client, run: experiments: a slower device: seconds each client waits after its work, "
          "before its update goes: S, or LO:HI spread over the clients by partition (client i of "
          "n: LO + (HI - LO) i / (n - 1))");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, first_client, 0,
          "client: data partition of this process's first client");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, partitions, 0,
          "client: partitions the data is split into (0: --clients)");
ABSL_FLAG(std::string, server, "", "client: the aggregator's host:port");

namespace tern {

namespace {

// The data set's parts: --partitions, or one a client of this process.
int Partitions() {
  const int parts = absl::GetFlag(FLAGS_partitions).value;
  return parts > 0 ? parts : absl::GetFlag(FLAGS_clients).value;
}

}  // namespace

absl::Status CheckClientFlags() {
  const int n = absl::GetFlag(FLAGS_clients).value;
  const int first = absl::GetFlag(FLAGS_first_client).value;
  const int parts = Partitions();
  if (absl::GetFlag(FLAGS_server).empty()) {
    return absl::InvalidArgumentError("--server=HOST:PORT (the aggregator) is needed");
  }
  if (n < 1 || first < 0) {
    return absl::InvalidArgumentError("need --clients >= 1 and --first_client >= 0");
  }
  if (first + n > parts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--first_client=", first, " plus --clients=", n, " runs past the data's ", parts,
        " partitions: the data is cut into --partitions parts (default: --clients, ", n,
        " here), one a client; give --partitions=K, the run's clients in all (K >= ", first + n,
        ")"));
  }
  TERN_RETURN_IF_ERROR(CheckDataFlags());
  TERN_RETURN_IF_ERROR(ClientDelay(absl::GetFlag(FLAGS_client_delay_s), 0, parts).status());
  return ParseAttack(absl::GetFlag(FLAGS_attack)).status();
}

int ClientMain() {
  sigset_t signals = BlockStopSignals();
  if (absl::Status s = CheckClientFlags(); !s.ok()) {
    std::fprintf(stderr, "tern client: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const int n = absl::GetFlag(FLAGS_clients).value;
  const int first = absl::GetFlag(FLAGS_first_client).value;
  const int parts = Partitions();
  auto shared = LoadFedClientData(absl::GetFlag(FLAGS_data), absl::GetFlag(FLAGS_partition), parts,
                                  absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_seed));
  if (!shared.ok()) {
    std::fprintf(stderr, "tern client: %s\n", shared.status().ToString().c_str());
    return 1;
  }
  const Attack attack = *ParseAttack(absl::GetFlag(FLAGS_attack));  // checked above
  auto credentials = ChannelCredentialsFromFlags();
  if (!credentials.ok()) {
    std::fprintf(stderr, "tern client: %s\n", credentials.status().ToString().c_str());
    return 2;
  }
  auto channel = MakeChannel(absl::GetFlag(FLAGS_server), ChannelKind::kDefault, *credentials);
  std::atomic<bool> stop{false};
  std::atomic<int> failed{0}, finished{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      FedClientOptions o;
      o.run_id = absl::GetFlag(FLAGS_run_id);
      o.server = absl::GetFlag(FLAGS_server);
      o.index = first + i;
      o.seed = absl::GetFlag(FLAGS_seed);
      if (IsAttacker(o.index, parts, absl::GetFlag(FLAGS_attack_fraction).value)) o.attack = attack;
      o.delay = *ClientDelay(absl::GetFlag(FLAGS_client_delay_s), o.index, parts);  // checked
      auto r = RunFederatedClient(channel, o, **shared, stop);
      if (!r.ok() && !stop.load()) {
        spdlog::error("client-{}: {}", o.index, r.status().ToString());
        ++failed;
      } else if (r.ok()) {
        spdlog::debug("client-{}: {} rounds trained, {} updates accepted, {} not used", o.index,
                      r->rounds_trained, r->updates_accepted, r->updates_refused);
      }
      if (++finished == n) kill(getpid(), SIGUSR1);
    });
  }
  spdlog::info("clients {}..{} of {} ({} examples each on average) talking to {}", first,
               first + n - 1, parts, (*shared)->data.train.size() / parts,
               absl::GetFlag(FLAGS_server));
  int sig = 0;
  sigwait(&signals, &sig);
  stop = true;
  for (std::thread& t : threads) t.join();
  spdlog::info("clients {}..{}: {}", first, first + n - 1,
               sig == SIGUSR1 ? "run finished" : strsignal(sig));
  return failed.load() > 0 ? 1 : 0;
}

}  // namespace tern
