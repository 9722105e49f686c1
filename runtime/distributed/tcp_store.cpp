#include "runtime/distributed/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace qg::dist {
namespace {

constexpr uint8_t kSet = 1, kGet = 2, kAdd = 3, kWatch = 4, kBye = 5;
// No key or value of a rendezvous comes near this; a larger length is a corrupt stream.
constexpr uint32_t kMaxLength = 64u << 20;

using Clock = std::chrono::steady_clock;

// Reads exactly n bytes; false on end of stream, error, or (with a deadline) timeout.
bool read_exact(int fd, void* dst, size_t n, const Clock::time_point* deadline) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    if (deadline) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd pfd{fd, POLLIN, 0};
      const int r = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000)));
      if (r < 0 && errno != EINTR) return false;
      if (r <= 0) continue;
    }
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool write_all(int fd, const void* src, size_t n) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    const ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const unsigned char* b) {
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}
std::string i64_bytes(int64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[i] = static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
  return s;
}
int64_t bytes_i64(const std::string& s) {
  uint64_t v = 0;
  for (int i = 0; i < 8 && i < static_cast<int>(s.size()); ++i)
    v |= uint64_t{static_cast<unsigned char>(s[i])} << (8 * i);
  return static_cast<int64_t>(v);
}

// Reads one length-prefixed string from the server side (blocking).
bool read_string(int fd, std::string& out) {
  unsigned char len[4];
  if (!read_exact(fd, len, 4, nullptr)) return false;
  const uint32_t n = get_u32(len);
  if (n > kMaxLength) return false;
  out.assign(n, '\0');
  return n == 0 || read_exact(fd, out.data(), n, nullptr);
}

}  // namespace

TcpStoreServer::TcpStoreServer(int port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  QG_CHECK(listen_fd_ >= 0, "rendezvous", "socket(): ", std::strerror(errno));
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_, 128) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    QG_FAIL("rendezvous", "rank 0 cannot serve the store on port ", port, ": ", std::strerror(err),
            " (is MASTER_PORT taken by another run?)");
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);  // wakes the serving threads
  }
  if (acceptor_.joinable()) acceptor_.join();
  for (std::thread& t : threads_) t.join();
  for (int fd : clients_) ::close(fd);
  ::close(listen_fd_);
}

void TcpStoreServer::accept_loop() {
  while (!stopping_) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    const int r = ::poll(&pfd, 1, 200);
    if (r <= 0) continue;
    const int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      ::close(fd);
      break;
    }
    clients_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

bool TcpStoreServer::wait_for_watchers(int except, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      bool any = false;
      for (const auto& [rank, open] : watched_) any = any || (rank != except && open > 0);
      if (!any) return true;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void TcpStoreServer::serve(int fd) {
  // The rank this connection watches for (-1: none), and whether it said bye; a watched
  // connection that ends any other way marks its rank gone.
  int watched = -1;
  bool said_bye = false;
  struct Leave {
    TcpStoreServer* server;
    const int& watched;
    const bool& said_bye;
    ~Leave() {
      if (watched < 0) return;
      std::lock_guard<std::mutex> lock(server->mutex_);
      --server->watched_[watched];
      if (!said_bye && !server->stopping_)
        server->data_["qg/gone/" + std::to_string(watched)] = "1";
    }
  } leave{this, watched, said_bye};
  // A malformed request or a closed connection ends this client's session only.
  while (!stopping_) {
    uint8_t command = 0;
    std::string key, value;
    if (!read_exact(fd, &command, 1, nullptr) || !read_string(fd, key) || !read_string(fd, value))
      return;
    std::string reply;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (command == kSet) {
        data_[key] = value;
        reply = std::string(1, '\1');
      } else if (command == kGet) {
        auto it = data_.find(key);
        if (it == data_.end()) {
          reply = std::string(1, '\0');
        } else {
          reply = std::string(1, '\1');
          put_u32(reply, static_cast<uint32_t>(it->second.size()));
          reply += it->second;
        }
      } else if (command == kAdd) {
        reply = i64_bytes(counters_[key] += bytes_i64(value));
      } else if (command == kWatch && watched < 0) {
        try {
          watched = std::stoi(key);
        } catch (const std::exception&) {
          return;
        }
        ++watched_[watched];
        reply = std::string(1, '\1');
      } else if (command == kBye) {
        said_bye = true;
        reply = std::string(1, '\1');
      } else {
        return;
      }
    }
    if (!write_all(fd, reply.data(), reply.size())) return;
  }
}

TcpStoreClient::TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds timeout)
    : endpoint_(host + ":" + std::to_string(port)), timeout_(timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "timed out";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  QG_CHECK(rc == 0 && res != nullptr, "rendezvous", "cannot resolve MASTER_ADDR '", host,
           "': ", ::gai_strerror(rc));
  while (Clock::now() < deadline) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ >= 0 && ::connect(fd_, res->ai_addr, res->ai_addrlen) == 0) break;
    last_error = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::freeaddrinfo(res);
  QG_CHECK(fd_ >= 0, "rendezvous", "cannot reach the store of rank 0 at ", endpoint_, " within ",
           timeout.count(), " ms (", last_error, "); is rank 0 running?");
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStoreClient::request(uint8_t command, const std::string& key,
                                    const std::string& value, bool reply_has_value) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string msg(1, static_cast<char>(command));
  put_u32(msg, static_cast<uint32_t>(key.size()));
  msg += key;
  put_u32(msg, static_cast<uint32_t>(value.size()));
  msg += value;
  const auto deadline = Clock::now() + timeout_;
  auto lost = [&] {
    QG_FAIL("rendezvous", "the store at ", endpoint_, " stopped answering (request for key '", key,
            "'): rank 0 has exited or failed");
  };
  if (!write_all(fd_, msg.data(), msg.size())) lost();
  if (command == kAdd) {
    std::string out(8, '\0');
    if (!read_exact(fd_, out.data(), 8, &deadline)) lost();
    return out;
  }
  uint8_t found = 0;
  if (!read_exact(fd_, &found, 1, &deadline)) lost();
  if (!reply_has_value || found == 0) return std::string(1, static_cast<char>(found));
  unsigned char len[4];
  if (!read_exact(fd_, len, 4, &deadline)) lost();
  const uint32_t n = get_u32(len);
  QG_CHECK(n <= kMaxLength, "rendezvous", "the store sent a value of ", n, " bytes for '", key,
           "'");
  std::string out(1 + n, '\1');
  if (n > 0 && !read_exact(fd_, out.data() + 1, n, &deadline)) lost();
  return out;
}

void TcpStoreClient::set(const std::string& key, const std::string& value) {
  request(kSet, key, value, false);
}

bool TcpStoreClient::try_get(const std::string& key, std::string& value) {
  std::string r = request(kGet, key, "", true);
  if (r[0] == 0) return false;
  value = r.substr(1);
  return true;
}

std::string TcpStoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string value;
  auto pause = std::chrono::milliseconds(1);
  while (!try_get(key, value)) {
    QG_CHECK(Clock::now() < deadline, "rendezvous", "key '", key,
             "' did not appear in the store at ", endpoint_, " within ", timeout.count(),
             " ms: a rank did not start or failed before publishing it");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  return value;
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  return bytes_i64(request(kAdd, key, i64_bytes(delta), false));
}

void TcpStoreClient::watch(int rank) {
  request(kWatch, std::to_string(rank), "", false);
}

void TcpStoreClient::bye() {
  request(kBye, "", "", false);
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const std::string& k : keys) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    get(k, std::max(left, std::chrono::milliseconds(0)));
  }
}

}  // namespace qg::dist
