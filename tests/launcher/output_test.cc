// Worker output on its way to the console: whole lines with the rank prefix, an unfinished last
// line printed when the stream ends, everything in the log file as it came.
#include "launcher/workers/output.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace dlrun::launcher {
namespace {

std::string ReadAll(int fd) {
  std::string out;
  char buf[256];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

TEST(LineStream, KeepsTheLastBytesItWasFed) {
  LineStream s("", -1, nullptr);
  s.Feed("early ", 6);
  EXPECT_EQ(s.tail(), "early ");
  const std::string big(LineStream::kTailBytes, 'x');
  s.Feed(big.data(), big.size());
  s.Feed("CUDA out of memory\n", 19);
  EXPECT_EQ(s.tail().size(), LineStream::kTailBytes);
  EXPECT_EQ(s.tail().substr(s.tail().size() - 19), "CUDA out of memory\n");
  EXPECT_EQ(s.tail().find("early"), std::string::npos);
}

// PyTorch 2.x writes its own "[rank1]:" before a worker's error lines: one prefix, dlrun's.
TEST(LineStream, TorchsOwnRankPrefixIsNotDoubled) {
  int p[2];
  ASSERT_EQ(pipe2(p, O_NONBLOCK), 0);
  {
    LineStream s("[rank 1]: ", p[1], nullptr);
    const std::string in =
        "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"t.py\", line 8\n"
        "[rankX]: kept\n[rank12] kept too\nplain\n";
    s.Feed(in.data(), in.size());
  }
  EXPECT_EQ(ReadAll(p[0]),
            "[rank 1]: Traceback (most recent call last):\n[rank 1]:   File \"t.py\", line 8\n"
            "[rank 1]: [rankX]: kept\n[rank 1]: [rank12] kept too\n[rank 1]: plain\n");
  close(p[0]);
  close(p[1]);
  // Without a prefix (a filtered or redirected console), a line is left as it is.
  ASSERT_EQ(pipe2(p, O_NONBLOCK), 0);
  {
    LineStream s("", p[1], nullptr);
    s.Feed("[rank1]: x\n", 11);
  }
  EXPECT_EQ(ReadAll(p[0]), "[rank1]: x\n");
  close(p[0]);
  close(p[1]);
}

TEST(LineStream, WholeLinesWithThePrefixAndTheLastLineOnFinish) {
  int p[2];
  ASSERT_EQ(pipe2(p, O_NONBLOCK), 0);
  char path[] = "/tmp/dlrun-out-XXXXXX";
  const int log_fd = mkstemp(path);
  {
    LineStream s("[rank 3]: ", p[1], fdopen(log_fd, "w"));
    s.Feed("hel", 3);
    EXPECT_EQ(ReadAll(p[0]), "");  // half a line stays back
    s.Feed("lo\nwor", 6);
    EXPECT_EQ(ReadAll(p[0]), "[rank 3]: hello\n");
    s.Feed("ld\r50%", 6);
    // A progress bar's redraw shows at once, with the prefix again after the '\r'.
    EXPECT_EQ(ReadAll(p[0]), "[rank 3]: world\r[rank 3]: 50%");
    s.Feed("|#", 2);
    EXPECT_EQ(ReadAll(p[0]), "|#");  // the rest of the redrawn line, as it comes
    s.Feed("\r\n", 2);
    EXPECT_EQ(ReadAll(p[0]), "\r\n");  // no empty prefixed line for "\r\n"
    s.Feed("end", 3);
    s.Finish();
    EXPECT_EQ(ReadAll(p[0]), "[rank 3]: end\n");
  }
  int in = open(path, O_RDONLY);
  EXPECT_EQ(ReadAll(in), "hello\nworld\r50%|#\r\nend");  // the log has the bytes as written
  close(in);
  unlink(path);
  close(p[0]);
  close(p[1]);
}

TEST(LineStream, ARedirectedStreamStillReachesItsLogFile) {
  char path[] = "/tmp/dlrun-out-XXXXXX";
  const int log_fd = mkstemp(path);
  {
    LineStream s("[rank 0]: ", -1, fdopen(log_fd, "w"));  // -1: kept off the console (-r)
    s.Feed("x\ny", 3);
  }  // the destructor finishes the stream
  int in = open(path, O_RDONLY);
  EXPECT_EQ(ReadAll(in), "x\ny");
  close(in);
  unlink(path);
}

}  // namespace
}  // namespace dlrun::launcher
