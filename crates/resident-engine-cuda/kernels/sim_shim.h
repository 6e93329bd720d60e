// resident CUDA-on-host shim (Backend::CudaSim).
//
// CUDA C source (the ring-kernel template with the user's handler, or a one-shot kernel) is
// compiled by the host C++ compiler with this header in front and run on real OS threads: one
// thread per CUDA thread of a block, blocks of a grid one after another (so `__shared__` is a
// function-level `static`, private to the block that runs). What this header provides is the
// whole contract: a kernel that uses anything else fails to compile, and g++ names it.
//
// Semantics kept from the PTX ISA:
// * `__syncthreads()` is a barrier of the block's live threads: a thread that returned from
//   the kernel drops out of it (it no longer counts), as `exit` does on the GPU.
// * Warp collectives (`__ballot_sync`, `__shfl*_sync`, `__syncwarp`, `__any_sync`,
//   `__all_sync`) are barriers of the warp's live lanes. Every live lane of the warp must take
//   part (partial `mask`s are not modelled: the mask argument is ignored).
// * `__trap()` faults the block: every thread of it stops at its next barrier, collective or
//   `__nanosleep`, and the launch returns the fault.
// * A hardware fault in a thread of the kernel (an illegal address, a stack overflow, an
//   integer division by zero, an illegal instruction) faults the block the same way, as a GPU
//   reports CUDA_ERROR_ILLEGAL_ADDRESS: each thread runs the kernel with an alternate signal
//   stack whose header (`AltHeader`) the host's handler (resident_engine_cuda::sim::fault) finds and
//   jumps back through. An out-of-bounds write into mapped host memory is not caught.
// * Atomics are `std::atomic_ref` read-modify-writes, sequentially consistent (stronger than
//   CUDA's relaxed device-scope atomics: a missing fence in a handler does not show here).
// * `__threadfence*()` is a sequentially consistent fence.
// * `clock64()` and `%globaltimer` read the host's monotonic clock in nanoseconds.
#ifndef RESIDENT_SIM
#define RESIDENT_SIM 1
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __shared__ static
#define __constant__
#define __managed__
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

static thread_local uint3 threadIdx;
static thread_local uint3 blockIdx;
static thread_local dim3 blockDim;
static thread_local dim3 gridDim;
static constexpr int warpSize = 32;

namespace resident_sim {

// Thrown in every thread of a faulted block; caught by the launcher.
struct Fault {};

struct Block;

// A barrier of `expected` threads where a thread may leave for good (`drop`).
struct Barrier {
    std::mutex m;
    std::condition_variable cv;
    unsigned int expected = 0;
    unsigned int arrived = 0;
    unsigned long long generation = 0;
    const std::atomic<bool>* faulted = nullptr;
    // The bus model's read depth (see `Bus`): the deepest of the arriving threads, handed to
    // every thread the barrier releases (a barrier orders every load before it, so what any
    // thread loaded is known to all after it).
    unsigned long long depth_acc = 0;
    unsigned long long depth_out = 0;

    void reset(unsigned int n, const std::atomic<bool>* f) {
        std::lock_guard<std::mutex> g(m);
        expected = n;
        arrived = 0;
        faulted = f;
        depth_acc = 0;
        depth_out = 0;
    }
    void wait();
    void release_locked() {
        arrived = 0;
        depth_out = depth_acc;
        depth_acc = 0;
        ++generation;
        cv.notify_all();
    }
    // The calling thread exited: it no longer takes part; release the others if it was the last.
    void drop() {
        std::lock_guard<std::mutex> g(m);
        if (expected > 0) --expected;
        if (arrived > 0 && arrived >= expected) release_locked();
    }
    void wake() {
        std::lock_guard<std::mutex> g(m);
        cv.notify_all();
    }
};

struct Warp {
    Barrier bar;
    unsigned long long vals[32];
    unsigned int live = 0;  // bit per lane still running (under bar.m)
};

struct Block {
    Barrier bar;
    std::unique_ptr<Warp[]> warps;
    unsigned int warp_count = 0;
    std::atomic<bool> faulted{false};
    std::mutex msg_m;
    std::string msg;

