// A Unix-domain SOCK_SEQPACKET server for request/reply between two processes on one host: one
// thread accepts a client, reads its messages one at a time and answers each with what the
// handler returns, then accepts the next client. Message boundaries are kept by the socket, so a
// message is one read and one write; a wake-up per message on each side is all it costs, which
// is why a trainer on the worker's host steps through one (docs/trainer-shm.md).
//
// Messages are never empty: a zero-length read is how a socket says its peer left. The socket
// file is made with mode 0600 and removed when the server stops.
//
// Thread-safety: the handler runs on the server's thread only; Stop() may be called from any
// thread, once, and also runs on destruction.
#ifndef TERN_COMMON_SEQPACKET_SERVER_H_
#define TERN_COMMON_SEQPACKET_SERVER_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tern {

class SeqpacketServer {
 public:
  // Takes a request, returns the reply (at most kMaxMessage bytes).
  using Handler = std::function<std::string(absl::string_view request)>;
  static constexpr size_t kMaxMessage = 64 << 10;

  // Listens on `path` (which must not exist) and starts serving.
  static absl::StatusOr<std::unique_ptr<SeqpacketServer>> Start(const std::string& path,
                                                                Handler handler);
  ~SeqpacketServer();
  SeqpacketServer(const SeqpacketServer&) = delete;
  SeqpacketServer& operator=(const SeqpacketServer&) = delete;

  const std::string& path() const { return path_; }
  // Closes the listener and the client's connection, waits for the thread (and a handler that is
  // running) to finish, removes the socket file.
  void Stop();

 private:
  SeqpacketServer(std::string path, int listen_fd, Handler handler);
  void Serve();
  void ServeClient(int fd);

  const std::string path_;
  const int listen_fd_;
  const Handler handler_;
  std::atomic<int> client_fd_{-1};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace tern

#endif  // TERN_COMMON_SEQPACKET_SERVER_H_
