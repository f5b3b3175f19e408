// nccl_fake_test.cc — NCCL's stand-in (fake_nccl.c, loaded as comm_nccl.c
// loads it: dlopen of ZS_NCCL_LIBRARY) computes what NCCL specifies, and
// its output appears only when its stream is waited for: all-gather and
// reduce-scatter in place and not, all-reduce in fp32 and bf16 (sums in
// rank order), a grouped ring of sends and receives, grouped broadcasts.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <zeroshard.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "tests/fakecuda/fakecuda.h"
#include "tests/testing/mpi_test.h"

namespace {

struct Nccl {
  void* h = nullptr;
  __typeof__(&ncclGetUniqueId) GetUniqueId;
  __typeof__(&ncclCommInitRank) CommInitRank;
  __typeof__(&ncclCommDestroy) CommDestroy;
  __typeof__(&ncclAllGather) AllGather;
  __typeof__(&ncclReduceScatter) ReduceScatter;
  __typeof__(&ncclAllReduce) AllReduce;
  __typeof__(&ncclBroadcast) Broadcast;
  __typeof__(&ncclSend) Send;
  __typeof__(&ncclRecv) Recv;
  __typeof__(&ncclGroupStart) GroupStart;
  __typeof__(&ncclGroupEnd) GroupEnd;
};

class NcclFakeTest : public ZsMpiTest {
 protected:
  void SetUp() override {
    ZsMpiTest::SetUp();
    const char* path = std::getenv("ZS_NCCL_LIBRARY");
    ASSERT_NE(path, nullptr);
    n_.h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(n_.h, nullptr) << dlerror();
#define SYM(x) *(void**)&n_.x = dlsym(n_.h, "nccl" #x); ASSERT_NE((void*)n_.x, nullptr)
    SYM(GetUniqueId); SYM(CommInitRank); SYM(CommDestroy); SYM(AllGather);
    SYM(ReduceScatter); SYM(AllReduce); SYM(Broadcast); SYM(Send);
    SYM(Recv); SYM(GroupStart); SYM(GroupEnd);
#undef SYM
    ncclUniqueId id;
    ASSERT_EQ(n_.GetUniqueId(&id), ncclSuccess);
    ASSERT_EQ(n_.CommInitRank(&comm_, world_, id, rank_), ncclSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (comm_ != nullptr) n_.CommDestroy(comm_);
    cudaStreamDestroy(s_);
    ZsMpiTest::TearDown();
  }
  // Device buffer holding v; host copy of a device buffer.
  template <typename T>
  T* Up(const std::vector<T>& v) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyDefault),
              cudaSuccess);
    // the copy may land later (pageable source), and s_ is not ordered
    // after the legacy stream
    EXPECT_EQ(cudaStreamSynchronize(0), cudaSuccess);
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> Down(const T* p, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDefault),
              cudaSuccess);
    return v;
  }
  Nccl n_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t s_ = nullptr;
};

float Val(int rank, size_t i) { return 0.1f * (float)(rank + 1) + (float)i * 1e-3f; }

TEST_F(NcclFakeTest, AllGatherInPlaceAndNotLandsWhenWaitedFor) {
  const size_t c = 5;
  for (int in_place = 0; in_place <= 1; in_place++) {
    std::vector<float> all(c * world_, -1.f), mine(c);
    for (size_t i = 0; i < c; i++) mine[i] = Val(rank_, i);
    if (in_place) std::memcpy(&all[c * rank_], mine.data(), c * 4);
    float* d_all = Up(all);
    float* d_mine = Up(mine);
    ASSERT_EQ(n_.AllGather(in_place ? d_all + c * rank_ : d_mine, d_all, c,
                           ncclFloat32, comm_, s_), ncclSuccess);
    // not waited for yet: the output has not landed (the other ranks'
    // blocks are still -1)
    std::vector<float> early(c * world_);
    cudaStream_t other;
    ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(early.data(), d_all, c * world_ * 4,
                              cudaMemcpyDefault, other), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
    cudaStreamDestroy(other);
    EXPECT_EQ(early[c * ((rank_ + 1) % world_)], -1.f);
    ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
    std::vector<float> got = Down(d_all, c * world_);
    for (int r = 0; r < world_; r++)
      for (size_t i = 0; i < c; i++)
        EXPECT_EQ(got[c * r + i], Val(r, i)) << r << " " << i;
    cudaFree(d_all);
    cudaFree(d_mine);
  }
}

