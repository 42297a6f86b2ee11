#include "cli/bench_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cli/grpc_floor.h"
#include "common/chunking.h"
#include "common/status_macros.h"
#include "core/rpc/dev_certs.h"
#include "core/rpc/security.h"
#include "spdlog/spdlog.h"
#include "worker/daemon.h"
#include "worker/grpc_transport.h"

namespace tern {
namespace {

// Worker 1 (this bench's transport) pushes round r to worker 0 (a live daemon), which then steps
// round r, as in a run: the message is mixed and freed, and the next one reuses its memory.
constexpr int kWorkers = 2;

// CPU seconds this process (sender, receiver and kernel work on their behalf) has used: robust to
// other load on a shared machine, where wall time is not.
double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds for `data` through a fresh loopback TCP connection: write all, the reader acks once it
// has read all into `sink` (allocated and touched before the clock starts, as iperf3's is).
absl::StatusOr<double> RawTcpSeconds(const std::vector<char>& data, std::vector<char>& sink) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (listener >= 0) close(listener);
    return absl::InternalError(absl::StrCat("loopback socket: ", std::strerror(errno)));
  }
  std::thread reader([listener, n = data.size(), &buf = sink] {
    const int c = accept(listener, nullptr, nullptr);
    size_t got = 0;
    while (c >= 0 && got < n) {
      const ssize_t r = read(c, buf.data() + got, n - got);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    const char ack = 1;
    if (c >= 0) {
      (void)!write(c, &ack, 1);
      close(c);
    }
  });
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  const absl::Time t0 = absl::Now();
  bool ok = connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  for (size_t sent = 0; ok && sent < data.size();) {
    const ssize_t w = write(s, data.data() + sent, data.size() - sent);
    ok = w > 0;
    sent += ok ? static_cast<size_t>(w) : 0;
  }
  char ack = 0;
  ok = ok && read(s, &ack, 1) == 1;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  close(s);
  reader.join();
  close(listener);
  if (!ok) return absl::InternalError("loopback TCP transfer failed");
  return seconds;
}

v1::TensorBundle Message(const std::vector<char>& payload, uint64_t numel, int sender,
                         uint64_t round) {
  v1::TensorBundle b;
  b.set_run_id("bench");
  b.set_sender(absl::StrCat(sender));
  b.set_round(round);
  v1::NamedTensor* t = b.add_tensors();
  t->set_name("x");
  t->mutable_tensor()->set_codec("none.v1");
  t->mutable_tensor()->set_numel(numel);
  t->mutable_tensor()->add_shape(static_cast<int64_t>(numel));
  t->mutable_tensor()->set_payload(payload.data(), payload.size());
  return b;
}

// Connections of the second gRPC floor: one per stream gRPC can then serve on its own thread.
constexpr int kFloorConnections = 4;

struct SizeResult {
  double push_gbs = 0, tcp_gbs = 0;
  double single_gbs = 0;                  // the same push over one stream
  double tls_gbs = 0;                     // the same push with mutual TLS (with --tls)
  double floor1_gbs = 0, floor4_gbs = 0;  // gRPC alone, one and kFloorConnections connections
  double push_cpu_ms_per_mb = 0, single_cpu_ms_per_mb = 0, tcp_cpu_ms_per_mb = 0;
};

// A live worker daemon that takes gossip pushes from worker 1, and worker 1's transport to it;
// with `tls`, both ends use mutual TLS.
struct Receiver {
  std::unique_ptr<WorkerDaemon> daemon;
  std::unique_ptr<GrpcTransport> transport;  // striped as asked
  std::unique_ptr<GrpcTransport> single;     // a Push call of its own, over one stream
};

absl::StatusOr<Receiver> StartReceiver(uint64_t numel, int stripes,
                                       const WorkerRegistries& registries, const TlsFiles* server,
                                       const TlsFiles* client) {
  DaemonOptions o;
  o.engine.run_id = "bench";
  o.engine.num_workers = kWorkers;
  o.engine.topology = "complete";
  o.engine.algorithm = "dpsgd";
  o.engine.algorithm_options.codec = "none";
  o.engine.max_params = std::max<uint64_t>(o.engine.max_params, numel);
  // Worker 1 has no server: the receiver's own pushes fail at once, after the first round's
  // retries (bounded by this).
  o.engine.round_timeout = absl::Seconds(2);
  if (server != nullptr) o.tls = *server;
  Receiver r;
  TERN_ASSIGN_OR_RETURN(r.daemon, WorkerDaemon::Start(o, &registries));
  const std::vector<float> x0(numel, 0.0f);
  TERN_RETURN_IF_ERROR(
      r.daemon->trainer().Register({{"x", {static_cast<int64_t>(numel)}, 0, numel}}, x0).status());
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (client != nullptr) {
    TERN_ASSIGN_OR_RETURN(credentials, ChannelCredentialsFor(*client));
  }
  r.transport = std::make_unique<GrpcTransport>(/*self=*/1, credentials, PushStriping{stripes});
  r.single = std::make_unique<GrpcTransport>(/*self=*/1, credentials,
                                             PushStriping{.stripes = 1, .streams = false});
  const std::vector<std::string> peers = {absl::StrCat("127.0.0.1:", r.daemon->port()),
                                          "127.0.0.1:1"};
  TERN_RETURN_IF_ERROR(r.transport->SetPeers(peers));
  TERN_RETURN_IF_ERROR(r.single->SetPeers(peers));
  TERN_RETURN_IF_ERROR(r.daemon->SetPeers(peers));
  return r;
}

// Pushes round r's message to `to` through `via` and steps it (untimed), so the message is mixed
// and freed as in a run; returns the push's seconds and CPU seconds.
absl::StatusOr<std::pair<double, double>> PushOnce(Receiver& to, GrpcTransport& via,
                                                   const std::vector<char>& payload, uint64_t numel,
                                                   int r) {
  TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks,
                        ChunkBundle(Message(payload, numel, /*sender=*/1, r), r));
  auto shared = std::make_shared<const std::vector<v1::BundleChunk>>(std::move(chunks));
  absl::Notification done;
  absl::Status status;
  const double c0 = CpuSeconds();
  const absl::Time t0 = absl::Now();
  via.Send(0, shared, absl::Now() + absl::Minutes(1), PeerTransport::Reach::kOnce,
           [&](absl::Status s) {
             status = s;
             done.Notify();
           });
  done.WaitForNotification();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  const double cpu = CpuSeconds() - c0;
  TERN_RETURN_IF_ERROR(status);
  const std::vector<float> zeros(numel, 0.0f);
  StepInput step;
  step.step = r;
  step.grad = zeros;
  TERN_RETURN_IF_ERROR(to.daemon->trainer().Step(step, nullptr).status());
  return std::make_pair(seconds, cpu);
}

