// tern-delay-line: holds every packet of an NFQUEUE queue for a fixed time, then lets it go.
//
// This kernel has no netem, so links with delay are made in user space: iptables sends the
// packets a router would forward to a queue (`-j NFQUEUE --queue-num N`), and this program holds
// each one `--delay_ms` before accepting it. Held at a forwarding hop (a bridge with
// br_netfilter, or a router namespace), a TCP flow sees the delay as a real path's; held on the
// sending host's own egress, TCP small queues count held packets against the socket and throttle
// it, so put it in between (bench/race/netns.py, deploy/slow-link.sh). A packet crosses the hop
// once each way, so a round trip of R takes --delay_ms=R/2.
//
//   tern-delay-line --queue=7 --delay_ms=50     # then: iptables -A FORWARD -j NFQUEUE --queue-num
//   7
//
// Packets are never copied to user space (NFQNL_COPY_META) nor segmented (NFQA_CFG_F_GSO): only
// their ids come up, and one batch verdict releases every due one. SIGINT/SIGTERM release what
// is held and exit 0; counts go to stderr on exit (and every --stats_s).
//
// With --tick_ms=T the line wakes once every T ms, not for each packet: a real link's delay costs
// its hosts no CPU, and here every wake-up takes a core from the programs under test (~1,600 a
// second at 10 Mbit/s between four sites of the race). Each packet is held from the time the
// kernel stamped it on arrival (its time of reading, less T/2, where the kernel gives none), and
// released at the first tick at least --delay_ms - T/2 later: held --delay_ms ± T/2. While
// nothing is held the line sleeps until a packet comes.
// glibc's <netinet/in.h> first: the kernel's headers step aside for it, not the other way.
// clang-format off
#include <netinet/in.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <linux/netlink.h>
// clang-format on
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "bench/delayline/delay_queue.h"

ABSL_FLAG(int, queue, 0, "the NFQUEUE queue number to bind (iptables --queue-num)");
ABSL_FLAG(double, delay_ms, 0, "how long each packet is held, ms (a round trip of R: R/2)");
ABSL_FLAG(int, capacity, 200000, "packets held at most; more are dropped, as by a full router");
ABSL_FLAG(int, stats_s, 0, "print counts every this many seconds (0: only on exit)");
ABSL_FLAG(double, tick_ms, 0,
          "wake once every this many ms and hold each packet --delay_ms ± tick_ms/2 "
          "(0: wake for every packet, hold it exactly)");

namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

int64_t ClockNs(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

int64_t NowNs() { return ClockNs(CLOCK_MONOTONIC); }

struct State {
  tern::delayline::DelayQueue* queue;
  nfq_q_handle* qh = nullptr;
  int64_t tick_ns = 0;
  // Set before each read of the socket (tick mode): the monotonic time, and the monotonic clock
  // less the real one, to move the kernel's arrival stamps (real time) onto the queue's clock.
  int64_t read_ns = 0;
  int64_t mono_minus_real_ns = 0;
  uint64_t stamped = 0;    // held from the kernel's arrival stamp
  uint64_t unstamped = 0;  // held from the time they were read
};

// When the packet came, on the monotonic clock: the kernel's stamp where there is a plausible
// one (within the last second), else the middle of the tick it came in.
int64_t ArrivalNs(State* state, nfq_data* nfa) {
  timeval tv{};
  if (nfq_get_timestamp(nfa, &tv) == 0) {
    const int64_t at =
        (int64_t{tv.tv_sec} * 1'000'000 + tv.tv_usec) * 1'000 + state->mono_minus_real_ns;
    if (at <= state->read_ns + 1'000'000 && at >= state->read_ns - 1'000'000'000) {
      ++state->stamped;
      return at;
    }
  }
  ++state->unstamped;
  return state->read_ns - state->tick_ns / 2;
}

int OnPacket(nfq_q_handle* qh, nfgenmsg*, nfq_data* nfa, void* data) {
  auto* state = static_cast<State*>(data);
  const nfqnl_msg_packet_hdr* ph = nfq_get_msg_packet_hdr(nfa);
  if (ph == nullptr) return 0;
  const uint32_t id = ntohl(ph->packet_id);
  const int64_t arrived = state->tick_ns > 0 ? ArrivalNs(state, nfa) : NowNs();
  if (!state->queue->Push(id, arrived)) nfq_set_verdict(qh, id, NF_DROP, 0, nullptr);
  return 0;
}

// Every message waiting on the queue's socket, handed to OnPacket.
void ReadAll(nfq_handle* h, int fd, std::vector<char>& buf) {
  for (;;) {
    const ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n <= 0) break;
    nfq_handle_packet(h, buf.data(), static_cast<int>(n));
  }
}

