#include "common/seqpacket_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tern {

absl::StatusOr<std::unique_ptr<SeqpacketServer>> SeqpacketServer::Start(const std::string& path,
                                                                        Handler handler) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is empty or long"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  // Owner only from the start: the file is created by bind() with these bits.
  const mode_t old_mask = umask(0077);
  const int bound = bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  umask(old_mask);
  if (bound != 0 || chmod(path.c_str(), 0600) != 0 || listen(fd, 1) != 0) {
    const int e = bound != 0 ? bind_errno : errno;
    close(fd);
    if (bound == 0) unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("listen on ", path, ": ", std::strerror(e)));
  }
  std::unique_ptr<SeqpacketServer> s(new SeqpacketServer(path, fd, std::move(handler)));
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

SeqpacketServer::SeqpacketServer(std::string path, int listen_fd, Handler handler)
    : path_(std::move(path)), listen_fd_(listen_fd), handler_(std::move(handler)) {}

SeqpacketServer::~SeqpacketServer() { Stop(); }

void SeqpacketServer::Stop() {
  if (stopping_.exchange(true)) return;  // stopped already (Stop(), then the destructor)
  // shutdown() wakes a thread blocked in accept() or recv() on these descriptors.
  shutdown(listen_fd_, SHUT_RDWR);
  const int c = client_fd_.load();
  if (c >= 0) shutdown(c, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  unlink(path_.c_str());
}

void SeqpacketServer::Serve() {
  while (!stopping_.load()) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down (EINVAL) or out of descriptors: nothing more to serve
    }
    client_fd_.store(fd);
    if (stopping_.load()) shutdown(fd, SHUT_RDWR);  // Stop() ran between accept and store
    ServeClient(fd);
    client_fd_.store(-1);
    close(fd);
  }
}

void SeqpacketServer::ServeClient(int fd) {
  std::vector<char> buf(kMaxMessage);
  while (true) {
    const ssize_t n = recv(fd, buf.data(), buf.size(), MSG_TRUNC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client left, or Stop()
    // A message longer than the buffer was cut; refuse it rather than act on part of it.
    const std::string reply = static_cast<size_t>(n) > buf.size()
                                  ? std::string()
                                  : handler_(absl::string_view(buf.data(), static_cast<size_t>(n)));
    if (reply.empty() || reply.size() > kMaxMessage) return;  // drop the client: it misbehaved
    if (send(fd, reply.data(), reply.size(), MSG_NOSIGNAL) < 0) return;
  }
}

}  // namespace tern
