// TensorBoard event files written by the trainer.
#include <hdf5.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "unet/data.h"


#include "unet/tensorboard.h"

namespace dlrun::examples {
namespace {

TEST(TensorBoard, Crc32cKnownVector) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);  // the standard CRC-32C check value
}

TEST(TensorBoard, EventFileIsValidTfRecordsWithOurScalars) {
  const std::string dir = dlrun::testing::MakeTempDir();
  std::string path;
  {
    auto w = EventWriter::Open(dir);
    ASSERT_TRUE(w.ok()) << w.status();
    (*w)->Scalar("train/loss", 0.25f, 3);
    (*w)->Scalar("val/loss", 0.5f, 4);
    path = (*w)->path();
  }
  EXPECT_NE(path.find("/events.out.tfevents."), std::string::npos);
  const std::string bytes = dlrun::testing::ReadFile(path);
  auto masked = [](uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; };
  size_t off = 0;
  std::vector<std::string> records;
  while (off < bytes.size()) {
    ASSERT_LE(off + 12, bytes.size());
    uint64_t len = 0;
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len, bytes.data() + off, 8);
    std::memcpy(&len_crc, bytes.data() + off + 8, 4);
    EXPECT_EQ(len_crc, masked(Crc32c(bytes.data() + off, 8)));
    ASSERT_LE(off + 12 + len + 4, bytes.size());
    std::memcpy(&data_crc, bytes.data() + off + 12 + len, 4);
    EXPECT_EQ(data_crc, masked(Crc32c(bytes.data() + off + 12, len)));
    records.push_back(bytes.substr(off + 12, len));
    off += 12 + len + 4;
  }
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(records[1].find("train/loss"), std::string::npos);
  const float v = 0.25f;
  EXPECT_NE(records[1].find(std::string("\x15", 1) + std::string(reinterpret_cast<const char*>(&v), 4)),
            std::string::npos);  // simple_value, field 2, fixed32
  EXPECT_NE(records[2].find("val/loss"), std::string::npos);
}

}  // namespace
}  // namespace dlrun::examples
