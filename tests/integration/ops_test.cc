// Running the daemons as services: Prometheus scraping all three, systemd's notify protocol.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/chunking.h"
#include "core/rpc/channel.h"
#include "core/rpc/security.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tern/v1/server.grpc.pb.h"
#include "tern/v1/worker.grpc.pb.h"
#include "tests/integration/process_util.h"
#include "tests/testing/http_get.h"
#include "tests/testing/notify_socket.h"

namespace tern {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr char kPromtool[] = "/usr/bin/promtool";

// The port a daemon logged for its metrics endpoint ("metrics at http://HOST:PORT/metrics"), or 0
// after 30 s. (No std::regex: it trips GCC 12's -Wmaybe-uninitialized under ASan.)
int MetricsPort(const std::string& log) {
  const std::string mark = "metrics at http://";
  for (int i = 0; i < 600; ++i) {
    const std::string text = ReadText(log);
    const size_t at = text.find(mark);
    const size_t end = at == std::string::npos ? at : text.find("/metrics", at + mark.size());
    if (end != std::string::npos) {
      const std::string address = text.substr(at + mark.size(), end - at - mark.size());
      return std::atoi(address.substr(address.rfind(':') + 1).c_str());
    }
    usleep(50 * 1000);
  }
  return 0;
}

// The value of an instant query's first sample, from Prometheus's HTTP API
// ({"data":{"result":[{"metric":{...},"value":[TIME,"VALUE"]}]}}).
std::optional<double> PromQuery(int port, const std::string& query) {
  absl::StatusOr<std::string> body = testing::HttpGet(port, "/api/v1/query?query=" + query);
  if (!body.ok()) return std::nullopt;
  const size_t value = body->find("\"value\":[");
  const size_t open = value == std::string::npos ? value : body->find(",\"", value);
  const size_t close = open == std::string::npos ? open : body->find('"', open + 2);
  if (close == std::string::npos) return std::nullopt;
  return std::atof(body->substr(open + 2, close - open - 2).c_str());
}

// promtool's verdict on an exposition: its output, empty when clean.
std::string Promtool(const std::string& exposition, const std::string& dir) {
  const std::string in = dir + "/exposition.txt", out = dir + "/promtool.txt";
  std::FILE* f = std::fopen(in.c_str(), "w");
  std::fwrite(exposition.data(), 1, exposition.size(), f);
  std::fclose(f);
  const int rc =
      std::system(absl::StrCat(kPromtool, " check metrics < ", in, " > ", out, " 2>&1").c_str());
  const std::string said = ReadText(out);
  return rc == 0 ? said : absl::StrCat("exit ", rc, ": ", said);
}

template <typename Stub>
std::unique_ptr<typename Stub::Stub> StubTo(int port) {
  return Stub::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", port)));
}

void Deadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
}