    void fault(const std::string& why) {
        {
            std::lock_guard<std::mutex> g(msg_m);
            if (msg.empty()) msg = why;
        }
        faulted.store(true, std::memory_order_release);
        bar.wake();
        for (unsigned int w = 0; w < warp_count; ++w) warps[w].bar.wake();
    }
};

static thread_local Block* t_block = nullptr;
static thread_local unsigned int t_lane = 0;
static thread_local unsigned int t_warp = 0;

// ---- the bus model ----
// Counts the system-scope loads and stores a kernel makes on queue memory (pinned host memory
// the GPU reaches over PCIe) and the chain of loads that depend on each other, i.e. the bus
// round trips a message waits for. A GPU overlaps independent loads (a load stalls its thread
// only where its value is used), so each thread keeps two depths:
// * `t_ready`: the depth of the loads whose results this thread has waited for;
// * `t_pending`: the deepest load it has issued and not yet waited for.
// A relaxed load issues at t_ready + 1 and stays pending; an acquire load issues at t_ready + 1
// and later loads wait for it; an acquire fence and a release store wait for every pending
// load; a barrier (`__syncthreads`, `__syncwarp`, warp collectives) gives every thread the
// deepest depth of all. So the depth of the store that publishes an output is the number of
// round trips on the longest chain that led to it. Loads of the control block are counted
// apart (registered with `bus_begin`) and are not queue traffic.
//
// Exact and noise-free: the counts depend on the program, not on timing, except where the
// program itself branches on timing (idle polls, which are counted apart; see `bus_poll`).
enum BusField : unsigned int {
    BUS_READS = 0,          // queue loads (each access of up to 16 bytes is one)
    BUS_WRITES,             // queue stores
    BUS_READ_BYTES,
    BUS_WRITE_BYTES,
    BUS_CONTROL_READS,      // control-block loads
    BUS_CONTROL_WRITES,     // control-block stores
    BUS_BATCHES,            // batches handled (bus_batch calls)
    BUS_MESSAGES,           // messages of those batches
    BUS_BATCH_READS,        // queue loads inside batches (from the poll that found work)
    BUS_BATCH_WRITES,
    BUS_BATCH_READ_BYTES,
    BUS_BATCH_WRITE_BYTES,
    BUS_CHAIN_SUM,          // dependent loads per batch, summed
    BUS_CHAIN_MAX,
    BUS_IDLE_POLLS,         // polls that found nothing
    BUS_IDLE_READS,         // their queue loads
    BUS_TORN_READS,         // wide loads split in two with the writer let run between
    BUS_BATCH_FENCES,       // fences and release stores inside batches (each waits on a GPU)
    BUS_DEV_READS,          // loads of device memory (bulk lanes: L2 on a GPU, no bus round trip)
    BUS_DEV_READ_BYTES,
    BUS_BATCH_DEV_READS,    // the same inside batches
    BUS_BATCH_DEV_READ_BYTES,
    BUS_FIELDS
};
// Per-thread totals: queue reads, writes, read bytes, write bytes, device reads, device bytes.
constexpr int BUS_T = 6;

struct BusThread {
    std::atomic<unsigned long long> reads{0}, writes{0}, read_bytes{0}, write_bytes{0};
    std::atomic<unsigned long long> dev_reads{0}, dev_read_bytes{0};
    char pad[64 - BUS_T * sizeof(std::atomic<unsigned long long>) > 0 ? 64 - BUS_T * sizeof(std::atomic<unsigned long long>) : 1];
};

struct Bus {
    std::atomic<unsigned long long> v[BUS_FIELDS];
    BusThread threads[1024];
    // Registered by bus_begin (thread 0, before the kernel's first barrier).
    const unsigned char* control = nullptr;
    std::size_t control_bytes = 0;
    bool on = false;
    // Thread 0's window: the block's totals and the depth at the poll that opened it, and
    // warp 0's counters then (between batches only warp 0 touches the bus, so a poll moves the
    // mark by warp 0's own traffic and never sums the block).
    unsigned long long mark[BUS_T] = {0, 0, 0, 0, 0, 0};
    unsigned long long t0_mark[BUS_T] = {0, 0, 0, 0, 0, 0};
    unsigned long long base_depth = 0;
    bool window = false;
    // Fences and release stores since the poll that opened the window (a batch's, once it
    // closes; an idle poll's are dropped).
    std::atomic<unsigned long long> win_fences{0};
    Bus() {
        for (auto& x : v) x.store(0, std::memory_order_relaxed);
    }
};
// One per loaded instance (every kernel loads its own copy of the module).
inline Bus g_bus;
// Tear mode (RESIDENT_CUDASIM_TEAR=1): every load wider than 8 bytes is made as two 8-byte
// loads with a pause between them, so a writer racing the reader shows up as a half-new slot.
inline const bool g_tear = [] {
    const char* e = std::getenv("RESIDENT_CUDASIM_TEAR");
    return e != nullptr && e[0] == '1';
}();

static thread_local unsigned long long t_ready = 0;
static thread_local unsigned long long t_pending = 0;

inline unsigned long long depth_now() { return t_ready > t_pending ? t_ready : t_pending; }

inline void bus_add(std::atomic<unsigned long long>& a, unsigned long long n) {
    a.fetch_add(n, std::memory_order_relaxed);
}

// Whether `p` is control-block memory (counted apart) or queue memory.
inline bool bus_is_control(const void* p) {
    const unsigned char* c = (const unsigned char*)p;
    return g_bus.control != nullptr && c >= g_bus.control && c < g_bus.control + g_bus.control_bytes;
}

// A system-scope load of `bytes` at `p`; `acquire`: later loads wait for it.
inline void bus_load(const void* p, unsigned int bytes, bool acquire) {
    if (!g_bus.on) return;
    const unsigned long long d = t_ready + 1;
    if (acquire)
        t_ready = d;
    else if (d > t_pending)
        t_pending = d;
    if (bus_is_control(p)) {
        bus_add(g_bus.v[BUS_CONTROL_READS], 1);
        return;
    }
    BusThread& t = g_bus.threads[threadIdx.x & 1023u];
    bus_add(t.reads, 1);
    bus_add(t.read_bytes, bytes);
}

// A system-scope store; `release`: it waits for every load before it.
inline void bus_store(const void* p, unsigned int bytes, bool release) {
    if (!g_bus.on) return;
    if (release) {
        t_ready = depth_now();
        if (g_bus.window) bus_add(g_bus.win_fences, 1);
    }
    if (bus_is_control(p)) {
        bus_add(g_bus.v[BUS_CONTROL_WRITES], 1);
        return;
    }
    BusThread& t = g_bus.threads[threadIdx.x & 1023u];
    bus_add(t.writes, 1);
    bus_add(t.write_bytes, bytes);
}

// A load of device memory (a bulk lane's device ring or tails line): an L2 read on a GPU, not a
// bus transaction, so it is counted apart and never deepens the dependent bus chain.
inline void bus_dev_load(unsigned int bytes) {
    if (!g_bus.on) return;
    BusThread& t = g_bus.threads[threadIdx.x & 1023u];
    bus_add(t.dev_reads, 1);
    bus_add(t.dev_read_bytes, bytes);
}

// A fence (acquire or release: fence.acq_rel.sys on a GPU): waits for every pending load and,
// on a GPU, for this thread's earlier writes to reach their destination; counted per batch.
inline void bus_fence() {
    t_ready = depth_now();
    if (g_bus.on && g_bus.window) bus_add(g_bus.win_fences, 1);
}

inline void bus_thread_totals(const BusThread& t, unsigned long long out[BUS_T]) {
    out[0] = t.reads.load(std::memory_order_relaxed);
    out[1] = t.writes.load(std::memory_order_relaxed);
    out[2] = t.read_bytes.load(std::memory_order_relaxed);
    out[3] = t.write_bytes.load(std::memory_order_relaxed);
    out[4] = t.dev_reads.load(std::memory_order_relaxed);
    out[5] = t.dev_read_bytes.load(std::memory_order_relaxed);
}

// Warp 0's counters (between batches only warp 0 touches the bus: its poll).
inline void bus_warp0_totals(unsigned long long out[BUS_T]) {
    for (int k = 0; k < BUS_T; ++k) out[k] = 0;
    for (unsigned int i = 0; i < 32; ++i) {
        unsigned long long t[BUS_T];
        bus_thread_totals(g_bus.threads[i], t);
        for (int k = 0; k < BUS_T; ++k) out[k] += t[k];
    }
}

inline void bus_totals(unsigned long long out[BUS_T]) {
    for (int k = 0; k < BUS_T; ++k) out[k] = 0;
    for (auto& th : g_bus.threads) {
        unsigned long long t[BUS_T];
        bus_thread_totals(th, t);
        for (int k = 0; k < BUS_T; ++k) out[k] += t[k];
    }
}

// The thread branches on the values of its loads so far: it waits for every pending one.
inline void bus_use() { t_ready = depth_now(); }

// Thread 0, before the kernel's first barrier: the model counts this kernel from here.
inline void bus_begin(const void* control, std::size_t bytes) {
    g_bus.control = (const unsigned char*)control;
    g_bus.control_bytes = bytes;
    g_bus.on = true;
    g_bus.window = false;
    // A relaunch continues the counters: the marks start from where they stand.
    bus_totals(g_bus.mark);
    bus_warp0_totals(g_bus.t0_mark);
}

// Thread 0, at the start of each poll for work (after its control checks, while the rest of
// warp 0 waits at a warp barrier and has no load in flight): a poll that opened
// the window and found nothing was idle; this one opens a new window. A message that lands
// just after a poll read its lane waits for the next poll; the chain counts from the poll that
// finds it.
inline void bus_poll() {
    if (!g_bus.on) return;
    unsigned long long t0[BUS_T];
    bus_warp0_totals(t0);
    if (g_bus.window) {
        bus_add(g_bus.v[BUS_IDLE_POLLS], 1);
        bus_add(g_bus.v[BUS_IDLE_READS], t0[0] - g_bus.t0_mark[0]);
    }
    for (int i = 0; i < BUS_T; ++i) {
        g_bus.mark[i] += t0[i] - g_bus.t0_mark[i];
        g_bus.t0_mark[i] = t0[i];
    }
    // The previous poll used what it loaded (it decided to poll again on those values), so
    // this one starts after them; its first load is one deeper than the base.
    t_ready = depth_now();
    g_bus.base_depth = t_ready;
    g_bus.win_fences.store(0, std::memory_order_relaxed);
    g_bus.window = true;
}

// Thread 0, after the store that makes a batch's outputs visible (every thread's loads of the
// batch are before it, ordered by the batch's barriers): closes the window.
inline void bus_batch(unsigned int messages) {
    if (!g_bus.on || !g_bus.window) return;
    unsigned long long now[BUS_T];
    bus_totals(now);
    bus_add(g_bus.v[BUS_BATCHES], 1);
    bus_add(g_bus.v[BUS_BATCH_DEV_READS], now[4] - g_bus.mark[4]);
    bus_add(g_bus.v[BUS_BATCH_DEV_READ_BYTES], now[5] - g_bus.mark[5]);
    bus_add(g_bus.v[BUS_MESSAGES], messages);
    bus_add(g_bus.v[BUS_BATCH_READS], now[0] - g_bus.mark[0]);
    bus_add(g_bus.v[BUS_BATCH_WRITES], now[1] - g_bus.mark[1]);
    bus_add(g_bus.v[BUS_BATCH_READ_BYTES], now[2] - g_bus.mark[2]);
    bus_add(g_bus.v[BUS_BATCH_WRITE_BYTES], now[3] - g_bus.mark[3]);
    const unsigned long long chain = depth_now() - g_bus.base_depth;
    bus_add(g_bus.v[BUS_CHAIN_SUM], chain);
    bus_add(g_bus.v[BUS_BATCH_FENCES], g_bus.win_fences.load(std::memory_order_relaxed));
    unsigned long long m = g_bus.v[BUS_CHAIN_MAX].load(std::memory_order_relaxed);
    while (chain > m && !g_bus.v[BUS_CHAIN_MAX].compare_exchange_weak(m, chain, std::memory_order_relaxed)) {
    }
    for (int i = 0; i < BUS_T; ++i) g_bus.mark[i] = now[i];
    bus_warp0_totals(g_bus.t0_mark);
    g_bus.window = false;
}

inline void check_fault() {
    if (t_block != nullptr && t_block->faulted.load(std::memory_order_acquire)) throw Fault{};
}

[[noreturn]] inline void trap(const char* what) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s in block (%u,%u,%u) thread (%u,%u,%u)", what, blockIdx.x, blockIdx.y,
                  blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
    if (t_block != nullptr) t_block->fault(buf);
    throw Fault{};
}

