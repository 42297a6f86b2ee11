#include "clients/flags/limit_flags.h"

#include "absl/flags/flag.h"
#include "clients/flags/flag_types.h"

ABSL_FLAG(tern::Int<tern::AtLeast(0)>, max_streams, 0,
          "daemons: incoming streams open at once, in total (0: the daemon's default, worker "
          "512, server 4096)");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, max_streams_per_peer, 0,
          "daemons: incoming streams open at once from one host (0: worker 64, server 4096)");
ABSL_FLAG(tern::Uint64<tern::AtLeast(0)>, max_buffered_mb, 0,
          "daemons: MiB that incoming streams may buffer together before their message is "
          "complete (0: sized for the model: worker 8 models, server 16 updates; at least 64 / "
          "256 MiB)");
ABSL_FLAG(tern::Double<tern::Above(0)>, stream_idle_s, 60,
          "daemons: cancel an incoming stream silent this long");
ABSL_FLAG(tern::Double<tern::Above(0)>, stream_deadline_s, 1800,
          "daemons: cancel an incoming stream open this long");

namespace tern {

StreamLimitOptions StreamLimitsFromFlags(StreamLimitOptions o) {
  if (absl::GetFlag(FLAGS_max_streams).value > 0) {
    o.max_streams = absl::GetFlag(FLAGS_max_streams).value;
  }
  if (absl::GetFlag(FLAGS_max_streams_per_peer).value > 0) {
    o.max_streams_per_peer = absl::GetFlag(FLAGS_max_streams_per_peer).value;
  }
  if (absl::GetFlag(FLAGS_max_buffered_mb).value > 0) {
    o.max_buffered_bytes = absl::GetFlag(FLAGS_max_buffered_mb).value << 20;
  }
  o.idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_stream_idle_s).value);
  o.max_duration = absl::Seconds(absl::GetFlag(FLAGS_stream_deadline_s).value);
  return o;
}

}  // namespace tern
