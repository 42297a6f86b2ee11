// A blocking HTTP/1.0 GET for tests (a metrics endpoint, Prometheus's API): the body of a
// 200 answer, or an error saying what came back.
//
// Thread-safety: a free function.
#ifndef TERN_TESTS_TESTING_HTTP_GET_H_
#define TERN_TESTS_TESTING_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tern::testing {

inline absl::StatusOr<std::string> HttpGet(int port, const std::string& path,
                                           const std::string& host = "127.0.0.1") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to ", host, ":", port));
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, "\r\n\r\n");
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("short write");
  }
  std::string answer;
  char buf[16384];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) answer.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = answer.find("\r\n\r\n");
  if (answer.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::DataLossError(absl::StrCat("not an HTTP answer: ", answer.substr(0, 200)));
  }
  if (answer.substr(9, 3) != "200") {
    return absl::FailedPreconditionError(absl::StrCat("HTTP ", answer.substr(9, 60)));
  }
  return answer.substr(body + 4);
}

}  // namespace tern::testing

#endif  // TERN_TESTS_TESTING_HTTP_GET_H_