inline unsigned long long now_ns() {
    return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

inline void Barrier::wait() {
    std::unique_lock<std::mutex> l(m);
    if (faulted->load(std::memory_order_acquire)) throw Fault{};
    const unsigned long long gen = generation;
    const unsigned long long mine = depth_now();
    if (mine > depth_acc) depth_acc = mine;
    if (++arrived >= expected) {
        release_locked();
    } else {
        cv.wait(l, [&] { return generation != gen || faulted->load(std::memory_order_acquire); });
        if (generation == gen) throw Fault{};
    }
    // depth_out is this generation's: the next one cannot complete before this thread arrives.
    t_ready = depth_out;
    t_pending = depth_out;
}

// Exchanges one 64-bit value per lane across the warp; returns all 32 (exited lanes: 0).
inline void warp_exchange(unsigned long long mine, unsigned long long* all, unsigned int* live) {
    Warp& w = t_block->warps[t_warp];
    w.vals[t_lane] = mine;
    w.bar.wait();  // every live lane has written
    std::memcpy(all, w.vals, sizeof w.vals);
    {
        std::lock_guard<std::mutex> g(w.bar.m);
        *live = w.live;
    }
    w.bar.wait();  // every live lane has read before anyone writes again
}

}  // namespace resident_sim

// ---- synchronization ----
inline void __syncthreads() { resident_sim::t_block->bar.wait(); }
inline void __syncwarp(unsigned int = 0xffffffffu) { resident_sim::t_block->warps[resident_sim::t_warp].bar.wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
[[noreturn]] inline void __trap() { resident_sim::trap("__trap()"); }
inline void __nanosleep(unsigned int ns) {
    resident_sim::check_fault();
    if (ns < 1000)
        std::this_thread::yield();
    else
        std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
}
inline long long clock64() { return (long long)resident_sim::now_ns(); }

// ---- warp collectives (every live lane of the warp takes part) ----
inline unsigned int __activemask() {
    resident_sim::Warp& w = resident_sim::t_block->warps[resident_sim::t_warp];
    std::lock_guard<std::mutex> g(w.bar.m);
    return w.live;
}
inline unsigned int __ballot_sync(unsigned int, int pred) {
    unsigned long long all[32];
    unsigned int live;
    resident_sim::warp_exchange(pred ? 1ull : 0ull, all, &live);
    unsigned int m = 0;
    for (unsigned int i = 0; i < 32; ++i)
        if (((live >> i) & 1u) && all[i]) m |= 1u << i;
    return m;
}
inline int __any_sync(unsigned int mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned int mask, int pred) {
    unsigned long long all[32];
    unsigned int live;
    resident_sim::warp_exchange(pred ? 1ull : 0ull, all, &live);
    (void)mask;
    for (unsigned int i = 0; i < 32; ++i)
        if (((live >> i) & 1u) && !all[i]) return 0;
    return 1;
}
namespace resident_sim {
template <typename T>
inline T shfl_from(T var, int src, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "__shfl*_sync moves values of up to 8 bytes");
    unsigned long long mine = 0, all[32];
    unsigned int live;
    std::memcpy(&mine, &var, sizeof(T));
    warp_exchange(mine, all, &live);
    if (width <= 0 || width > 32) width = 32;
    const int base = (int)t_lane / width * width;
    const int lane = base + ((src % width) + width) % width;
    T out;
    std::memcpy(&out, &all[lane], sizeof(T));
    return out;
}
}  // namespace resident_sim
template <typename T>
inline T __shfl_sync(unsigned int, T var, int src_lane, int width = 32) {
    return resident_sim::shfl_from(var, src_lane, width);
}
template <typename T>
inline T __shfl_up_sync(unsigned int, T var, unsigned int delta, int width = 32) {
    const int in_seg = (int)resident_sim::t_lane % width;
    const int src = in_seg >= (int)delta ? in_seg - (int)delta : in_seg;
    return resident_sim::shfl_from(var, src, width);
}
template <typename T>
inline T __shfl_down_sync(unsigned int, T var, unsigned int delta, int width = 32) {
    const int in_seg = (int)resident_sim::t_lane % width;
    const int src = in_seg + (int)delta < width ? in_seg + (int)delta : in_seg;
    return resident_sim::shfl_from(var, src, width);
}
template <typename T>
inline T __shfl_xor_sync(unsigned int, T var, int lane_mask, int width = 32) {
    const int in_seg = (int)resident_sim::t_lane % width;
    return resident_sim::shfl_from(var, in_seg ^ lane_mask, width);
}

