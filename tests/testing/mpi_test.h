// mpi_test.h — the base fixture of multi-rank tests. Test bodies are
// written once and run under mpirun at several world sizes (tests/BUILD).
//
// Rules for multi-rank test bodies: every rank must make the same
// collective calls, so use EXPECT_* for checks on data (an ASSERT_* that
// returns on one rank only would leave the others waiting), and ASSERT_*
// only on values that are the same on every rank (e.g. the status of a
// collective call).
#ifndef ZS_TESTS_TESTING_MPI_TEST_H_
#define ZS_TESTS_TESTING_MPI_TEST_H_

#include <gtest/gtest.h>
#include <mpi.h>

class ZsMpiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
  }
  // A failure on any rank fails the case on every rank, so rank 0's report
  // (the one that is counted) sees it.
  void TearDown() override {
    int mine = HasFailure() ? 1 : 0, any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any && !mine) ADD_FAILURE() << "failed on another rank (its output "
                                       "is prefixed with its rank)";
  }
  // A communicator of the first n ranks of MPI_COMM_WORLD (collective;
  // MPI_COMM_NULL on the others; the caller frees it).
  MPI_Comm FirstRanks(int n) {
    MPI_Comm c = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank_ < n ? 0 : MPI_UNDEFINED, rank_, &c);
    return c;
  }
  int rank_ = 0;
  int world_ = 1;
};

#endif  // ZS_TESTS_TESTING_MPI_TEST_H_
