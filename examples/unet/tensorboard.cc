#include "unet/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "worker/src/text.h"

namespace dlrun::examples {
namespace {

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;  // Castagnoli
    t[i] = c;
  }
  return t;
}

uint32_t Masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void Varint(std::string* s, uint64_t v) {
  while (v >= 0x80) {
    s->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s->push_back(static_cast<char>(v));
}

void Fixed(std::string* s, const void* p, size_t n) { s->append(static_cast<const char*>(p), n); }

void LengthDelimited(std::string* s, uint8_t tag, const std::string& body) {
  s->push_back(static_cast<char>(tag));
  Varint(s, body.size());
  s->append(body);
}

std::string EventHeader(int64_t step) {
  std::string e;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  e.push_back(0x09);  // wall_time: field 1, 64-bit
  Fixed(&e, &now, 8);
  e.push_back(0x10);  // step: field 2, varint
  Varint(&e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t Crc32c(const char* data, size_t n) {
  static const std::array<uint32_t, 256> table = MakeTable();
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ static_cast<uint8_t>(data[i])) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

lite::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  const std::string path = lite::StrCat(dir, "/events.out.tfevents.", secs, ".", host);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return lite::InternalError(lite::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<EventWriter> w(new EventWriter(path, f));
  std::string e = EventHeader(0);
  LengthDelimited(&e, 0x1a, "brain.Event:2");  // file_version: field 3
  w->WriteRecord(e);
  w->Flush();
  return w;
}

EventWriter::~EventWriter() {
  if (f_ != nullptr) std::fclose(f_);
}

void EventWriter::WriteRecord(const std::string& data) {
  const uint64_t len = data.size();
  char header[12];
  std::memcpy(header, &len, 8);
  const uint32_t len_crc = Masked(Crc32c(header, 8));
  std::memcpy(header + 8, &len_crc, 4);
  const uint32_t data_crc = Masked(Crc32c(data.data(), data.size()));
  std::fwrite(header, 1, sizeof header, f_);
  std::fwrite(data.data(), 1, data.size(), f_);
  std::fwrite(&data_crc, 1, 4, f_);
}

void EventWriter::Scalar(const std::string& tag, float value, int64_t step) {
  std::string v;
  LengthDelimited(&v, 0x0a, tag);  // Summary.Value.tag: field 1
  v.push_back(0x15);               // simple_value: field 2, 32-bit
  Fixed(&v, &value, 4);
  std::string summary;
  LengthDelimited(&summary, 0x0a, v);  // Summary.value: field 1
  std::string e = EventHeader(step);
  LengthDelimited(&e, 0x2a, summary);  // Event.summary: field 5
  WriteRecord(e);
}

void EventWriter::Flush() { std::fflush(f_); }

}  // namespace dlrun::examples