// ---- integer intrinsics ----
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(unsigned int x) { return x == 0 ? 32 : __builtin_clz(x); }
inline int __clzll(unsigned long long x) { return x == 0 ? 64 : __builtin_clzll(x); }
inline int __ffs(unsigned int x) { return __builtin_ffs((int)x); }
inline int __ffsll(unsigned long long x) { return __builtin_ffsll((long long)x); }
inline unsigned int __brev(unsigned int x) {
    unsigned int r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) { return (unsigned int)(((unsigned long long)a * b) >> 32); }
template <typename T>
inline T __ldg(const T* p) { return *p; }
using std::max;
using std::min;

// ---- float intrinsics ----
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float f) { int x; std::memcpy(&x, &f, 4); return x; }

// ---- atomics (std::atomic_ref; sequentially consistent) ----
namespace resident_sim {
template <typename T>
using same_t = typename std::type_identity<T>::type;
template <typename T, typename F>
inline T cas_loop(T* p, F f) {
    std::atomic_ref<T> a(*p);
    T old = a.load();
    while (!a.compare_exchange_weak(old, f(old))) {
    }
    return old;
}
}  // namespace resident_sim
template <typename T>
inline T atomicAdd(T* p, resident_sim::same_t<T> v) { return std::atomic_ref<T>(*p).fetch_add(v); }
template <typename T>
inline T atomicSub(T* p, resident_sim::same_t<T> v) { return std::atomic_ref<T>(*p).fetch_sub(v); }
template <typename T>
inline T atomicExch(T* p, resident_sim::same_t<T> v) { return std::atomic_ref<T>(*p).exchange(v); }
template <typename T>
inline T atomicCAS(T* p, resident_sim::same_t<T> expected, resident_sim::same_t<T> desired) {
    std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired);
    return expected;
}
template <typename T>
inline T atomicAnd(T* p, resident_sim::same_t<T> v) { return std::atomic_ref<T>(*p).fetch_and(v); }
template <typename T>
inline T atomicOr(T* p, resident_sim::same_t<T> v) { return std::atomic_ref<T>(*p).fetch_or(v); }
template <typename T>
inline T atomicXor(T* p, resident_sim::same_t<T> v) { return std::atomic_ref<T>(*p).fetch_xor(v); }
template <typename T>
inline T atomicMin(T* p, resident_sim::same_t<T> v) {
    return resident_sim::cas_loop(p, [v](T o) { return v < o ? v : o; });
}
template <typename T>
inline T atomicMax(T* p, resident_sim::same_t<T> v) {
    return resident_sim::cas_loop(p, [v](T o) { return v > o ? v : o; });
}
inline unsigned int atomicInc(unsigned int* p, unsigned int v) {
    return resident_sim::cas_loop(p, [v](unsigned int o) { return o >= v ? 0u : o + 1u; });
}
inline unsigned int atomicDec(unsigned int* p, unsigned int v) {
    return resident_sim::cas_loop(p, [v](unsigned int o) { return (o == 0 || o > v) ? v : o - 1u; });
}
#define RESIDENT_SIM_SCOPED(op) \
    template <typename... A>    \
    inline auto op##_system(A... a) { return op(a...); } \
    template <typename... A>    \
    inline auto op##_block(A... a) { return op(a...); }
