// A TensorBoard event-file writer for scalars, with no TensorFlow or protobuf dependency: each
// record is TFRecord-framed (length, masked CRC32C, data, masked CRC32C) and holds an Event
// message encoded by hand (wall_time, step, file_version or summary { value { tag,
// simple_value } }).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "worker/src/text.h"

namespace dlrun::examples {

uint32_t Crc32c(const char* data, size_t n);

class EventWriter {
 public:
  // Creates DIR/events.out.tfevents.<seconds>.<host> and writes the file-version event.
  static lite::StatusOr<std::unique_ptr<EventWriter>> Open(const std::string& dir);
  ~EventWriter();
  void Scalar(const std::string& tag, float value, int64_t step);
  void Flush();
  const std::string& path() const { return path_; }

 private:
  EventWriter(std::string path, FILE* f) : path_(std::move(path)), f_(f) {}
  void WriteRecord(const std::string& data);
  std::string path_;
  FILE* f_;
};

}  // namespace dlrun::examples
