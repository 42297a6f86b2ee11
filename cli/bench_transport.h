// `tern bench transport`: how fast one gossip message moves through the real service on
// loopback — a GrpcTransport push (chunks, the callback client) into a live WorkerDaemon's
// Gossip.Stream (or Gossip.Push), which reassembles, CRC-checks and validates it and puts it in
// the round's inbox — against a raw TCP socket moving the same bytes on loopback in the same
// run, and the same message as a Push call of its own.
#ifndef TERN_CLI_BENCH_TRANSPORT_H_
#define TERN_CLI_BENCH_TRANSPORT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace tern {

struct BenchTransportOptions {
  std::vector<uint64_t> sizes;  // message sizes in fp32 values
  int repeats = 5;              // timed pushes per size (after one warm-up)
  // Also push through a second receiver with mutual TLS (development certificates made for the
  // run), in the same run, and print its GB/s and its ratio to the plaintext push.
  bool tls = false;
  // Streams a push of 8 MiB or more is spread over (--push_stripes, as a worker's); the table
  // also shows the same push over one stream.
  int push_stripes = 2;
};

// Prints a table: size, push GB/s, raw TCP GB/s, ratio (medians over the repeats).
absl::Status RunBenchTransport(const BenchTransportOptions& options);

}  // namespace tern

#endif  // TERN_CLI_BENCH_TRANSPORT_H_