RESIDENT_SIM_SCOPED(atomicAdd)
RESIDENT_SIM_SCOPED(atomicSub)
RESIDENT_SIM_SCOPED(atomicExch)
RESIDENT_SIM_SCOPED(atomicCAS)
RESIDENT_SIM_SCOPED(atomicAnd)
RESIDENT_SIM_SCOPED(atomicOr)
RESIDENT_SIM_SCOPED(atomicXor)
RESIDENT_SIM_SCOPED(atomicMin)
RESIDENT_SIM_SCOPED(atomicMax)
#undef RESIDENT_SIM_SCOPED

// ---- the launcher ----
namespace resident_sim {

struct Dims {
    unsigned int grid[3];
    unsigned int block[3];
};

template <typename... A, std::size_t... I>
inline void call_entry(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}

inline void set_err(char* err, unsigned int errlen, const std::string& s) {
    if (err == nullptr || errlen == 0) return;
    std::size_t n = std::min<std::size_t>(s.size(), errlen - 1);
    std::memcpy(err, s.data(), n);
    err[n] = 0;
}

// ---- hardware faults (resident_engine_cuda::sim::fault) ----
// The first bytes of each thread's alternate signal stack: the host's handler reads them on a
// SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGTRAP and, when `jump` is set (only while the thread
// runs kernel code), calls it on the alternate stack.
struct AltHeader {
    unsigned long long magic;
    void (*jump)(int sig, void* addr, int code);
};
static_assert(sizeof(AltHeader) == 16, "resident_engine_cuda::sim::fault::AltHeader");
constexpr unsigned long long ALT_MAGIC = 0x7265736964656e74ull;  // "resident"
constexpr std::size_t ALT_SIZE = 64 * 1024;

static thread_local sigjmp_buf* t_jmp = nullptr;
static thread_local int t_sig = 0;
static thread_local int t_code = 0;
static thread_local void* t_addr = nullptr;

// Called by the host's handler, on the alternate stack: stores only to this thread's
// thread-locals (allocated already: the thread set `t_jmp` before arming) and jumps back.
[[noreturn]] inline void fault_jump(int sig, void* addr, int code) {
    t_sig = sig;
    t_addr = addr;
    t_code = code;
    siglongjmp(*t_jmp, 1);
}

// This thread's alternate signal stack, from its start to its end (disabled before it is freed).
struct AltStack {
    std::unique_ptr<unsigned char[]> mem;
    AltHeader* header = nullptr;
    AltStack() {
        mem.reset(new (std::nothrow) unsigned char[ALT_SIZE]);
        if (!mem) return;
        header = new (mem.get()) AltHeader{ALT_MAGIC, nullptr};
        stack_t ss{};
        ss.ss_sp = mem.get();
        ss.ss_size = ALT_SIZE;
        ss.ss_flags = 0;
        if (sigaltstack(&ss, nullptr) != 0) header = nullptr;
    }
    ~AltStack() {
        if (header == nullptr) return;
        stack_t off{};
        off.ss_flags = SS_DISABLE;
        sigaltstack(&off, nullptr);
    }
    AltStack(const AltStack&) = delete;
    AltStack& operator=(const AltStack&) = delete;
};

// Runs `body` with the header armed; false when a hardware fault jumped out of it (what it was
// is in t_sig, t_addr, t_code). Nothing of this frame is changed between sigsetjmp and the
// jump, so nothing needs `volatile`.
template <typename F>
inline bool run_guarded(AltHeader* const header, F&& body) {
    if (header == nullptr) {
        body();
        return true;
    }
    sigjmp_buf jb;
    t_jmp = &jb;
    if (sigsetjmp(jb, 1) != 0) {
        header->jump = nullptr;
        return false;
    }
    header->jump = &fault_jump;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    body();
    std::atomic_signal_fence(std::memory_order_seq_cst);
    header->jump = nullptr;
    return true;
}

// What a hardware fault was, in the GPU's words and the host's.
inline std::string describe_fault(int sig, void* addr, int code) {
    const char* what = "a hardware fault";
    const char* detail = "";
    switch (sig) {
        case SIGSEGV:
            what = "an illegal memory access (SIGSEGV";
            detail = code == SEGV_ACCERR ? ", access not permitted" : ", address not mapped";
            break;
        case SIGBUS:
            what = "a misaligned or unbacked memory access (SIGBUS";
            break;
        case SIGFPE:
            what = "an arithmetic fault (SIGFPE";
            detail = code == FPE_INTDIV ? ", integer division by zero" : (code == FPE_INTOVF ? ", integer overflow" : "");
            break;
        case SIGILL:
            what = "an illegal instruction (SIGILL";
            break;
        case SIGTRAP:
            what = "a breakpoint (SIGTRAP";
            break;
        default:
            break;
    }
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s%s at %p) in block (%u,%u,%u) thread (%u,%u,%u)", what, detail, addr, blockIdx.x,
                  blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
    return buf;
}

