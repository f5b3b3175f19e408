// mpi_main.cc — main() for GoogleTest binaries run under mpirun.
//
// Every rank runs every test; only rank 0 prints the usual output and writes
// the XML report (Bazel's XML_OUTPUT_FILE), so a case is counted once per
// world size. Other ranks print only their failures, prefixed with their
// rank. A failure on any rank fails the test case on rank 0 too (see
// ZsMpiTest::TearDown in mpi_test.h), and the process exit status is
// non-zero on every rank if any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

// Prints only failed assertions, with the rank, for ranks other than 0.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The name is recorded here: UnitTest::current_test_info() takes a lock
  // that is already held while OnTestPartResult runs.
  void OnTestStart(const ::testing::TestInfo& info) override {
    name_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s failed at %s:%d\n%s\n", rank_,
                 name_.c_str(), r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.message());
  }

 private:
  int rank_;
  std::string name_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  // As docs/wrapping.md asks of a program that starts MPI itself: Open MPI
  // reports some collective failures on MPI_COMM_WORLD.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    // GoogleTest writes XML_OUTPUT_FILE by itself; only rank 0 may.
    unsetenv("XML_OUTPUT_FILE");
    unsetenv("GTEST_OUTPUT");
    // ... and only rank 0 creates and removes Bazel's premature-exit marker.
    unsetenv("TEST_PREMATURE_EXIT_FILE");
  }
  if (rank != 0) {
    // GoogleTest read XML_OUTPUT_FILE into its --gtest_output flag during
    // static initialization, before main, and InitGoogleTest installs the
    // XML writer from that flag: clearing the environment is not enough,
    // the flag must go before InitGoogleTest, or every rank writes (and
    // interleaves) the same XML file.
    GTEST_FLAG_SET(output, "");
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    ::testing::TestEventListeners& listeners =
        ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
