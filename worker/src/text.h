// The few string and status helpers the worker library needs, with the names and meaning of
// abseil's (absl::StrCat, absl::StatusOr, ...), so that the library depends on LibTorch and the
// C++ standard library alone: the wheel ships its sources and a user's CMake builds them
// against the user's own LibTorch (docs/PACKAGING.md). train_unet (examples/unet) uses them for
// the same reason: the wheel ships it too. The launcher and the rendezvous keep abseil. Numbers
// print as abseil's do (integers exactly, floating point as %g with 6 digits).
#pragma once

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <locale>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace dlrun::lite {

template <class... A>
std::string StrCat(const A&... a) {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  (out << ... << a);
  return out.str();
}

template <class... A>
void StrAppend(std::string* s, const A&... a) {
  *s += StrCat(a...);
}

template <class C>
std::string StrJoin(const C& items, std::string_view sep) {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  bool first = true;
  for (const auto& i : items) {
    if (!first) out << sep;
    first = false;
    out << i;
  }
  return out.str();
}

// printf-style formatting; std::string arguments may be passed for %s.
namespace internal {
template <class T>
auto FormatArg(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return v.c_str();
  } else {
    return v;
  }
}
}  // namespace internal

template <class... A>
std::string StrFormat(const char* fmt, const A&... a) {
  const int n = std::snprintf(nullptr, 0, fmt, internal::FormatArg(a)...);
  if (n <= 0) return {};
  std::string s(static_cast<size_t>(n), '\0');
  std::snprintf(s.data(), s.size() + 1, fmt, internal::FormatArg(a)...);
  return s;
}

// The whole of `s` (surrounding blanks allowed) as a number; false otherwise.
template <class I>
bool SimpleAtoi(std::string_view s, I* out) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  I v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return false;
  *out = v;
  return true;
}

inline bool SimpleAtod(std::string_view s, double* out) {
  const std::string str(s);
  const char* begin = str.c_str();
  while (*begin == ' ' || *begin == '\t') ++begin;
  if (*begin == '\0') return false;
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  while (*end == ' ' || *end == '\t' || *end == '\n') ++end;
  if (*end != '\0') return false;
  *out = v;
  return true;
}

// `s` with C's escapes for what a terminal would not show as it is (\n, \t, quotes, backslash;
// other bytes outside printable ASCII as \ooo), as absl::CEscape.
inline std::string CEscape(std::string_view s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\'':
        out += "\\'";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          out += StrFormat("\\%03o", static_cast<unsigned>(c));
        } else {
          out += ch;
        }
    }
  }
  return out;
}

// A status: ok, or an error's kind and message.
class Status {
 public:
  Status() = default;
  Status(const char* kind, std::string message) : kind_(kind), message_(std::move(message)) {}
  bool ok() const { return kind_ == nullptr; }
  std::string_view message() const { return message_; }
  std::string ToString() const { return ok() ? "OK" : StrCat(kind_, ": ", message_); }

 private:
  const char* kind_ = nullptr;
  std::string message_;
};

inline std::ostream& operator<<(std::ostream& out, const Status& s) { return out << s.ToString(); }

inline Status OkStatus() { return Status(); }
inline Status InvalidArgumentError(std::string m) { return Status("INVALID_ARGUMENT", std::move(m)); }
inline Status NotFoundError(std::string m) { return Status("NOT_FOUND", std::move(m)); }
inline bool IsNotFound(const Status& s) { return s.ToString().rfind("NOT_FOUND: ", 0) == 0; }
inline Status FailedPreconditionError(std::string m) {
  return Status("FAILED_PRECONDITION", std::move(m));
}
inline Status InternalError(std::string m) { return Status("INTERNAL", std::move(m)); }
inline Status AbortedError(std::string m) { return Status("ABORTED", std::move(m)); }
inline Status DeadlineExceededError(std::string m) {
  return Status("DEADLINE_EXCEEDED", std::move(m));
}
inline Status ResourceExhaustedError(std::string m) {
  return Status("RESOURCE_EXHAUSTED", std::move(m));
}

// A value, or the error status that stands in its place.
template <class T>
class StatusOr {
 public:
  StatusOr() : status_("UNKNOWN", "no value yet") {}  // as abseil's: an error until assigned
  StatusOr(Status s) : status_(std::move(s)) {}  // NOLINT: implicit, as abseil's
  StatusOr(T v) : value_(std::move(v)) {}        // NOLINT
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace dlrun::lite
