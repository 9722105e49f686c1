// qg::Error and the QG_CHECK family: every user-facing failure names the op, what is wrong
// and the offending values, plus the source location that raised it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace qg {

class Error : public std::runtime_error {
 public:
  Error(std::string op, std::string message, const char* file, int line);

  const std::string& op() const { return op_; }
  const std::string& message() const { return message_; }

 private:
  std::string op_;
  std::string message_;
};

namespace detail {
template <typename... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}
}  // namespace detail

}  // namespace qg

// Throws qg::Error naming `op` when `cond` is false; the remaining arguments are streamed
// into the message so the offending values appear in it.
#define QG_CHECK(cond, op, ...)                                                       \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      throw ::qg::Error((op), ::qg::detail::concat(__VA_ARGS__), __FILE__, __LINE__); \
    }                                                                                 \
  } while (0)

#define QG_FAIL(op, ...) \
  throw ::qg::Error((op), ::qg::detail::concat(__VA_ARGS__), __FILE__, __LINE__)