void PrintStats(const State& state, const char* when) {
  const tern::delayline::DelayQueue& q = *state.queue;
  std::fprintf(stderr,
               "tern-delay-line: %s: %llu released, %llu dropped (queue full), %zu held now, "
               "%zu held at most",
               when, static_cast<unsigned long long>(q.released()),
               static_cast<unsigned long long>(q.dropped()), q.held(), q.max_held());
  if (state.tick_ns > 0) {
    std::fprintf(stderr, "; %llu held from the kernel's arrival stamp, %llu from their reading",
                 static_cast<unsigned long long>(state.stamped),
                 static_cast<unsigned long long>(state.unstamped));
  }
  std::fprintf(stderr, "\n");
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tern-delay-line --queue=N --delay_ms=D: holds each packet of NFQUEUE queue N for D ms");
  absl::ParseCommandLine(argc, argv);
  const int queue_num = absl::GetFlag(FLAGS_queue);
  const double delay_ms = absl::GetFlag(FLAGS_delay_ms);
  const int capacity = absl::GetFlag(FLAGS_capacity);
  const double tick_ms = absl::GetFlag(FLAGS_tick_ms);
  if (queue_num < 0 || queue_num > 65535 || delay_ms < 0 || delay_ms > 10'000 || capacity < 1 ||
      tick_ms < 0 || tick_ms > 2 * delay_ms) {
    std::fprintf(stderr,
                 "tern-delay-line: --queue in [0, 65535], --delay_ms in [0, 10000], "
                 "--capacity >= 1, --tick_ms in [0, 2 × delay_ms]\n");
    return 2;
  }
  const auto tick_ns = static_cast<int64_t>(tick_ms * 1e6);
  tern::delayline::DelayQueue queue(static_cast<int64_t>(delay_ms * 1e6), capacity, tick_ns);
  State state{&queue};
  state.tick_ns = tick_ns;

  nfq_handle* h = nfq_open();
  if (h == nullptr) {
    std::fprintf(stderr, "tern-delay-line: nfq_open: %s (needs CAP_NET_ADMIN)\n",
                 std::strerror(errno));
    return 1;
  }
  // Older kernels need the family bound; newer ones ignore it.
  nfq_unbind_pf(h, AF_INET);
  nfq_bind_pf(h, AF_INET);
  state.qh = nfq_create_queue(h, queue_num, &OnPacket, &state);
  if (state.qh == nullptr) {
    std::fprintf(stderr, "tern-delay-line: queue %d: %s (is another program bound to it?)\n",
                 queue_num, std::strerror(errno));
    nfq_close(h);
    return 1;
  }
  if (nfq_set_mode(state.qh, NFQNL_COPY_META, 0) < 0 ||
      nfq_set_queue_maxlen(state.qh, static_cast<uint32_t>(capacity)) < 0) {
    std::fprintf(stderr, "tern-delay-line: configuring queue %d: %s\n", queue_num,
                 std::strerror(errno));
    nfq_destroy_queue(state.qh);
    nfq_close(h);
    return 1;
  }
  // GSO packets whole (fewer, larger packets to hold); kernels without it segment them.
  nfq_set_queue_flags(state.qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
  const int fd = nfq_fd(h);
  // A second of 1 Gbit/s in the socket (a tick's packets wait there), and a burst beyond it is
  // dropped by the kernel, not reported as ENOBUFS.
  nfnl_rcvbufsiz(nfq_nfnlh(h), 128 << 20);
  int one = 1;
  setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof(one));

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::printf("tern-delay-line: queue %d bound, holding packets %.3f ms", queue_num, delay_ms);
  if (tick_ns > 0) std::printf(" ± %.3f ms (a tick every %.3f ms)", tick_ms / 2, tick_ms);
  std::printf("\n");
  std::fflush(stdout);

  const int stats_s = absl::GetFlag(FLAGS_stats_s);
  int64_t next_stats = stats_s > 0 ? NowNs() + int64_t{stats_s} * 1'000'000'000 : INT64_MAX;
  // Both loops: every packet due at `now` goes, and the counts now and then.
  auto release_due = [&](int64_t now) {
    if (auto last = queue.PopDue(now)) nfq_set_verdict_batch(state.qh, *last, NF_ACCEPT);
    if (now >= next_stats) {
      PrintStats(state, "so far");
      next_stats = now + int64_t{stats_s} * 1'000'000'000;
    }
  };
  std::vector<char> buf(1 << 16);
  // The kernel stamps a packet on arrival only while some socket asks for stamps.
  const int stamps = tick_ns > 0 ? socket(AF_INET, SOCK_DGRAM, 0) : -1;
  if (stamps >= 0) setsockopt(stamps, SOL_SOCKET, SO_TIMESTAMP, &one, sizeof(one));
  int64_t next_tick = NowNs() + tick_ns;
  while (!g_stop && tick_ns > 0) {
    const timespec at{static_cast<time_t>(next_tick / 1'000'000'000),
                      static_cast<long>(next_tick % 1'000'000'000)};
    // EINTR (a signal) ends the sleep early: the loop sees g_stop.
    if (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, nullptr) != 0) continue;
    state.read_ns = NowNs();
    state.mono_minus_real_ns = state.read_ns - ClockNs(CLOCK_REALTIME);
    ReadAll(h, fd, buf);
    const int64_t now = NowNs();
    release_due(now);
    next_tick += tick_ns;
    if (next_tick <= now) next_tick = now + tick_ns;  // ticks missed (the line was not run)
    if (queue.held() == 0) {
      // An idle link: no ticks until a packet comes (or a while passes, to see a signal's flag).
      pollfd pfd{fd, POLLIN, 0};
      const timespec idle{0, 200'000'000};
      if (ppoll(&pfd, 1, &idle, nullptr) > 0) next_tick = NowNs() + tick_ns;
    }
  }
  while (!g_stop) {
    const int64_t now = NowNs();
    release_due(now);
    int64_t wait_ns = 200'000'000;  // wake now and then to see a signal's flag
    if (auto next = queue.NextRelease())
      wait_ns = std::min(wait_ns, std::max<int64_t>(0, *next - now));
    const timespec timeout{static_cast<time_t>(wait_ns / 1'000'000'000),
                           static_cast<long>(wait_ns % 1'000'000'000)};
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ppoll(&pfd, 1, &timeout, nullptr);
    if (ready < 0 && errno != EINTR) {
      std::fprintf(stderr, "tern-delay-line: poll: %s\n", std::strerror(errno));
      break;
    }
    if (ready > 0) ReadAll(h, fd, buf);
  }
  if (auto last = queue.PopAll()) nfq_set_verdict_batch(state.qh, *last, NF_ACCEPT);
  PrintStats(state, "exiting");
  if (stamps >= 0) close(stamps);
  nfq_destroy_queue(state.qh);
  nfq_close(h);
  return 0;
}