// Sums in rank order, in fp32, rounded once: ((x0 + x1) + x2) ...
TEST_F(NcclFakeTest, ReductionsSumInRankOrder) {
  const size_t c = 7;
  std::vector<float> in(c * world_);
  for (size_t i = 0; i < in.size(); i++) in[i] = Val(rank_, i);
  std::vector<float> want(c * world_);
  for (size_t i = 0; i < want.size(); i++) {
    float acc = Val(0, i);
    for (int r = 1; r < world_; r++) acc += Val(r, i);
    want[i] = acc;
  }
  float* d_in = Up(in);
  float* d_out = Up(std::vector<float>(c * world_, 0.f));
  ASSERT_EQ(n_.AllReduce(d_in, d_out, c * world_, ncclFloat32, ncclSum, comm_,
                         s_), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  EXPECT_EQ(Down(d_out, c * world_), want);
  // reduce-scatter in place: this rank's block of its own buffer
  ASSERT_EQ(n_.ReduceScatter(d_in, d_in + c * rank_, c, ncclFloat32, ncclSum,
                             comm_, s_), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  std::vector<float> mine = Down(d_in + c * rank_, c);
  for (size_t i = 0; i < c; i++) EXPECT_EQ(mine[i], want[c * rank_ + i]) << i;
  // bf16: summed in fp32, rounded once
  std::vector<uint16_t> h(c * world_), hw(c * world_);
  zs_convert(h.data(), ZS_BFLOAT16, in.data(), ZS_FLOAT32, in.size());
  std::vector<float> back(c * world_), acc(c * world_, 0.f);
  for (int r = 0; r < world_; r++) {
    std::vector<float> vr(c * world_);
    for (size_t i = 0; i < vr.size(); i++) vr[i] = Val(r, i);
    std::vector<uint16_t> hr(vr.size());
    zs_convert(hr.data(), ZS_BFLOAT16, vr.data(), ZS_FLOAT32, vr.size());
    zs_convert(back.data(), ZS_FLOAT32, hr.data(), ZS_BFLOAT16, vr.size());
    for (size_t i = 0; i < acc.size(); i++) acc[i] = r == 0 ? back[i] : acc[i] + back[i];
  }
  zs_convert(hw.data(), ZS_BFLOAT16, acc.data(), ZS_FLOAT32, acc.size());
  uint16_t* d_h = Up(h);
  ASSERT_EQ(n_.AllReduce(d_h, d_h, c * world_, ncclBfloat16, ncclSum, comm_,
                         s_), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  EXPECT_EQ(Down(d_h, c * world_), hw);
  cudaFree(d_in);
  cudaFree(d_out);
  cudaFree(d_h);
}

TEST_F(NcclFakeTest, GroupedRingAndBroadcasts) {
  const size_t c = 3;
  std::vector<float> mine(c);
  for (size_t i = 0; i < c; i++) mine[i] = Val(rank_, i);
  float* d_mine = Up(mine);
  float* d_got = Up(std::vector<float>(c, 0.f));
  float* d_b = Up(std::vector<float>(c * world_, 0.f));
  ASSERT_EQ(cudaMemcpy(d_b + c * rank_, mine.data(), c * 4, cudaMemcpyDefault),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(0), cudaSuccess);
  ASSERT_EQ(n_.GroupStart(), ncclSuccess);
  ASSERT_EQ(n_.Send(d_mine, c, ncclFloat32, (rank_ + 1) % world_, comm_, s_),
            ncclSuccess);
  ASSERT_EQ(n_.Recv(d_got, c, ncclFloat32, (rank_ + world_ - 1) % world_,
                    comm_, s_), ncclSuccess);
  for (int r = 0; r < world_; r++)
    ASSERT_EQ(n_.Broadcast(d_b + c * r, d_b + c * r, c, ncclFloat32, r, comm_,
                           s_), ncclSuccess);
  ASSERT_EQ(n_.GroupEnd(), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  std::vector<float> got = Down(d_got, c);
  std::vector<float> b = Down(d_b, c * world_);
  const int from = (rank_ + world_ - 1) % world_;
  for (size_t i = 0; i < c; i++) {
    EXPECT_EQ(got[i], Val(from, i));
    for (int r = 0; r < world_; r++) EXPECT_EQ(b[c * r + i], Val(r, i));
  }
  cudaFree(d_mine);
  cudaFree(d_got);
  cudaFree(d_b);
}

}  // namespace