// A command line: `a` then `b`.
std::vector<std::string> With(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class Daemons {
 public:
  ~Daemons() {
    for (pid_t pid : pids_) kill(pid, SIGTERM);
    for (pid_t pid : pids_) Wait(pid);
  }
  pid_t Add(pid_t pid) {
    pids_.push_back(pid);
    return pid;
  }

 private:
  std::vector<pid_t> pids_;
};

TEST(Prometheus, ScrapesEveryDaemonAndStoresWhatItsOwnCountersSay) {
  if (access(kPrometheus, X_OK) != 0 || access(kPromtool, X_OK) != 0) {
    GTEST_SKIP() << "needs Debian's prometheus package (" << kPrometheus << ", " << kPromtool
                 << ")";
  }
  const std::string dir = MakeTempDir();
  Daemons daemons;
  const std::vector<std::string> metrics = {"--metrics_listen=127.0.0.1:0"};
  daemons.Add(Spawn({"scheduler", "--listen=127.0.0.1:0", "--port_file=" + dir + "/sched.port",
                     "--run_id=it", metrics[0]},
                    dir + "/scheduler.log"));
  const int sched_port = WaitForPort(dir + "/sched.port");
  ASSERT_GT(sched_port, 0) << ReadText(dir + "/scheduler.log");
  daemons.Add(
      Spawn({"server", "--listen=127.0.0.1:0", "--port_file=" + dir + "/server.port", "--run_id=it",
             "--min_clients=2", "--clients_per_round=2", "--rounds=3", "--local_epochs=0",
             "--local_steps=5", "--round_deadline_s=60", "--linger_s=600", metrics[0]},
            dir + "/server.log"));
  const int server_port = WaitForPort(dir + "/server.port");
  ASSERT_GT(server_port, 0) << ReadText(dir + "/server.log");
  daemons.Add(Spawn(
      {"client", absl::StrCat("--server=127.0.0.1:", server_port), "--clients=2", "--run_id=it"},
      dir + "/clients.log"));
  daemons.Add(Spawn({"worker", "--listen=127.0.0.1:0", "--port_file=" + dir + "/worker.port",
                     "--workers=1", "--max_steps=40", "--run_id=it",
                     absl::StrCat("--scheduler=127.0.0.1:", sched_port), metrics[0]},
                    dir + "/worker.log"));
  const int worker_port = WaitForPort(dir + "/worker.port");
  ASSERT_GT(worker_port, 0) << ReadText(dir + "/worker.log");
  const int scrape[3] = {MetricsPort(dir + "/scheduler.log"), MetricsPort(dir + "/server.log"),
                         MetricsPort(dir + "/worker.log")};
  for (int port : scrape) {
    ASSERT_GT(port, 0);
    absl::StatusOr<std::string> body = testing::HttpGet(port, "/metrics");
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_EQ(Promtool(*body, dir), "") << *body;
  }

  const int prom_port = FreePort();
  {
    std::FILE* f = std::fopen((dir + "/prometheus.yml").c_str(), "w");
    std::fprintf(f,
                 "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: tern\n"
                 "    static_configs:\n      - targets: ['127.0.0.1:%d', '127.0.0.1:%d', "
                 "'127.0.0.1:%d']\n",
                 scrape[0], scrape[1], scrape[2]);
    std::fclose(f);
  }
  daemons.Add(SpawnProgram(
      kPrometheus,
      {"--config.file=" + dir + "/prometheus.yml", "--storage.tsdb.path=" + dir + "/tsdb",
       absl::StrCat("--web.listen-address=127.0.0.1:", prom_port)},
      dir + "/prometheus.log"));

  // The runs end; then each daemon's own counter, and what Prometheus stored, must agree.
  auto server = StubTo<v1::Aggregator>(server_port);
  auto worker = StubTo<v1::Trainer>(worker_port);
  v1::ServerStatus st;
  v1::WorkerStats ws;
  const absl::Time deadline = absl::Now() + absl::Seconds(240);
  while (absl::Now() < deadline) {
    grpc::ClientContext c1, c2;
    Deadline(&c1);
    Deadline(&c2);
    const bool got = server->Status(&c1, v1::StatusRequest(), &st).ok() &&
                     worker->Stats(&c2, v1::StatsRequest(), &ws).ok();
    if (got && st.done() && ws.steps() == 40) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_TRUE(st.done()) << ReadText(dir + "/server.log");
  ASSERT_EQ(ws.steps(), 40u) << ReadText(dir + "/worker.log");
  std::optional<double> rounds, steps, members;
  while (absl::Now() < deadline) {
    rounds = PromQuery(prom_port, "tern_server_rounds_total");
    steps = PromQuery(prom_port, "tern_worker_steps_total");
    members = PromQuery(prom_port, "tern_scheduler_members");
    if (rounds == st.round() && steps == ws.steps() && members == 1) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_EQ(rounds, static_cast<double>(st.round())) << ReadText(dir + "/prometheus.log");
  EXPECT_EQ(steps, static_cast<double>(ws.steps()));
  EXPECT_EQ(members, 1.0);
  EXPECT_EQ(PromQuery(prom_port, "tern_server_bytes_total{direction=\"up\",kind=\"wire\"}"),
            static_cast<double>(st.wire_bytes_up()));
  EXPECT_EQ(PromQuery(prom_port, "count(up==1)"), 3.0);
  // Every daemon's series carry its run: one selector finds all of a run's rounds, bytes,
  // updates, members and steps.
  EXPECT_EQ(PromQuery(prom_port, "tern_server_rounds_total{run=\"it\"}"),
            static_cast<double>(st.round()));
  EXPECT_EQ(PromQuery(prom_port, "tern_server_updates_total{run=\"it\",verdict=\"accepted\"}"),
            static_cast<double>(st.updates_accepted()));
  EXPECT_EQ(PromQuery(prom_port, "tern_scheduler_members{run=\"it\"}"), 1.0);
  EXPECT_EQ(PromQuery(prom_port, "tern_worker_steps_total{run=\"it\"}"),
            static_cast<double>(ws.steps()));
}

TEST(Systemd, EachDaemonSaysReadyOnceServingFeedsItsWatchdogAndSaysStopping) {
  const std::string dir = MakeTempDir();
  const std::vector<std::vector<std::string>> commands = {
      {"scheduler", "--run_id=it"},
      {"server", "--run_id=it", "--rounds=1"},
      {"worker", "--workers=1", "--trainer=external"}};
  for (const std::vector<std::string>& command : commands) {
    SCOPED_TRACE(command[0]);
    testing::NotifySocket systemd(absl::StrCat(dir, "/notify-", command[0]),
                                  absl::Milliseconds(400));
    std::vector<std::string> args = command;
    const std::string port_file = absl::StrCat(dir, "/", command[0], ".port");
    args.push_back("--listen=127.0.0.1:0");
    args.push_back("--port_file=" + port_file);
    const std::string log = absl::StrCat(dir, "/", command[0], ".log");
    const pid_t pid = Spawn(args, log);
    const std::string ready = systemd.Next(/*skip_pings=*/true);
    EXPECT_EQ(ready.rfind("READY=1\nSTATUS=", 0), 0u) << ready << ReadText(log);
    // Ready means serving: the port is known and the health service answers.
    int port = 0;
    std::ifstream(port_file) >> port;
    ASSERT_GT(port, 0);
    auto health = StubTo<grpc::health::v1::Health>(port);
    grpc::ClientContext ctx;
    Deadline(&ctx);
    grpc::health::v1::HealthCheckResponse r;
    EXPECT_TRUE(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &r).ok());
    health.reset();
    EXPECT_TRUE(systemd.WaitForPing());
    kill(pid, SIGTERM);
    EXPECT_EQ(systemd.Next(/*skip_pings=*/true), "STOPPING=1");
    EXPECT_EQ(Wait(pid), 0) << ReadText(log);
  }
}

// `tern certs`, then a federated run and a gossip run with mutual TLS on every channel.
TEST(Tls, AFederatedRunAndAGossipRunOverMutualTlsWithCertificatesFromTernCerts) {
  const std::string dir = MakeTempDir();
  const std::string certs = dir + "/certs";
  ASSERT_EQ(Wait(Spawn({"certs", "--out=" + certs, "--names=server,client,worker-0,worker-1"},
                       dir + "/certs.log")),
            0)
      << ReadText(dir + "/certs.log");
  auto tls = [&](const std::string& who) -> std::vector<std::string> {
    return {"--tls_cert=" + certs + "/" + who + ".crt", "--tls_key=" + certs + "/" + who + ".key",
            "--tls_ca=" + certs + "/ca.crt"};
  };
  Daemons daemons;
  daemons.Add(Spawn(With({"server", "--listen=127.0.0.1:0", "--port_file=" + dir + "/server.port",
                          "--run_id=it", "--min_clients=2", "--clients_per_round=2", "--rounds=3",
                          "--local_epochs=0", "--local_steps=5", "--linger_s=600"},
                         tls("server")),
                    dir + "/server.log"));
  const int port = WaitForPort(dir + "/server.port");
  ASSERT_GT(port, 0) << ReadText(dir + "/server.log");
  const std::string target = absl::StrCat("--target=127.0.0.1:", port);
  // Without a certificate nothing gets in; with one from the CA it does.
  EXPECT_EQ(Wait(Spawn({"health", target, "--timeout_s=3"}, dir + "/h1.log")), 2)
      << ReadText(dir + "/h1.log");
  EXPECT_EQ(Wait(Spawn(With({"health", target}, tls("client")), dir + "/h2.log")), 0)
      << ReadText(dir + "/h2.log");
  EXPECT_EQ(Wait(Spawn(With({"client", absl::StrCat("--server=127.0.0.1:", port), "--clients=2",
                             "--run_id=it"},
                            tls("client")),
                       dir + "/clients.log")),
            0)
      << ReadText(dir + "/clients.log");
  TlsFiles client;
  client.cert = certs + "/client.crt";
  client.key = certs + "/client.key";
  client.ca = certs + "/ca.crt";
  auto creds = ChannelCredentialsFor(client);
  ASSERT_TRUE(creds.ok()) << creds.status();
  auto stub = v1::Aggregator::NewStub(
      MakeChannel(absl::StrCat("127.0.0.1:", port), ChannelKind::kDefault, *creds));
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::ServerStatus st;
  ASSERT_TRUE(stub->Status(&ctx, v1::StatusRequest(), &st).ok());
  EXPECT_TRUE(st.done());
  EXPECT_EQ(st.round(), 3u);
  EXPECT_EQ(st.updates_accepted(), 6u);

  // Two gossip workers, each pushing to the other over mutual TLS, mix at every step.
  for (int i : {0, 1}) {
    daemons.Add(
        Spawn(With({"worker", absl::StrCat("--id=", i), "--workers=2", "--listen=127.0.0.1:0",
                    absl::StrCat("--port_file=", dir, "/w", i, ".port"),
                    "--peers_file=" + dir + "/peers.txt", "--max_steps=40",
                    absl::StrCat("--round_log=", dir, "/w", i, ".jsonl")},
                   tls(absl::StrCat("worker-", i))),
              absl::StrCat(dir, "/w", i, ".log")));
  }
  const int w0 = WaitForPort(dir + "/w0.port"), w1 = WaitForPort(dir + "/w1.port");
  ASSERT_GT(w0 * w1, 0);
  {
    std::ofstream peers(dir + "/peers.tmp");
    peers << "127.0.0.1:" << w0 << "\n127.0.0.1:" << w1 << "\n";
  }
  std::rename((dir + "/peers.tmp").c_str(), (dir + "/peers.txt").c_str());
  for (int i : {0, 1}) {
    const std::string log = absl::StrCat(dir, "/w", i, ".jsonl");
    size_t steps = 0;
    for (int t = 0; t < 1200 && steps < 40; ++t) {
      steps = 0;
      std::ifstream f(log);
      std::string line;
      while (std::getline(f, line)) steps += line.find("\"mixed\":1") != std::string::npos;
      if (steps < 40) usleep(100 * 1000);
    }
    EXPECT_EQ(steps, 40u) << ReadText(absl::StrCat(dir, "/w", i, ".log"));
  }
}

// Identity on every call: a federated run of two honest clients (one by certificate, one by
// token) goes to its end while calls with no credentials, another CA's certificate, an expired
// one, a valid certificate used for another client's id and a token used for another client's
// id are each refused with the reason; a worker takes gossip only from the names it is given.
TEST(Security, EveryWrongCredentialIsRefusedWithItsReasonWhileTheRunGoesOn) {
  const std::string dir = MakeTempDir();
  const std::string certs = dir + "/certs", other = dir + "/other";
  for (const auto& [args, log] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"certs", "--out=" + certs,
             "--names=server,client,mallory,worker-0,worker-1,worker-2,trainer-0"},
            "c1"},
           {{"certs", "--out=" + certs, "--names=expired", "--days=0"}, "c2"},
           {{"certs", "--out=" + other, "--names=client"}, "c3"},
           {{"tokens", "--out=" + certs, "--names=client-t,spy"}, "c4"}}) {
    ASSERT_EQ(Wait(Spawn(args, dir + "/" + log)), 0) << ReadText(dir + "/" + log);
  }
  const std::string ca = "--tls_ca=" + certs + "/ca.crt";
  auto cert = [&](const std::string& who) -> std::vector<std::string> {
    return {"--tls_cert=" + certs + "/" + who + ".crt", "--tls_key=" + certs + "/" + who + ".key",
            ca};
  };
  constexpr int kRounds = 8;
  Daemons daemons;
  daemons.Add(Spawn(
      With({"server", "--listen=127.0.0.1:0", "--port_file=" + dir + "/server.port", "--run_id=it",
            "--min_clients=2", "--clients_per_round=2", absl::StrCat("--rounds=", kRounds),
            "--local_epochs=0", "--local_steps=20", "--linger_s=600",
            "--tokens=" + certs + "/tokens", "--metrics_listen=127.0.0.1:0"},
           cert("server")),
      dir + "/server.log"));
  const int port = WaitForPort(dir + "/server.port");
  ASSERT_GT(port, 0) << ReadText(dir + "/server.log");
  const std::string server = absl::StrCat("--server=127.0.0.1:", port);
  const pid_t by_cert = Spawn(
      With({"client", server, "--clients=1", "--partitions=2", "--run_id=it"}, cert("client")),
      dir + "/client.log");
  const pid_t by_token =
      Spawn({"client", server, "--clients=1", "--partitions=2", "--first_client=1", "--run_id=it",
             ca, "--token_file=" + certs + "/client-t.token"},
            dir + "/client-t.log");

  auto stub_as = [&](const TlsFiles& tls) {
    auto creds = ChannelCredentialsFor(tls);
    EXPECT_TRUE(creds.ok()) << creds.status();
    return v1::Aggregator::NewStub(
        MakeChannel(absl::StrCat("127.0.0.1:", port), ChannelKind::kDefault, *creds));
  };
  auto files = [&](const std::string& base, const std::string& who) {
    TlsFiles t;
    t.ca = certs + "/ca.crt";
    if (!who.empty()) {
      t.cert = base + "/" + who + ".crt";
      t.key = base + "/" + who + ".key";
    }
    return t;
  };
  TlsFiles spy = files(certs, "");
  spy.token = certs + "/spy.token";
  auto mallory = stub_as(files(certs, "mallory"));
  // Both honest clients have joined (ids 0 and 1) before anyone tries to act as them.
  uint32_t joined = 0;
  for (int i = 0; i < 600 && joined < 2; ++i) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::ServerStatus st;
    if (mallory->Status(&ctx, v1::StatusRequest(), &st).ok()) joined = st.clients_joined();
    if (joined < 2) usleep(50 * 1000);
  }
  ASSERT_EQ(joined, 2u) << ReadText(dir + "/client.log") << ReadText(dir + "/client-t.log");
  auto join = [&](v1::Aggregator::Stub* stub, int64_t id) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::JoinRequest req;
    req.set_run_id("it");
    req.set_name("attacker");
    req.set_client_id(id);
    v1::JoinReply reply;
    return stub->Join(&ctx, req, &reply);
  };
  auto push = [&](v1::Aggregator::Stub* stub, uint32_t id) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::UpdateReply reply;
    auto writer = stub->Push(&ctx, &reply);
    v1::UpdateRequest req;
    req.mutable_info()->set_client_id(id);
    req.mutable_chunk()->set_total_size(4);
    req.mutable_chunk()->set_data("junk");
    writer->Write(req);
    writer->WritesDone();
    return writer->Finish();
  };
  auto fetch = [&](v1::Aggregator::Stub* stub, uint32_t id) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::FetchRequest req;
    req.set_client_id(id);
    auto reader = stub->Fetch(&ctx, req);
    v1::FetchReply r;
    while (reader->Read(&r)) {
    }
    return reader->Finish();
  };
  auto expect = [](const grpc::Status& s, grpc::StatusCode code, const std::string& says,
                   const std::string& what) {
    EXPECT_EQ(s.error_code(), code) << what << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(says), std::string::npos) << what << ": " << s.error_message();
  };
  using grpc::StatusCode;
  TlsFiles foreign = files(other, "client");
  foreign.ca = certs + "/ca.crt";  // trusts the server; its own certificate is from another CA
  expect(join(stub_as(files(certs, "")).get(), -1), StatusCode::UNAUTHENTICATED, "no credentials",
         "no credentials");
  expect(join(stub_as(foreign).get(), -1), StatusCode::UNAUTHENTICATED, "another CA",
         "another CA's certificate");
  expect(join(stub_as(files(certs, "expired")).get(), -1), StatusCode::UNAUTHENTICATED, "expired",
         "an expired certificate");
  for (uint32_t id : {0u, 1u}) {
    const std::string as = absl::StrCat(" as client ", id);
    expect(join(mallory.get(), id), StatusCode::PERMISSION_DENIED, "cannot take it back",
           "mallory joins" + as);
    expect(push(mallory.get(), id), StatusCode::PERMISSION_DENIED, "this call comes from 'mallory'",
           "mallory pushes" + as);
    expect(fetch(mallory.get(), id), StatusCode::PERMISSION_DENIED, "this call comes from",
           "mallory fetches" + as);
    expect(push(stub_as(spy).get(), id), StatusCode::PERMISSION_DENIED,
           "this call comes from 'spy'", "the spy's token pushes" + as);
  }
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::LeaveRequest req;
    req.set_client_id(0);
    v1::LeaveReply reply;
    expect(mallory->Leave(&ctx, req, &reply), StatusCode::PERMISSION_DENIED, "joined as",
           "mallory makes client 0 leave");
  }
  // A plaintext client is hung up on; both sides say why.
  const pid_t plain = Spawn({"health", absl::StrCat("--target=127.0.0.1:", port), "--timeout_s=3"},
                            dir + "/plain.log");
  EXPECT_EQ(Wait(plain), 2);
  EXPECT_NE(ReadText(dir + "/plain.log").find("needs --tls_ca"), std::string::npos)
      << ReadText(dir + "/plain.log");

  // The honest clients finish the run: every round, both updates in each.
  EXPECT_EQ(Wait(by_cert), 0) << ReadText(dir + "/client.log");
  EXPECT_EQ(Wait(by_token), 0) << ReadText(dir + "/client-t.log");
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::ServerStatus st;
  ASSERT_TRUE(mallory->Status(&ctx, v1::StatusRequest(), &st).ok());
  EXPECT_TRUE(st.done());
  EXPECT_EQ(st.round(), static_cast<uint64_t>(kRounds));
  EXPECT_EQ(st.updates_accepted(), 2u * kRounds);
  const std::string log = ReadText(dir + "/server.log");
  for (const char* said :
       {"authenticated as client-t", "authenticated as client", "spoke plaintext",
        "refused a call: the client certificate (CN=expired)"}) {
    EXPECT_NE(log.find(said), std::string::npos) << said << "\n" << log;
  }
  // ... and counts them for Prometheus.
  absl::StatusOr<std::string> metrics =
      testing::HttpGet(MetricsPort(dir + "/server.log"), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  for (const char* line :
       {"tern_server_calls_unauthenticated_total{run=\"it\",reason=\"no_credentials\"} 1",
        "tern_server_calls_unauthenticated_total{run=\"it\",reason=\"another_ca\"} 1",
        "tern_server_calls_unauthenticated_total{run=\"it\",reason=\"expired\"} 1",
        // 2 joins, 4 pushes, 2 fetches, a leave
        "tern_server_calls_permission_denied_total{run=\"it\"} 9"}) {
    EXPECT_NE(metrics->find(line), std::string::npos) << line << "\n" << *metrics;
  }

  // A worker that takes gossip from worker-* only, each as the worker its name says, and trainer
  // calls from trainer-0 only: a client's certificate from the same CA is refused everywhere; a
  // worker's gets past the check (to the message's own checks) when it sends as itself.
  daemons.Add(Spawn(With({"worker", "--id=0", "--workers=2", "--listen=127.0.0.1:0",
                          "--port_file=" + dir + "/w0.port", "--peers_file=" + dir + "/none.txt",
                          "--peer_names=worker-*", "--trainer_names=trainer-0"},
                         cert("worker-0")),
                    dir + "/w0.log"));
  const int w0 = WaitForPort(dir + "/w0.port");
  ASSERT_GT(w0, 0) << ReadText(dir + "/w0.log");
  auto channel_as = [&](const std::string& who) {
    auto creds = ChannelCredentialsFor(files(certs, who));
    EXPECT_TRUE(creds.ok()) << creds.status();
    return MakeChannel(absl::StrCat("127.0.0.1:", w0), ChannelKind::kDefault, *creds);
  };
  // A whole message as worker `sender` (the engine's checks come after the caller's).
  auto gossip = [&](const std::string& who, const std::string& sender) {
    auto stub = v1::Gossip::NewStub(channel_as(who));
    grpc::ClientContext c;
    Deadline(&c);
    v1::PushReply reply;
    auto writer = stub->Push(&c, &reply);
    v1::TensorBundle b;
    b.set_run_id("tern");
    b.set_sender(sender);
    b.set_round(1);
    absl::StatusOr<std::vector<v1::BundleChunk>> chunks = ChunkBundle(b, 1);
    EXPECT_TRUE(chunks.ok()) << chunks.status();
    for (const v1::BundleChunk& chunk : *chunks) writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  };
  expect(gossip("client", "1"), StatusCode::PERMISSION_DENIED, "'client' may not gossip",
         "a client's certificate gossips");
  // worker-2 matches worker-* but may not speak for worker 1.
  expect(gossip("worker-2", "1"), StatusCode::PERMISSION_DENIED,
         "'worker-2' sent as worker '1'; its name makes it worker 2", "worker-2 as worker 1");
  const grpc::Status peer = gossip("worker-1", "1");
  EXPECT_NE(peer.error_code(), StatusCode::PERMISSION_DENIED) << peer.error_message();
  EXPECT_NE(peer.error_code(), StatusCode::UNAUTHENTICATED) << peer.error_message();

  // Every Trainer call: only trainer-0's.
  auto trainer_calls = [&](const std::string& who) {
    auto stub = v1::Trainer::NewStub(channel_as(who));
    std::vector<grpc::Status> out;
    {
      grpc::ClientContext c;
      Deadline(&c);
      v1::WorkerStats stats;
      out.push_back(stub->Stats(&c, v1::StatsRequest(), &stats));
    }
    {
      grpc::ClientContext c;
      Deadline(&c);
      auto reader = stub->Snapshot(&c, v1::SnapshotRequest());
      v1::SnapshotReply r;
      while (reader->Read(&r)) {
      }
      out.push_back(reader->Finish());
    }
    {
      grpc::ClientContext c;
      Deadline(&c);
      v1::RegisterReply reply;
      auto writer = stub->Register(&c, &reply);
      writer->WritesDone();
      out.push_back(writer->Finish());
    }
    {
      grpc::ClientContext c;
      Deadline(&c);
      auto stream = stub->Step(&c);
      stream->WritesDone();
      v1::StepReply r;
      while (stream->Read(&r)) {
      }
      out.push_back(stream->Finish());
    }
    {
      grpc::ClientContext c;
      Deadline(&c);
      v1::SharedMemoryInfo info;
      out.push_back(stub->OpenSharedMemory(&c, v1::OpenSharedMemoryRequest(), &info));
    }
    {
      grpc::ClientContext c;
      Deadline(&c);
      v1::StepResult r;
      out.push_back(stub->StepShared(&c, v1::StepInfo(), &r));
    }
    return out;
  };
  for (const std::string who : {"client", "worker-1"}) {
    for (const grpc::Status& s : trainer_calls(who)) {
      expect(s, StatusCode::PERMISSION_DENIED, "is not this worker's trainer", who + " as trainer");
    }
  }
  // The trainer's own calls go through to the worker (Stats answers at once), which serves on.
  EXPECT_TRUE(trainer_calls("trainer-0")[0].ok());
}

// `tern run --tls`: certificates made in the run folder, every process of the run on mutual TLS.
TEST(Tls, TernRunWithTlsTrainsAsWithoutIt) {
  const std::string dir = MakeTempDir();
  ASSERT_EQ(Wait(Spawn({"run", "--tls", "--workers=3", "--epochs=1", "--evals_per_epoch=1",
                        "--scheduler=local", "--log_level=warn", "--out=" + dir},
                       dir + "/run.log")),
            0)
      << ReadText(dir + "/run.log");
  for (const char* f :
       {"ca.crt", "launcher.crt", "scheduler.crt", "worker-0.crt", "worker-2.key"}) {
    EXPECT_NE(ReadText(dir + "/certs/" + f).find("-----BEGIN"), std::string::npos) << f;
  }
  EXPECT_NE(ReadText(dir + "/run.log").find("done: test accuracy"), std::string::npos)
      << ReadText(dir + "/run.log");
}

}  // namespace
}  // namespace tern