absl::StatusOr<SizeResult> BenchOneSize(uint64_t numel, int repeats, int stripes,
                                        const WorkerRegistries& registries,
                                        const std::string& certs) {
  TERN_ASSIGN_OR_RETURN(Receiver plain,
                        StartReceiver(numel, stripes, registries, nullptr, nullptr));
  std::optional<Receiver> tls;
  if (!certs.empty()) {
    TlsFiles server;
    server.cert = certs + "/receiver.crt";
    server.key = certs + "/receiver.key";
    server.ca = certs + "/ca.crt";
    TlsFiles client = server;
    client.cert = certs + "/sender.crt";
    client.key = certs + "/sender.key";
    TERN_ASSIGN_OR_RETURN(tls, StartReceiver(numel, stripes, registries, &server, &client));
  }
  std::vector<char> payload(numel * sizeof(float));
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>((i * 131) >> 7);
  for (size_t i = 0; i < numel; ++i) std::memset(payload.data() + 4 * i + 3, 0x3c, 1);  // finite
  std::vector<char> sink(payload.size(), 1);
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<GrpcFloor> floor1, GrpcFloor::Start(1));
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<GrpcFloor> floor4, GrpcFloor::Start(kFloorConnections));
  std::vector<double> push, single, tls_push, tcp, push_cpu, single_cpu, tcp_cpu, floor1_gbs,
      floor4_gbs;
  const double mb = static_cast<double>(payload.size()) / 1e6;
  const double bytes = static_cast<double>(payload.size());
  // Repeat r pushes rounds 2r (striped) and 2r + 1 (one stream) to each receiver.
  for (int r = 0; r <= repeats; ++r) {
    TERN_ASSIGN_OR_RETURN(const auto p, PushOnce(plain, *plain.transport, payload, numel, 2 * r));
    TERN_ASSIGN_OR_RETURN(const auto p1, PushOnce(plain, *plain.single, payload, numel, 2 * r + 1));
    const double c1 = CpuSeconds();
    TERN_ASSIGN_OR_RETURN(const double tcp_seconds, RawTcpSeconds(payload, sink));
    const double tcp_cpu_s = CpuSeconds() - c1;
    TERN_ASSIGN_OR_RETURN(const double f1, floor1->Seconds(payload.data(), payload.size()));
    TERN_ASSIGN_OR_RETURN(const double f4, floor4->Seconds(payload.data(), payload.size()));
    double tls_seconds = 0;
    if (tls) {
      TERN_ASSIGN_OR_RETURN(const auto t, PushOnce(*tls, *tls->transport, payload, numel, 2 * r));
      TERN_RETURN_IF_ERROR(PushOnce(*tls, *tls->single, payload, numel, 2 * r + 1).status());
      tls_seconds = t.first;
    }
    if (r == 0) continue;  // warm-up: connections, allocator
    floor1_gbs.push_back(bytes / f1 / 1e9);
    floor4_gbs.push_back(bytes / f4 / 1e9);
    push.push_back(bytes / p.first / 1e9);
    single.push_back(bytes / p1.first / 1e9);
    if (tls) tls_push.push_back(bytes / tls_seconds / 1e9);
    tcp.push_back(bytes / tcp_seconds / 1e9);
    push_cpu.push_back(1e3 * p.second / mb);
    single_cpu.push_back(1e3 * p1.second / mb);
    tcp_cpu.push_back(1e3 * tcp_cpu_s / mb);
  }
  for (Receiver* r : {&plain, tls ? &*tls : nullptr}) {
    if (r == nullptr) continue;
    r->transport->Drain();
    r->single->Drain();
    r->daemon->Shutdown(absl::Seconds(2));
  }
  SizeResult result;
  result.push_gbs = Median(push);
  result.single_gbs = Median(single);
  result.tls_gbs = tls ? Median(tls_push) : 0;
  result.tcp_gbs = Median(tcp);
  result.floor1_gbs = Median(floor1_gbs);
  result.floor4_gbs = Median(floor4_gbs);
  result.push_cpu_ms_per_mb = Median(push_cpu);
  result.single_cpu_ms_per_mb = Median(single_cpu);
  result.tcp_cpu_ms_per_mb = Median(tcp_cpu);
  return result;
}

}  // namespace

