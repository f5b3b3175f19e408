// aio_test.cc — offload/aio: O_DIRECT swap-file I/O through io_uring and
// the thread-pool fallback. Round trips with more requests than the queue
// depth; alignment and bounds refused; injected I/O errors and short
// transfers reported naming the file and offset; a full disk (a 1 MiB
// tmpfs) and a read-only one fail at creation with nothing left behind;
// an existing file is never overwritten or removed.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "offload/aio.h"

namespace {

std::string Tmp() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

bool Exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

struct Buf {
  explicit Buf(size_t n) : bytes(n) {
    if (posix_memalign(&p, ZS__AIO_ALIGN, n) != 0) p = nullptr;
  }
  ~Buf() { free(p); }
  unsigned char* data() { return (unsigned char*)p; }
  void* p = nullptr;
  size_t bytes;
};

class AioTest : public ::testing::TestWithParam<zs__aio_backend> {
 protected:
  void SetUp() override {
    ASSERT_EQ(zs__aio_create(4, 0, GetParam(), &a_), ZS_OK) << zs_last_error();
    RecordProperty("backend", zs__aio_backend_name(a_));
    std::printf("I/O backend: %s\n", zs__aio_backend_name(a_));
    path_ = Tmp() + "/aio-" + std::to_string(GetParam()) + ".swap";
    unlink(path_.c_str());
  }
  void TearDown() override {
    zs__aio_fault_hook = nullptr;
    zs__aio_destroy(a_);
    unlink(path_.c_str());
  }
  zs__aio* a_ = nullptr;
  std::string path_;
};

constexpr size_t kMiB = 1 << 20;

TEST_P(AioTest, WritesThenReadsBackMoreRequestsThanTheQueueHolds) {
  const size_t n = 16;
  zs__aio_file* f = nullptr;
  ASSERT_EQ(zs__aio_file_create(a_, path_.c_str(), n * kMiB, &f), ZS_OK)
      << zs_last_error();
  Buf w(n * kMiB), r(n * kMiB);
  for (size_t i = 0; i < n * kMiB; i++) w.data()[i] = (unsigned char)(i * 131 + i / 4096);
  memset(r.data(), 0, n * kMiB);
  // in reverse order, so completion order cannot hide an offset bug
  for (size_t k = n; k-- > 0;)
    ASSERT_EQ(zs__aio_submit(a_, f, 1, w.data() + k * kMiB, kMiB, k * kMiB), ZS_OK)
        << zs_last_error();
  ASSERT_EQ(zs__aio_wait(a_), ZS_OK) << zs_last_error();
  for (size_t k = 0; k < n; k++)
    ASSERT_EQ(zs__aio_submit(a_, f, 0, r.data() + k * kMiB, kMiB, k * kMiB), ZS_OK);
  ASSERT_EQ(zs__aio_wait(a_), ZS_OK) << zs_last_error();
  EXPECT_EQ(0, memcmp(w.data(), r.data(), n * kMiB));
  zs__aio_file_close(f, 1);
  EXPECT_FALSE(Exists(path_));
}

TEST_P(AioTest, MisalignedOrOutOfBoundsRequestsAreRefusedNamingTheFile) {
  zs__aio_file* f = nullptr;
  ASSERT_EQ(zs__aio_file_create(a_, path_.c_str(), 2 * kMiB, &f), ZS_OK);
  Buf b(2 * kMiB);
  EXPECT_EQ(zs__aio_submit(a_, f, 0, b.data() + 1, 4096, 0), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(zs_last_error(), path_)) << zs_last_error();
  EXPECT_EQ(zs__aio_submit(a_, f, 0, b.data(), 100, 0), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs__aio_submit(a_, f, 0, b.data(), 4096, 512), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs__aio_submit(a_, f, 0, b.data(), kMiB, 2 * kMiB), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(zs_last_error(), "outside its 2097152 bytes")) << zs_last_error();
  EXPECT_EQ(zs__aio_wait(a_), ZS_OK);
  zs__aio_file_close(f, 1);
}

long g_fail_offset = -1, g_fail_result = 0;
long Fault(const char*, uint64_t offset, int, size_t, long result) {
  return (long)offset == g_fail_offset ? g_fail_result : result;
}

TEST_P(AioTest, IoErrorsAndShortReadsNameTheFileAndOffset) {
  EXPECT_EQ(zs__aio_failures(a_), 0u);
  zs__aio_file* f = nullptr;
  ASSERT_EQ(zs__aio_file_create(a_, path_.c_str(), 8 * kMiB, &f), ZS_OK);
  Buf b(8 * kMiB);
  memset(b.data(), 7, 8 * kMiB);
  for (size_t k = 0; k < 8; k++)
    ASSERT_EQ(zs__aio_submit(a_, f, 1, b.data() + k * kMiB, kMiB, k * kMiB), ZS_OK);
  ASSERT_EQ(zs__aio_wait(a_), ZS_OK);
  zs__aio_fault_hook = Fault;
  g_fail_offset = 3 * kMiB;
  g_fail_result = -EIO;
  for (size_t k = 0; k < 8; k++)
    ASSERT_EQ(zs__aio_submit(a_, f, 0, b.data() + k * kMiB, kMiB, k * kMiB), ZS_OK);
  EXPECT_EQ(zs__aio_wait(a_), ZS_ERR_IO);
  EXPECT_TRUE(Contains(zs_last_error(), "read of 1048576 bytes at offset 3145728 of " + path_) &&
              Contains(zs_last_error(), strerror(EIO)))
      << zs_last_error();
  // the error is reported once; the queue works again
  g_fail_result = 4096;
  for (size_t k = 0; k < 8; k++)
    ASSERT_EQ(zs__aio_submit(a_, f, 0, b.data() + k * kMiB, kMiB, k * kMiB), ZS_OK);
  EXPECT_EQ(zs__aio_wait(a_), ZS_ERR_IO);
  EXPECT_TRUE(Contains(zs_last_error(), "short read, got 4096 bytes")) << zs_last_error();
  zs__aio_fault_hook = nullptr;
  for (size_t k = 0; k < 8; k++)
    ASSERT_EQ(zs__aio_submit(a_, f, 0, b.data() + k * kMiB, kMiB, k * kMiB), ZS_OK);
  EXPECT_EQ(zs__aio_wait(a_), ZS_OK) << zs_last_error();
  // every failed transfer was counted, though each wait returned one
  EXPECT_EQ(zs__aio_failures(a_), 2u);
  zs__aio_file_close(f, 1);
}

TEST_P(AioTest, AnExistingFileIsNeitherOverwrittenNorRemoved) {
  FILE* p = fopen(path_.c_str(), "w");
  ASSERT_NE(p, nullptr);
  fputs("user data", p);
  fclose(p);
  zs__aio_file* f = nullptr;
  EXPECT_EQ(zs__aio_file_create(a_, path_.c_str(), kMiB, &f), ZS_ERR_IO);
  EXPECT_TRUE(Contains(zs_last_error(), path_) &&
              Contains(zs_last_error(), strerror(EEXIST))) << zs_last_error();
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 9);
}