// Runs `f` over the grid: a pool of block-size threads plays each block in turn.
// Returns 0, 1 (device fault; `err` says which), or 2 (bad launch; `err` says why).
template <typename... A>
inline int launch(void (*f)(A...), const Dims* d, void** args, const unsigned long long* sizes, unsigned int nargs,
                  char* err, unsigned int errlen) {
    constexpr std::size_t N = sizeof...(A);
    constexpr std::array<std::size_t, N + 1> want = {sizeof(std::remove_cv_t<std::remove_reference_t<A>>)..., 0};
    if (nargs != N) {
        set_err(err, errlen, "the kernel takes " + std::to_string(N) + " arguments, " + std::to_string(nargs) + " were given");
        return 2;
    }
    for (std::size_t i = 0; i < N; ++i) {
        if (sizes[i] != want[i]) {
            set_err(err, errlen, "argument " + std::to_string(i) + " is " + std::to_string(sizes[i]) +
                                     " bytes; the kernel's parameter is " + std::to_string(want[i]) + " bytes");
            return 2;
        }
    }
    const unsigned long long threads = (unsigned long long)d->block[0] * d->block[1] * d->block[2];
    const unsigned long long blocks = (unsigned long long)d->grid[0] * d->grid[1] * d->grid[2];
    if (threads == 0 || threads > 1024 || blocks == 0) {
        set_err(err, errlen, "invalid launch: " + std::to_string(blocks) + " blocks of " + std::to_string(threads) +
                                 " threads (1..=1024 threads per block)");
        return 2;
    }
    const unsigned int nt = (unsigned int)threads;
    Block block;
    block.warp_count = (nt + 31) / 32;
    block.warps.reset(new Warp[block.warp_count]);

    std::mutex m;
    std::condition_variable cv;
    unsigned long long epoch = 0;  // block number + 1 being played; guarded by m
    unsigned int done = 0;         // threads finished with the current block; guarded by m
    bool shutdown = false;

    auto worker = [&](unsigned int t) {
        unsigned long long seen = 0;
        AltStack alt;
        t_block = &block;
        t_warp = t / 32;
        t_lane = t % 32;
        threadIdx = uint3{t % d->block[0], (t / d->block[0]) % d->block[1], t / (d->block[0] * d->block[1])};
        blockDim = dim3(d->block[0], d->block[1], d->block[2]);
        gridDim = dim3(d->grid[0], d->grid[1], d->grid[2]);
        for (;;) {
            unsigned long long b;
            {
                std::unique_lock<std::mutex> l(m);
                cv.wait(l, [&] { return shutdown || epoch != seen; });
                if (shutdown) return;
                seen = epoch;
                b = epoch - 1;
            }
            blockIdx = uint3{(unsigned int)(b % d->grid[0]), (unsigned int)((b / d->grid[0]) % d->grid[1]),
                             (unsigned int)(b / ((unsigned long long)d->grid[0] * d->grid[1]))};
            t_ready = 0;
            t_pending = 0;
            const bool clean = run_guarded(alt.header, [&] {
                try {
                    call_entry(f, args, std::index_sequence_for<A...>{});
                } catch (const Fault&) {
                } catch (...) {
                    block.fault("a C++ exception escaped the kernel");
                }
            });
            if (!clean) block.fault(describe_fault(t_sig, t_addr, t_code));
            // Exited: drop out of the warp's and the block's barriers.
            {
                Warp& w = block.warps[t_warp];
                std::lock_guard<std::mutex> g(w.bar.m);
                w.live &= ~(1u << t_lane);
            }
            block.warps[t_warp].bar.drop();
            block.bar.drop();
            {
                std::lock_guard<std::mutex> g(m);
                ++done;
            }
            cv.notify_all();
        }
    };

    std::vector<std::thread> pool;
    pool.reserve(nt);
    int rc = 0;
    try {
        for (unsigned int t = 0; t < nt; ++t) pool.emplace_back(worker, t);
    } catch (...) {
        set_err(err, errlen, "could not start " + std::to_string(nt) + " threads");
        rc = 2;
    }
    for (unsigned long long b = 0; b < blocks && rc == 0; ++b) {
        block.bar.reset(nt, &block.faulted);
        for (unsigned int w = 0; w < block.warp_count; ++w) {
            unsigned int lanes = std::min(32u, nt - w * 32);
            block.warps[w].bar.reset(lanes, &block.faulted);
            block.warps[w].live = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
        }
        std::unique_lock<std::mutex> l(m);
        done = 0;
        epoch = b + 1;
        cv.notify_all();
        cv.wait(l, [&] { return done == nt; });
        if (block.faulted.load(std::memory_order_acquire)) {
            std::lock_guard<std::mutex> g(block.msg_m);
            set_err(err, errlen, block.msg);
            rc = 1;
        }
    }
    {
        std::lock_guard<std::mutex> l(m);
        shutdown = true;
    }
    cv.notify_all();
    for (auto& t : pool) t.join();
    return rc;
}

}  // namespace resident_sim