absl::Status RunBenchTransport(const BenchTransportOptions& options) {
  if (options.repeats < 1 || options.repeats > 7 * 30) {
    return absl::InvalidArgumentError("--repeats in [1, 210]");
  }
  if (options.push_stripes < 1 || options.push_stripes > 16) {
    return absl::InvalidArgumentError("--push_stripes in [1, 16]");
  }
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  // The receiver's pushes to the absent worker 1 fail every round by design: not worth a warning.
  const spdlog::level::level_enum level = spdlog::get_level();
  spdlog::set_level(std::max(level, spdlog::level::err));
  absl::Cleanup restore = [level] { spdlog::set_level(level); };
  std::printf(
      "tern bench transport: one gossip message (codec none) pushed through GrpcTransport into "
      "a live worker's gossip service on loopback, against raw TCP on loopback; GB/s of payload and "
      "CPU ms per MB (both sides), median of %d. grpc-1 / grpc-%d: gRPC alone (raw 1 MiB "
      "messages, nothing parsed or checked) over 1 / %d connections, the most a gRPC push can "
      "reach here. push: as a worker sends it (on its long-lived stream to the peer; 8 MiB or "
      "more as a call over --push_stripes=%d streams); 1-stream: the same message as a Push "
      "call of its own over one stream (--push_streams=false)\n",
      options.repeats, kFloorConnections, kFloorConnections, options.push_stripes);
  std::printf("%10s %10s %10s %10s %10s %10s %8s %8s %8s %8s %14s %14s %14s", "size", "push GB/s",
              "1-stream", "grpc-1", absl::StrCat("grpc-", kFloorConnections).c_str(), "tcp GB/s",
              "push/tcp", "1s/tcp", "g1/tcp", absl::StrCat("g", kFloorConnections, "/tcp").c_str(),
              "push cpu ms/MB", "1s cpu ms/MB", "tcp cpu ms/MB");
  if (options.tls) std::printf("  (then) %10s %10s", "mtls GB/s", "mtls/push");
  std::printf("\n");
  std::string certs;
  if (options.tls) {
    certs = absl::StrCat("/tmp/tern-bench-certs-", getpid());
    DevCertOptions dev;
    dev.names = {"receiver", "sender"};
    TERN_RETURN_IF_ERROR(MakeDevCertificates(certs, dev));
  }
  for (uint64_t n : options.sizes) {
    TERN_ASSIGN_OR_RETURN(
        SizeResult r, BenchOneSize(n, options.repeats, options.push_stripes, registries, certs));
    const double size_mb = static_cast<double>(4 * n) / 1e6;
    std::printf(size_mb < 0.1 ? "%7.4f" : "%7.1f", size_mb);
    std::printf(
        " MB %10.3f %10.3f %10.3f %10.3f %10.3f %7.2fx %7.2fx %7.2fx %7.2fx %14.3f %14.3f "
        "%14.3f",
        r.push_gbs, r.single_gbs, r.floor1_gbs, r.floor4_gbs, r.tcp_gbs, r.push_gbs / r.tcp_gbs,
        r.single_gbs / r.tcp_gbs, r.floor1_gbs / r.tcp_gbs, r.floor4_gbs / r.tcp_gbs,
        r.push_cpu_ms_per_mb, r.single_cpu_ms_per_mb, r.tcp_cpu_ms_per_mb);
    if (options.tls) std::printf(" %10.3f %9.2fx", r.tls_gbs, r.tls_gbs / r.push_gbs);
    std::printf("\n");
    std::fflush(stdout);
  }
  if (!certs.empty()) std::system(absl::StrCat("rm -rf ", certs).c_str());
  return absl::OkStatus();
}

}  // namespace tern
