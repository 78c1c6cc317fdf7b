#include "dist/inprocess_communicator.h"

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "base/error.h"

namespace m3::dist {

// A reusable barrier that can be aborted (std::barrier cannot: a rank that never arrives blocks the rest forever).
class AbortableBarrier {
 public:
  explicit AbortableBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lk(mu_);
    if (aborted_) throw GroupAborted(why_);
    const uint64_t gen = generation_;
    if (++count_ == n_) {
      count_ = 0, ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lk, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) throw GroupAborted(why_);  // woken by abort, not by the last rank
  }
  void abort(const std::string& why) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!aborted_) aborted_ = true, why_ = why;
    cv_.notify_all();
  }
  void reset() {
    std::lock_guard<std::mutex> lk(mu_);
    aborted_ = false, count_ = 0, ++generation_, why_.clear();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int count_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;
};

struct InProcessGroup::Shared {
  explicit Shared(int n) : bar(n), send(size_t(n)), recv(size_t(n)) {}
  AbortableBarrier bar;
  std::vector<const void*> send;  // each rank's published input
  std::vector<void*> recv;        // and output (all_reduce reads the inputs into its own scratch)
};

class InProcessGroup::Rank final : public Communicator {
 public:
  Rank(std::shared_ptr<Shared> s, int r, int n) : s_(std::move(s)), r_(r), n_(n) {}
  int rank() const override { return r_; }
  int size() const override { return n_; }

  void all_gather(const void* send, size_t bytes, void* recv) override {
    publish(send);
    for (int q = 0; q < n_; ++q)
      if (bytes) std::memcpy(static_cast<uint8_t*>(recv) + size_t(q) * bytes, s_->send[size_t(q)], bytes);
    s_->bar.arrive_and_wait();  // nobody reuses its send buffer while another rank still reads it
  }

  void reduce_scatter_sum(const float* send, float* recv, size_t n) override {
    publish(send);
    for (size_t i = 0; i < n; ++i) {
      float acc = 0.f;
      for (int q = 0; q < n_; ++q) acc += static_cast<const float*>(s_->send[size_t(q)])[size_t(r_) * n + i];
      recv[i] = acc;
    }
    s_->bar.arrive_and_wait();
  }

  void all_reduce_sum(float* buf, size_t n) override {
    publish(buf);
    scratch_.assign(n, 0.f);
    for (size_t i = 0; i < n; ++i) {
      float acc = 0.f;
      for (int q = 0; q < n_; ++q) acc += static_cast<const float*>(s_->send[size_t(q)])[i];
      scratch_[i] = acc;
    }
    s_->bar.arrive_and_wait();  // every rank has read every buf: now each may overwrite its own
    if (n) std::memcpy(buf, scratch_.data(), n * sizeof(float));
  }

  void barrier() override { s_->bar.arrive_and_wait(); }

 private:
  void publish(const void* p) {
    s_->send[size_t(r_)] = p;
    s_->bar.arrive_and_wait();
  }
  std::shared_ptr<Shared> s_;
  int r_, n_;
  std::vector<float> scratch_;
};

InProcessGroup::InProcessGroup(int size) {
  M3_CHECK(size >= 1, "a parallel group needs at least one rank, got {}", size);
  shared_ = std::make_shared<Shared>(size);
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<Rank>(shared_, r, size));
}

InProcessGroup::~InProcessGroup() = default;

Communicator& InProcessGroup::rank(int r) { return *ranks_.at(size_t(r)); }

void InProcessGroup::abort(const std::string& why) { shared_->bar.abort(why); }

void InProcessGroup::reset() { shared_->bar.reset(); }

void InProcessGroup::rethrow_rank_errors(const std::vector<std::exception_ptr>& err) {
  for (const auto& e : err)
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const GroupAborted&) {
      }
    }
  for (const auto& e : err)
    if (e) std::rethrow_exception(e);
}

}  // namespace m3::dist