// The bus model's counters (BUS_FIELDS values, in BusField order) for the Rust side; returns
// how many were written. Readable while the kernel runs (relaxed: a snapshot, not a cut).
extern "C" __attribute__((visibility("default"))) unsigned int resident_sim_bus_stats(unsigned long long* out,
                                                                                        unsigned int n) {
    unsigned int k = n < resident_sim::BUS_FIELDS ? n : (unsigned int)resident_sim::BUS_FIELDS;
    unsigned long long tot[resident_sim::BUS_T];
    resident_sim::bus_totals(tot);
    for (unsigned int i = 0; i < k; ++i) {
        if (i < 4)
            out[i] = tot[i];
        else if (i == resident_sim::BUS_DEV_READS)
            out[i] = tot[4];
        else if (i == resident_sim::BUS_DEV_READ_BYTES)
            out[i] = tot[5];
        else
            out[i] = resident_sim::g_bus.v[i].load(std::memory_order_relaxed);
    }
    return k;
}

#define RESIDENT_SIM_EXPORT(entry)                                                                              \
    extern "C" __attribute__((visibility("default"))) int resident_sim_entry_##entry(                          \
        const resident_sim::Dims* d, void** args, const unsigned long long* sizes, unsigned int nargs, char* err, \
        unsigned int errlen) {                                                                                  \
        return resident_sim::launch(&entry, d, args, sizes, nargs, err, errlen);                                \
    }
