// A small key-value store for the rendezvous of data-parallel ranks: rank 0 serves it at
// MASTER_ADDR:MASTER_PORT, every rank (rank 0 included) is a client. It carries what ranks
// must exchange before they can talk directly: Gloo's transport addresses, the NCCL unique
// id, and failure reports (a rank that raises records its error, so the others can name it).
//
// Protocol (ours; one request, one reply, over one TCP connection per client):
//   request: u8 command, u32 key length, key bytes, u32 value length, value bytes
//   set  (1): stores value under key                  -> u8 1
//   get  (2): value if the key is present             -> u8 found [, u32 length, bytes]
//   add  (3): adds the i64 in value to the counter    -> i64 new value
//   watch (4): this connection is rank <key>'s watch   -> u8 1
//   bye   (5): the watched rank is leaving cleanly     -> u8 1
// A watched connection that closes without `bye` marks its rank gone: the server sets
// "qg/gone/<rank>", which the other ranks' watchdogs (watchdog.h) read.
// Integers are little-endian. Waiting for a key is the client polling `get` until it is
// there or the timeout passes, so the server never blocks on one client.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace qg::dist {

class TcpStoreServer {
 public:
  // Listens on `port` of every interface (0: a free port, see port()). Throws qg::Error
  // naming the port when it cannot bind.
  explicit TcpStoreServer(int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }
  // Waits until no rank other than `except` holds a watched connection (every one said bye
  // or is gone), up to `timeout`; false if some still do then. Rank 0 calls it before the
  // store goes away, so a peer still finishing its run does not take the store's exit for
  // rank 0's death.
  bool wait_for_watchers(int except, std::chrono::milliseconds timeout);

 private:
  void accept_loop();
  void serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;  // guards data_, counters_ and clients_
  std::map<std::string, std::string> data_;
  std::map<std::string, int64_t> counters_;
  std::vector<int> clients_;
  std::map<int, int> watched_;  // rank -> its open watched connections
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

class TcpStoreClient {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start after us).
  TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TcpStoreClient();
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  // The value, waiting up to `timeout` for the key to appear; throws naming the key.
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  // The value if present now.
  bool try_get(const std::string& key, std::string& value);
  int64_t add(const std::string& key, int64_t delta);
  // Waits until every key is present; throws naming the first missing one.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Makes this connection rank `rank`'s watch (closing it without bye() marks the rank gone),
  // and says the clean goodbye.
  void watch(int rank);
  void bye();

  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& endpoint() const { return endpoint_; }

 private:
  std::string request(uint8_t command, const std::string& key, const std::string& value,
                      bool reply_has_value);

  int fd_ = -1;
  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;  // one request at a time on the connection
};

}  // namespace qg::dist