// A 1 MiB tmpfs: a 4 MiB swap file does not fit. Needs mount(2) (root, or
// CAP_SYS_ADMIN); skipped with the reason otherwise.
TEST_P(AioTest, AFullOrReadOnlyDiskFailsAtCreationLeavingNothing) {
  const std::string dir = Tmp() + "/aio-small-" + std::to_string(GetParam());
  mkdir(dir.c_str(), 0700);
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << strerror(errno)
                 << "): the full-disk case needs mount(2)";
  const std::string file = dir + "/rank-00000.swap";
  zs__aio_file* f = nullptr;
  EXPECT_EQ(zs__aio_file_create(a_, file.c_str(), 4 * kMiB, &f), ZS_ERR_IO);
  EXPECT_TRUE(Contains(zs_last_error(), "no space left") &&
              Contains(zs_last_error(), file)) << zs_last_error();
  EXPECT_FALSE(Exists(file));
  EXPECT_EQ(f, nullptr);
  // read-only: not writable at all
  ASSERT_EQ(mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=1m"), 0)
      << strerror(errno);
  EXPECT_EQ(zs__aio_file_create(a_, file.c_str(), 4096, &f), ZS_ERR_IO);
  EXPECT_TRUE(Contains(zs_last_error(), "cannot create swap file " + file) &&
              Contains(zs_last_error(), strerror(EROFS))) << zs_last_error();
  umount(dir.c_str());
  rmdir(dir.c_str());
}

// A file system without O_DIRECT (ramfs: Linux creates the file, then
// refuses the flag): buffered I/O, the data round-trips, and closing
// removes the file. Needs mount(2); skipped with the reason otherwise.
TEST_P(AioTest, WithoutODirectFallsBackToBufferedIo) {
  const std::string dir = Tmp() + "/aio-ramfs-" + std::to_string(GetParam());
  mkdir(dir.c_str(), 0700);
  if (mount("ramfs", dir.c_str(), "ramfs", 0, nullptr) != 0)
    GTEST_SKIP() << "cannot mount a ramfs here (" << strerror(errno)
                 << "): the no-O_DIRECT case needs mount(2)";
  const std::string file = dir + "/rank-00000.swap";
  zs__aio_file* f = nullptr;
  ASSERT_EQ(zs__aio_file_create(a_, file.c_str(), 2 * kMiB, &f), ZS_OK)
      << zs_last_error();
  Buf w(2 * kMiB), r(2 * kMiB);
  for (size_t i = 0; i < 2 * kMiB; i++) w.data()[i] = (unsigned char)(i * 13 + 1);
  ASSERT_EQ(zs__aio_submit(a_, f, 1, w.data(), 2 * kMiB, 0), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs__aio_wait(a_), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs__aio_submit(a_, f, 0, r.data(), 2 * kMiB, 0), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs__aio_wait(a_), ZS_OK) << zs_last_error();
  EXPECT_EQ(memcmp(w.data(), r.data(), 2 * kMiB), 0);
  zs__aio_file_close(f, 1);
  EXPECT_FALSE(Exists(file));
  // an existing file there is still refused, not taken over
  FILE* p = fopen(file.c_str(), "w");
  ASSERT_NE(p, nullptr);
  fputs("user data", p);
  fclose(p);
  EXPECT_EQ(zs__aio_file_create(a_, file.c_str(), kMiB, &f), ZS_ERR_IO);
  struct stat st;
  ASSERT_EQ(stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 9);
  umount2(dir.c_str(), MNT_DETACH);
  rmdir(dir.c_str());
}

INSTANTIATE_TEST_SUITE_P(Backends, AioTest,
                         ::testing::Values(ZS__AIO_AUTO, ZS__AIO_THREADS),
                         [](const ::testing::TestParamInfo<zs__aio_backend>& i) {
                           return std::string(i.param == ZS__AIO_AUTO ? "Auto"
                                                                      : "Threads");
                         });

// A request larger than the block size is split into block-size transfers
// (one ticket each) that keep the queue full; the data round-trips.
TEST_P(AioTest, LargeRequestsAreSplitIntoBlocks) {
  zs__aio* a = nullptr;
  ASSERT_EQ(zs__aio_create(2, kMiB, GetParam(), &a), ZS_OK) << zs_last_error();
  zs__aio_file* f = nullptr;
  ASSERT_EQ(zs__aio_file_create(a, path_.c_str(), 5 * kMiB, &f), ZS_OK);
  Buf w(5 * kMiB), r(5 * kMiB);
  for (size_t i = 0; i < 5 * kMiB; i++) w.data()[i] = (unsigned char)(i * 7 + i / 8192);
  const uint64_t t0 = zs__aio_last_ticket(a);
  ASSERT_EQ(zs__aio_submit(a, f, 1, w.data(), 5 * kMiB, 0), ZS_OK);
  EXPECT_EQ(zs__aio_last_ticket(a), t0 + 5);
  ASSERT_EQ(zs__aio_wait(a), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs__aio_submit(a, f, 0, r.data(), 5 * kMiB, 0), ZS_OK);
  ASSERT_EQ(zs__aio_wait(a), ZS_OK) << zs_last_error();
  EXPECT_EQ(0, memcmp(w.data(), r.data(), 5 * kMiB));
  zs__aio_file_close(f, 1);
  zs__aio_destroy(a);
  EXPECT_EQ(zs__aio_create(2, 1000, GetParam(), &a), ZS_ERR_INVALID_ARGUMENT);
}

TEST(Aio, QueueDepthIsChecked) {
  zs__aio* a = nullptr;
  EXPECT_EQ(zs__aio_create(0, 0, ZS__AIO_AUTO, &a), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(zs_last_error(), "queue_depth")) << zs_last_error();
  EXPECT_EQ(a, nullptr);
}

}  // namespace
