#include "core/rpc/channel.h"

namespace tern {

std::vector<std::pair<std::string, int>> Http2Tuning() {
  // Tensors stream as 1 MiB chunks: frames that carry a chunk whole, and a stream window that
  // lets several chunks be in flight before the receiver's first WINDOW_UPDATE (gRPC's 64 KiB
  // default stalls every new push on a fast link).
  return {{GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (1 << 20) + (64 << 10)},
          {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20}};
}

grpc::ChannelArguments TernChannelArguments() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetMaxReceiveMessageSize(4 << 20);
  for (const auto& [name, value] : Http2Tuning()) args.SetInt(name, value);
  return args;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target) {
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                   TernChannelArguments());
}

}  // namespace tern
