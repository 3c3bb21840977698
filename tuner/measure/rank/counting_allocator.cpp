// dstune's CPU allocator shim: torch's own CPU allocator, wrapped so that every allocation and every free is counted,
// whichever thread makes it (torch.profiler records only the threads it profiles: gloo's worker threads free
// all-gather buffers it never sees). Built and loaded by tuner/measure/rank/counting_allocator.py; plain C entry points.
//
// The wrapped allocator keeps torch's contract for raw allocations (the context is the data pointer, and one raw
// deleter frees any of them), so a size table keyed by the pointer tells each free's bytes.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace {
std::atomic<int64_t> live{0};
std::atomic<int64_t> peak{0};
std::mutex table_mutex;
std::unordered_map<void*, size_t>* sizes = new std::unordered_map<void*, size_t>();  // never destroyed: frees
                                                                                     // may come at exit
c10::DeleterFnPtr base_deleter = nullptr;

void release(void* data) {
  size_t nbytes = 0;
  {
    std::lock_guard<std::mutex> guard(table_mutex);
    auto found = sizes->find(data);
    if (found != sizes->end()) {
      nbytes = found->second;
      sizes->erase(found);
    }
  }
  live.fetch_sub(static_cast<int64_t>(nbytes));
  base_deleter(data);
}

struct CountingAllocator final : c10::Allocator {
  c10::Allocator* base;
  explicit CountingAllocator(c10::Allocator* wrapped) : base(wrapped) {}

  c10::DataPtr allocate(size_t nbytes) override {
    c10::DataPtr inner = base->allocate(nbytes);
    c10::Device device = inner.device();
    void* data = inner.release_context();  // the base's raw contract: context == data, freed by base_deleter
    if (data != nullptr) {
      std::lock_guard<std::mutex> guard(table_mutex);
      (*sizes)[data] = nbytes;
    }
    int64_t now = live.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    return {data, data, &release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CountingAllocator* installed = nullptr;
}  // namespace

extern "C" {
// 1 when the shim is torch's CPU allocator; 0 when it cannot be (a base without a raw deleter, or an allocator
// registered with a higher priority).
int dstune_counting_install() {
  if (installed == nullptr) {
    c10::Allocator* base = c10::GetCPUAllocator();
    base_deleter = base->raw_deleter();
    if (base_deleter == nullptr) {
      return 0;
    }
    installed = new CountingAllocator(base);
    c10::SetCPUAllocator(installed, /*priority=*/100);
  }
  return c10::GetCPUAllocator() == installed ? 1 : 0;
}
long long dstune_counting_live() { return live.load(); }
long long dstune_counting_peak() { return peak.load(); }
void dstune_counting_reset_peak() { peak.store(live.load()); }
}
