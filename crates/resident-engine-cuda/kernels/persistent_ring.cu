// resident: persistent ring kernel and launch-per-batch kernel (template body).
//
// This file is not compiled on its own: `resident_engine_cuda::persistent::template` prepends a
// generated prelude that defines RESIDENT_BATCH (the block size), the wire structs (Envelope,
// RingHeader, ControlBlock, PersistentParams), the user's message types aliased as ResidentIn /
// ResidentOut / ResidentState, InSlot / OutSlot, static_asserts on every size, and the user's
// handler, called as RESIDENT_CALL(state, in, out, env, buffers) -> bool (false = no output):
// RESIDENT_HANDLER(state, in, out, env) for a kernel without bound buffers, with the
// ResidentBuffers* as a fifth argument for one with them (the prelude defines which).
//
// Why one file of this size: it is one translation unit's body, appended after the generated
// prelude under `#line 1 "persistent_ring.cu"`, so NVRTC's and CudaSim's host compiler's
// messages and the fuzzer's reports name lines of this file; both kernels use the same lane,
// bulk-lane and peer functions below, and the memory rules that follow hold for all of them.
//
// Memory rules (see DESIGN.md, "CUDA persistent ring kernel"):
// * Queue memory is pinned, device-mapped host memory. Foreign indices are read with
//   ld.acquire.sys, own indices published with st.release.sys; each index has one writer and no
//   read-modify-write ever crosses PCIe.
// * Slot bytes are moved with ld/st.relaxed.sys so no stale L1 line of a reused slot is ever
//   read; queue memory is never read through __ldg or const __restrict__.
// * Input lane slots are in the LL format (see "input lanes" below): every 8 bytes carry a flag
//   that says whether they hold the message expected, so a poll that reads the head slot finds
//   and delivers a message in one bus read. Warp 0 polls; the tails are read in the same round.
// * One thread (thread 0) owns every index and the control block; the other threads only copy
//   slots and run the handler, ordered against thread 0 by __syncthreads() (__syncwarp() in
//   warp 0's poll).
// * Device-side forwarding: the control block's peer-input slot may name another kernel's
//   OUTPUT ring (its producer is that kernel's thread 0). While the slot names it, this kernel's
//   thread 0 is that ring's consumer (the host's consumer has stepped back): it reads the ring's
//   tail with acquire, publishes its head with release, exactly as the host does. Peer slots are
//   gathered after the own lanes (see resident_persistent). A change of the slot is adopted only
//   between batches and acknowledged in peer_ack with a release store that follows the last
//   release of the old ring's head, so the host owns that head again once it sees the ack.

#define RESIDENT_CMD_RUN 0u
#define RESIDENT_CMD_IDLE 1u
#define RESIDENT_CMD_EXIT 2u
// What warp 0's next round does (thread 0 decides; see the poll loop).
#define RESIDENT_ACT_WAIT 0u
#define RESIDENT_ACT_POLL 1u
#define RESIDENT_ACT_RUN 2u
#define RESIDENT_ACT_EXIT 3u

// RESIDENT_RUN_*, RESIDENT_DEV_* and RESIDENT_ERR_* are generated from the Rust enums
// (persistent::control::c_state_defines) and prepended when the template is rendered.

#define RESIDENT_MIN_BACKOFF_NS 32u
// Copy rounds whose loads a warp issues before it stages the first (registers: two 64-bit
// words per round per thread). A warp's run of 32 slots of W words takes ceil(32 W / 64)
// rounds with 16-byte loads: 6 for 64-byte payloads, 18 for 256-byte ones.
#ifndef RESIDENT_PREFETCH
#define RESIDENT_PREFETCH 8u
#endif
// The same for a lane's run in the LL format: one 16-byte load per data word, so a warp's run
// of 32 slots of W words takes W rounds; 12 covers a full warp of 64-byte payloads in one round
// trip, as the 8 above do for plain slots.
#ifndef RESIDENT_LL_PREFETCH
#define RESIDENT_LL_PREFETCH 12u
#endif
// 1: the poll reads each empty lane's head slot, whose LL flags show a message in one bus read;
// 0: it reads the lanes' tails alone, and a message waits for a second read (tail, then slot).
#ifndef RESIDENT_FAST_POLL
#define RESIDENT_FAST_POLL 1u
#endif
// Index of the peer ring in the gather tables (s_take / s_head): after the 8 lanes.
#define RESIDENT_PEER 8u

static_assert(RESIDENT_BATCH % 32 == 0 && RESIDENT_BATCH >= 32 && RESIDENT_BATCH <= 1024,
              "RESIDENT_BATCH must be a multiple of 32 in 32..=1024");
static_assert(sizeof(InSlot) % 8 == 0, "slots are copied as 64-bit words");
static_assert(sizeof(OutSlot) % 8 == 0, "slots are copied as 64-bit words");

// ---- system-scope memory operations ----
// On the GPU: inline PTX (no libcu++ needed). In the CudaSim build (RESIDENT_SIM, the host C++
// compiler with kernels/sim_shim.h in front): std::atomic_ref with the same orderings, so the
// host's C++/Rust half and this code follow one memory model that ThreadSanitizer checks.

// Every one of these is also reported to CudaSim's bus model (resident_sim::bus_*): a load or
// store of queue memory is a PCIe transaction on a GPU, and the model counts them and the
// chain of loads that wait for each other (see sim_shim.h, "the bus model").

#ifdef RESIDENT_SIM
// `bus_acquire`: whether the GPU's instruction is an acquire (later loads wait for it), which
// the TSan build's stronger C++ ordering must not change.
template <typename T>
__device__ __forceinline__ T resident_sim_load(const T* p, std::memory_order o, bool bus_acquire) {
    resident_sim::bus_load(p, sizeof(T), bus_acquire);
    return std::atomic_ref<T>(*const_cast<T*>(p)).load(o);
}
template <typename T>
__device__ __forceinline__ T resident_sim_load(const T* p, std::memory_order o) {
    return resident_sim_load(p, o, o == std::memory_order_acquire);
}
template <typename T>
__device__ __forceinline__ void resident_sim_store(T* p, T v, std::memory_order o) {
    resident_sim::bus_store(p, sizeof(T), o == std::memory_order_release);
    std::atomic_ref<T>(*p).store(v, o);
}
// A 16-byte load (one bus read on a GPU): two 8-byte atomic loads here, which is all the bus
// promises (only an aligned 8-byte access is single-copy atomic across PCIe). In tear mode the
// writer is let run between the halves.
__device__ __forceinline__ void resident_ld_relaxed_v2_u64(const unsigned long long* p, unsigned long long* a,
                                                           unsigned long long* b) {
    resident_sim::bus_load(p, 16, false);
    *a = std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(p)).load(std::memory_order_relaxed);
    if (resident_sim::g_tear) {
        resident_sim::bus_add(resident_sim::g_bus.v[resident_sim::BUS_TORN_READS], 1);
        std::this_thread::yield();
    }
    *b = std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(p + 1)).load(std::memory_order_relaxed);
}
__device__ __forceinline__ void resident_st_relaxed_v2_u64(unsigned long long* p, unsigned long long a,
                                                           unsigned long long b) {
    resident_sim::bus_store(p, 16, false);
    std::atomic_ref<unsigned long long>(*p).store(a, std::memory_order_relaxed);
    std::atomic_ref<unsigned long long>(*(p + 1)).store(b, std::memory_order_relaxed);
}
__device__ __forceinline__ void resident_bus_begin(const void* control, unsigned long long bytes) {
    resident_sim::bus_begin(control, (std::size_t)bytes);
}
__device__ __forceinline__ void resident_bus_poll() { resident_sim::bus_poll(); }
__device__ __forceinline__ void resident_bus_batch(unsigned int messages) { resident_sim::bus_batch(messages); }
// The thread uses the values of its loads so far (a branch on them): it waits for them.
__device__ __forceinline__ void resident_bus_use() { resident_sim::bus_use(); }
__device__ __forceinline__ unsigned long long resident_ld_acquire_u64(const unsigned long long* p) {
    return resident_sim_load(p, std::memory_order_acquire);
}
__device__ __forceinline__ unsigned int resident_ld_acquire_u32(const unsigned int* p) {
    return resident_sim_load(p, std::memory_order_acquire);
}
__device__ __forceinline__ void resident_st_release_u64(unsigned long long* p, unsigned long long v) {
    resident_sim_store(p, v, std::memory_order_release);
}
__device__ __forceinline__ void resident_st_release_u32(unsigned int* p, unsigned int v) {
    resident_sim_store(p, v, std::memory_order_release);
}
__device__ __forceinline__ unsigned long long resident_ld_relaxed_u64(const unsigned long long* p) {
    return resident_sim_load(p, std::memory_order_relaxed);
}
__device__ __forceinline__ void resident_st_relaxed_u64(unsigned long long* p, unsigned long long v) {
    resident_sim_store(p, v, std::memory_order_relaxed);
}
__device__ __forceinline__ void resident_st_relaxed_u32(unsigned int* p, unsigned int v) {
    resident_sim_store(p, v, std::memory_order_relaxed);
}
// A fenced load: relaxed, made acquire by the resident_fence_acquire() that follows it (so
// several of them overlap instead of waiting for each other). ThreadSanitizer does not model
// standalone fences, so the TSan build makes them acquire loads instead (on x86 both are the
// same plain load); the bus model sees them as relaxed either way.
template <typename T>
__device__ __forceinline__ T resident_ld_fenced(const T* p) {
#if defined(__SANITIZE_THREAD__)
    return resident_sim_load(p, std::memory_order_acquire, false);
#else
    return resident_sim_load(p, std::memory_order_relaxed, false);
#endif
}
__device__ __forceinline__ void resident_fence_acquire() {
    resident_sim::bus_fence();
#if !defined(__SANITIZE_THREAD__)
    std::atomic_thread_fence(std::memory_order_acquire);
#endif
}
// A release fence and the stores it covers: on the GPU one fence.acq_rel.sys followed by relaxed
// stores (each a release pattern for its location, so several indices are published with one
// wait for the earlier writes instead of one per index). ThreadSanitizer does not model
// standalone fences, so the C++ build makes the covered stores release stores; the bus model
// counts the fence once and the stores as plain writes.
__device__ __forceinline__ void resident_fence_release() {
    resident_sim::bus_fence();
#if !defined(__SANITIZE_THREAD__)
    std::atomic_thread_fence(std::memory_order_release);
#endif
}
__device__ __forceinline__ void resident_st_covered_u64(unsigned long long* p, unsigned long long v) {
    resident_sim::bus_store(p, sizeof(v), false);
    std::atomic_ref<unsigned long long>(*p).store(v, std::memory_order_release);
}
// Loads of device memory (the bulk lanes' device rings and tails line): L2 reads on a GPU, no
// bus round trip; the bus model counts them apart and leaves them out of the dependent chain.
__device__ __forceinline__ unsigned long long resident_ld_dev_acquire_u64(const unsigned long long* p) {
    resident_sim::bus_dev_load(8);
    return std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(p)).load(std::memory_order_acquire);
}
__device__ __forceinline__ unsigned long long resident_ld_dev_u64(const unsigned long long* p) {
    resident_sim::bus_dev_load(8);
    return std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(p)).load(std::memory_order_relaxed);
}
__device__ __forceinline__ void resident_ld_dev_v2_u64(const unsigned long long* p, unsigned long long* a,
                                                       unsigned long long* b) {
    resident_sim::bus_dev_load(16);
    *a = std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(p)).load(std::memory_order_relaxed);
    *b = std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(p + 1)).load(std::memory_order_relaxed);
}
__device__ __forceinline__ unsigned long long resident_now_ns() { return resident_sim::now_ns(); }
#else
__device__ __forceinline__ unsigned long long resident_ld_acquire_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned int resident_ld_acquire_u32(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void resident_st_release_u64(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void resident_st_release_u32(unsigned int* p, unsigned int v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned long long resident_ld_relaxed_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void resident_st_relaxed_u64(unsigned long long* p, unsigned long long v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void resident_st_relaxed_u32(unsigned int* p, unsigned int v) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// A fenced load: relaxed (no serialization between several of them); the caller issues one
// resident_fence_acquire() after reading all of them, which makes every such load before it an
// acquire (PTX memory model: relaxed load + fence.acq_rel = acquire pattern).
__device__ __forceinline__ unsigned long long resident_ld_fenced(const unsigned long long* p) {
    return resident_ld_relaxed_u64(p);
}
__device__ __forceinline__ unsigned int resident_ld_fenced(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// 16-byte accesses (one bus transaction each; p must be 16-byte aligned). The two halves are
// each single-copy atomic, the pair is not: a reader may see one half new and one old.
__device__ __forceinline__ void resident_ld_relaxed_v2_u64(const unsigned long long* p, unsigned long long* a,
                                                           unsigned long long* b) {
    asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
}
__device__ __forceinline__ void resident_st_relaxed_v2_u64(unsigned long long* p, unsigned long long a,
                                                           unsigned long long b) {
    asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

// The bus model's marks: nothing on a GPU.
__device__ __forceinline__ void resident_bus_begin(const void*, unsigned long long) {}
__device__ __forceinline__ void resident_bus_poll() {}
__device__ __forceinline__ void resident_bus_batch(unsigned int) {}
__device__ __forceinline__ void resident_bus_use() {}

__device__ __forceinline__ void resident_fence_acquire() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// See the C++ build's notes: one fence, then relaxed stores that it makes release patterns.
__device__ __forceinline__ void resident_fence_release() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void resident_st_covered_u64(unsigned long long* p, unsigned long long v) {
    resident_st_relaxed_u64(p, v);
}

// Device memory (the bulk lanes): the tails line is written by the copy stream's memory
// operations after their copies, read with an acquire; the device ring's slots with relaxed
// gpu-scope loads, which read L2 (where the copy engine writes), never a stale L1 line of a
// reused slot.
__device__ __forceinline__ unsigned long long resident_ld_dev_acquire_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long resident_ld_dev_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void resident_ld_dev_v2_u64(const unsigned long long* p, unsigned long long* a,
                                                       unsigned long long* b) {
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
}

__device__ __forceinline__ unsigned long long resident_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#endif

// Copies one slot into thread-private memory: from queue memory (system-scope loads, a bus
// round trip on a GPU) or, with DEV, from a bulk lane's device ring (device memory: L2).
// Independent loads (one round trip for all); 16-byte ones where the slot is aligned.
template <bool DEV = false, typename S>
__device__ __forceinline__ void resident_copy_in(S* dst, const S* src) {
    unsigned long long* d = (unsigned long long*)dst;
    const unsigned long long* s = (const unsigned long long*)src;
    if (sizeof(S) % 16 == 0 && (((unsigned long long)src) & 15ull) == 0) {
#pragma unroll 4
        for (unsigned int i = 0; i < sizeof(S) / 8; i += 2) {
            if (DEV)
                resident_ld_dev_v2_u64(s + i, &d[i], &d[i + 1]);
            else
                resident_ld_relaxed_v2_u64(s + i, &d[i], &d[i + 1]);
        }
    } else {
#pragma unroll 4
        for (unsigned int i = 0; i < sizeof(S) / 8; ++i) d[i] = DEV ? resident_ld_dev_u64(s + i) : resident_ld_relaxed_u64(s + i);
    }
}

// ---- bulk lanes: deep queues by the copy engine (resident_engine_cuda::persistent::bulk) ----
// Each lane may also have a device ring (lane_capacity plain InSlots in device memory, position
// pos at slot pos % capacity) whose tail the copy stream's memory operation publishes in the
// tails line (device memory) after the copy of the slots below it, and whose head thread 0
// publishes in the heads line (pinned host memory) as it does the LL head. The host writes a
// lane's other path only once the head of the path in use covers everything sent on it, so at
// most one path of a lane holds messages: a lane's batch comes from whichever is not empty.
__device__ __forceinline__ unsigned long long* resident_bulk_tail(const PersistentParams* p, unsigned int l) {
    return (unsigned long long*)p->bulk_tails + l;
}
__device__ __forceinline__ unsigned long long* resident_bulk_head(const PersistentParams* p, unsigned int l) {
    return (unsigned long long*)p->bulk_heads + l;
}

// ---- input lanes: one bus read finds a message and delivers it ----
// The host writes lane slots in the LL format (after NCCL's low-latency protocol): InSlot's
// 8-byte word g travels as the slot's 16-byte chunk g, whose two 8-byte halves each carry 32
// bits of the word (the low bits in the first half) in their low 32 bits and a flag in their
// high 32 bits, the flag being the slot's position + 1 (mod 2^32). Only an aligned 8-byte
// access is single-copy atomic across PCIe, so each half stands alone: a half whose flag is the
// one expected holds its 32 data bits from that same write, whatever order the bus delivers the
// halves in and however a wider read is split. A poll that reads a slot whose every flag is the
// expected one therefore holds the message: it arrives in one dependent bus read, with no tail
// read before it. A lane slot takes 2 * sizeof(InSlot) bytes (LL's price: half the bus bytes
// carry flags). The tail is still published (after the slot) and read in the same round trip as
// the slot: it says whether more follow, which the copy below then reads behind one fence.
#define RESIDENT_LL_W ((unsigned int)(sizeof(InSlot) / 8))
__device__ __forceinline__ unsigned int resident_ll_flag(unsigned long long pos) { return (unsigned int)(pos + 1ull); }
// Chunk 0 of lane slot `pos` (a ring of `cap` slots at `ring`: its header, then the slots).
__device__ __forceinline__ const unsigned long long* resident_ll_slot(unsigned long long ring, unsigned long long pos,
                                                                     unsigned int cap) {
    return (const unsigned long long*)(ring + sizeof(RingHeader)) +
           (pos & (unsigned long long)(cap - 1u)) * (2ull * RESIDENT_LL_W);
}
// Decodes one chunk into its data word; true when both halves carry `flag`.
__device__ __forceinline__ bool resident_ll_decode(unsigned long long a, unsigned long long b, unsigned int flag,
                                                   unsigned long long* word) {
    *word = (a & 0xffffffffull) | (b << 32);
    return (unsigned int)(a >> 32) == flag && (unsigned int)(b >> 32) == flag;
}
// A chunk of a slot below a published tail that does not show its flag yet (its stores not yet
// visible here): re-read until it does. Bounded: the host stored the chunk before the tail, so
// only memory written outside the protocol can keep it wrong; after 1 s the block traps (the
// batch's inputs are then never marked consumed, so the host takes them back).
__device__ __noinline__ unsigned long long resident_ll_wait(const unsigned long long* chunk, unsigned int flag) {
    const unsigned long long t0 = resident_now_ns();
    for (;;) {
        unsigned long long a, b, w;
        resident_ld_relaxed_v2_u64(chunk, &a, &b);
        resident_bus_use();
        if (resident_ll_decode(a, b, flag, &w)) return w;
        if (resident_now_ns() - t0 > 1000000000ull) __trap();
        __nanosleep(256);
    }
}
// Copies lane slot `src` (LL format, position flag `flag`) into thread-private memory: the
// loads of up to RESIDENT_LL_PREFETCH chunks are issued before any is checked, so they share
// one round trip (a check branches on a load's value, so it waits for it).
__device__ __forceinline__ void resident_copy_in_ll(InSlot* dst, const unsigned long long* src, unsigned int flag) {
    unsigned long long* d = (unsigned long long*)dst;
    constexpr unsigned int G = RESIDENT_LL_W < RESIDENT_LL_PREFETCH ? RESIDENT_LL_W : RESIDENT_LL_PREFETCH;
    for (unsigned int g0 = 0; g0 < RESIDENT_LL_W; g0 += G) {
        unsigned long long a[G], b[G];
#pragma unroll
        for (unsigned int k = 0; k < G; ++k)
            if (g0 + k < RESIDENT_LL_W) resident_ld_relaxed_v2_u64(src + 2u * (g0 + k), &a[k], &b[k]);
        resident_bus_use();
#pragma unroll
        for (unsigned int k = 0; k < G; ++k) {
            const unsigned int g = g0 + k;
            if (g < RESIDENT_LL_W && !resident_ll_decode(a[k], b[k], flag, &d[g])) d[g] = resident_ll_wait(src + 2u * g, flag);
        }
    }
}
// The poll reads the whole head slot of every lane that looks empty, its chunks spread over
// warp 0, at most RESIDENT_FAST_K per thread (registers): 32 * K chunks in all, enough for 8
// lanes of slots up to 128 bytes, or fewer lanes of wider ones. A kernel whose lanes need more
// polls the tails alone, and its messages wait for two round trips (tail, then slot).
#define RESIDENT_FAST_K ((8u * RESIDENT_LL_W + 31u) / 32u < 4u ? (8u * RESIDENT_LL_W + 31u) / 32u : 4u)
#define RESIDENT_FAST_WORDS (32u * RESIDENT_FAST_K)

// Copies one slot from thread-private memory into queue memory.
template <typename S>
__device__ __forceinline__ void resident_copy_out(S* dst, const S* src) {
    unsigned long long* d = (unsigned long long*)dst;
    const unsigned long long* s = (const unsigned long long*)src;
    if (sizeof(S) % 16 == 0 && (((unsigned long long)dst) & 15ull) == 0) {
#pragma unroll 4
        for (unsigned int i = 0; i < sizeof(S) / 8; i += 2) resident_st_relaxed_v2_u64(d + i, s[i], s[i + 1]);
    } else {
#pragma unroll 4
        for (unsigned int i = 0; i < sizeof(S) / 8; ++i) resident_st_relaxed_u64(d + i, s[i]);
    }
}

__device__ __forceinline__ InSlot* resident_in_slots(unsigned long long ring) {
    return (InSlot*)((unsigned char*)ring + sizeof(RingHeader));
}

__device__ __forceinline__ OutSlot* resident_out_slots(unsigned long long ring) {
    return (OutSlot*)((unsigned char*)ring + sizeof(RingHeader));
}

// The response header: the request's id as correlation id, its flags (FLAG_CALL routing), its
// priority and its send timestamp (so the host measures round trips without a lookup).
__device__ __forceinline__ Envelope resident_reply_env(const Envelope* req) {
    Envelope e;
    e.message_id = req->message_id;
    e.correlation_id = req->message_id;
    e.timestamp_ns = req->timestamp_ns;
    e.priority = req->priority;
    e.flags = req->flags;
    e.reserved0 = 0;
    e.reserved1 = 0;
    return e;
}

// Thread 0's private bookkeeping (lives in its registers / local memory for the kernel's life).
struct ResidentOwner {
    unsigned long long head[8];         // own input heads (exact)
    unsigned long long cached_tail[8];  // host's input tails as last read (maybe stale = smaller)
    unsigned long long out_tail;        // own output tail (exact)
    unsigned long long out_cached_head; // host's output head as last read (maybe stale = smaller)
    unsigned long long processed, batches, busy_cycles, undelivered;
    unsigned long long hb_value, hb_time_ns, last_check_ns;
    unsigned int run_state, shown_state, backoff_ns;
    unsigned int last_outputs;  // outputs of the last batch (predicts the room the next needs)
    // Device-side forwarding: the peer ring (0 = none), its capacity, our head in it (exact
    // while we own it), its producer's tail as last read, messages taken from peers, the
    // peer_seq adopted, and whether we stopped at a call reply at its head.
    unsigned long long peer, peer_head, peer_cached_tail, peer_taken;
    unsigned int peer_cap, peer_seq, peer_blocked;
    // Lanes whose tail covered a head slot that did not show its flags in the last poll.
    unsigned int covered;
    // The bulk lanes: own heads (exact) and the copy stream's tails as last read (maybe stale =
    // smaller); all 0 without bulk lanes.
    unsigned long long bulk_head[8];
    unsigned long long bulk_cached_tail[8];
};

// Device counters: relaxed stores (the device is their only writer); the release store of
// device_state that follows a publication orders them for the host's acquire of device_state.
__device__ void resident_publish_counters(ControlBlock* ctl, const ResidentOwner* o) {
    resident_st_relaxed_u64(&ctl->processed, o->processed);
    resident_st_relaxed_u64(&ctl->batches, o->batches);
    resident_st_relaxed_u64(&ctl->busy_cycles, o->busy_cycles);
    resident_st_relaxed_u64(&ctl->undelivered, o->undelivered);
    resident_st_relaxed_u64(&ctl->peer_taken, o->peer_taken);
}

__device__ __forceinline__ bool resident_is_pow2(unsigned int v) { return v != 0 && (v & (v - 1)) == 0; }

// Adopts a new peer-input slot (thread 0, between batches only: every head of a taken peer
// batch is already published). Called with the control checks.
__device__ void resident_check_peer(const PersistentParams* p, ControlBlock* ctl, ResidentOwner* o) {
    // Acquire: pairs with the host's release store of peer_seq, which follows its stores of
    // peer_ring / peer_capacity and its own last release of that ring's head.
    unsigned int seq = resident_ld_acquire_u32(&ctl->peer_seq);
    if (seq == o->peer_seq) return;
    // Ordered after the acquire above; the host changes them only after our ack of the
    // previous seq (or never again, when that ack did not come).
    unsigned long long ring = resident_ld_relaxed_u64(&ctl->peer_ring);
    unsigned int cap = resident_ld_acquire_u32(&ctl->peer_capacity);
    if (ring != 0 && resident_is_pow2(cap)) {
        RingHeader* r = (RingHeader*)ring;
        // Acquire: the head was last released by the host's consumer (or by this kernel before a
        // quiesce); the tail pairs with the producing kernel's release store of it.
        o->peer_head = resident_ld_acquire_u64(&r->head);
        o->peer_cached_tail = resident_ld_acquire_u64(&r->tail);
        o->peer = ring;
        o->peer_cap = cap;
        // Every lane's tail afresh (acquire, after the acquire of peer_seq): the host links only
        // once every message it accepted before the link is in the lanes, and those must be
        // taken before the ring's. A cached tail that still showed some of the lane's messages
        // would let the ring's fill the batch ahead of the lane's newer ones (seen on CudaSim
        // under load: a forwarded message overtook two relayed by the host).
        // Never below the head: a slot taken by its flags may be ahead of its tail.
        for (unsigned int l = 0; l < p->lane_count; ++l) {
            const unsigned long long t = resident_ld_acquire_u64(&((RingHeader*)p->lanes[l])->tail);
            o->cached_tail[l] = t > o->head[l] ? t : o->head[l];
            // And the bulk tails: those messages too were accepted before the link.
            if (p->bulk_tails != 0ull) {
                const unsigned long long b = resident_ld_dev_acquire_u64(resident_bulk_tail(p, l));
                o->bulk_cached_tail[l] = b > o->bulk_head[l] ? b : o->bulk_head[l];
            }
        }
    } else {
        o->peer = 0;
        o->peer_cap = 0;
    }
    o->peer_blocked = 0;
    o->peer_seq = seq;
    // Release: after our last release of the old ring's head (published with its batch, before
    // this gather), so the host that acquires the ack owns that head again.
    resident_st_release_u32(&ctl->peer_ack, seq);
}

// Reads the host line of the control block. Returns 0, or the exit state when the kernel must
// exit (terminate requested, or the heartbeat stood still for longer than the timeout).
__device__ unsigned int resident_check_control(ControlBlock* ctl, ResidentOwner* o, unsigned long long now) {
    o->last_check_ns = now;
    // Three independent loads, issued together (one bus round trip, not three), then one
    // acquire fence that makes each an acquire: it pairs with the host's release stores of
    // heartbeat, of the timeout and of run_state (messages sent before a state change are
    // visible once the new state is).
    const unsigned long long hb = resident_ld_fenced(&ctl->heartbeat);
    const unsigned long long timeout = resident_ld_fenced(&ctl->heartbeat_timeout_ns);
    unsigned int rs = resident_ld_fenced(&ctl->run_state);
    resident_fence_acquire();
    if (hb != o->hb_value) {
        o->hb_value = hb;
        o->hb_time_ns = now;
        resident_st_relaxed_u64(&ctl->last_heartbeat_seen, hb);
    }
    if (timeout != 0 && now - o->hb_time_ns > timeout) return RESIDENT_DEV_HEARTBEAT_TIMEOUT;
    // Unknown run states park the kernel.
    if (rs > RESIDENT_RUN_QUIESCE) rs = RESIDENT_RUN_INACTIVE;
    o->run_state = rs;
    if (rs == RESIDENT_RUN_TERMINATE) return RESIDENT_DEV_TERMINATED;
    // Quiesce: finish the batch in hand (outputs included) and exit; queues, heads, tails,
    // counters and state stay where they are, and a relaunch over them resumes.
    if (rs == RESIDENT_RUN_QUIESCE) return RESIDENT_DEV_QUIESCED;
    return 0;
}

// Publishes a state change (with the counters first). Nothing is written when the state is
// unchanged: the counters are already current (published after every batch and while blocked on
// a full output), so a parked kernel's poll writes nothing over PCIe.
__device__ void resident_show_state(ControlBlock* ctl, ResidentOwner* o, unsigned int state) {
    if (state != o->shown_state) {
        resident_publish_counters(ctl, o);
        o->shown_state = state;
        // Release: after the counters; pairs with the host's acquire load of device_state.
        resident_st_release_u32(&ctl->device_state, state);
    }
}

__device__ __forceinline__ void resident_backoff(ResidentOwner* o, unsigned int max_ns) {
    __nanosleep(o->backoff_ns);
    unsigned int next = o->backoff_ns * 2;
    o->backoff_ns = next < max_ns ? next : max_ns;
}

// Which lane and which position in its run of the batch gathered slot `i` is (slots are
// gathered highest lane first, then the peer ring (RESIDENT_PEER) last).
__device__ __forceinline__ void resident_locate(const PersistentParams* p, const unsigned int* take, unsigned int i,
                                                unsigned int* lane, unsigned int* rem) {
    for (int l = (int)p->lane_count - 1; l >= 0; --l) {
        if (i < take[l]) {
            *lane = (unsigned int)l;
            *rem = i;
            return;
        }
        i -= take[l];
    }
    *lane = RESIDENT_PEER;
    *rem = i;
}

// One block of RESIDENT_BATCH threads, launched once; runs until terminate, heartbeat timeout or a
// parameter error. Batch output order: gathered order (highest lane first, FIFO within a lane),
// compacted over inputs whose handler returned false.
extern "C" __global__ void __launch_bounds__(RESIDENT_BATCH, 1) resident_persistent(PersistentParams p) {
    __shared__ unsigned int s_cmd;
    __shared__ unsigned int s_start;  // written once, before the first barrier (never reused)
    __shared__ unsigned int s_count;
    __shared__ unsigned int s_take[9];           // per lane, then the peer ring (RESIDENT_PEER)
    __shared__ unsigned long long s_head[9];
    __shared__ unsigned long long s_peer_ring;   // the peer ring of this batch (0: none)
    __shared__ unsigned int s_peer_cap;
    __shared__ unsigned int s_peer_stop;         // peer slots of the batch before the first call reply
    __shared__ unsigned int s_warp_base[RESIDENT_BATCH / 32];
    __shared__ unsigned long long s_stage[RESIDENT_BATCH / 32][64];  // per-warp copy staging (64 words: 16-byte accesses)
    __shared__ unsigned int s_abandon;
    __shared__ unsigned long long s_out_base;
    // Warp 0's poll: the round's act, the lanes polled by slot and their heads, the lanes whose
    // slot did not match (atomicOr), the staged head slots' data words (lane l's at l * W), and
    // the lanes of this batch whose one slot comes from there.
    __shared__ unsigned int s_act;
    __shared__ unsigned int s_poll_mask;
    __shared__ unsigned int s_poll_bad;
    __shared__ unsigned long long s_poll_head[8];
    __shared__ unsigned long long s_fast[RESIDENT_FAST_WORDS > 0u ? RESIDENT_FAST_WORDS : 1u];
    __shared__ unsigned int s_fast_mask;
    // The lanes of this batch whose slots come from their bulk device ring.
    __shared__ unsigned int s_bulk_mask;
#ifdef RESIDENT_KEYED
    __shared__ unsigned int s_key[RESIDENT_BATCH];  // each message's key, gathered order
    __shared__ unsigned int s_rounds;               // messages of the busiest key of the batch
#endif

    const unsigned int tid = threadIdx.x;
    ControlBlock* ctl = (ControlBlock*)p.control;
    ResidentState* state = (ResidentState*)p.state;
    // The bound buffers' table (device memory, written once before the launch); unused by a
    // kernel without bound buffers.
    ResidentBuffers* buffers = (ResidentBuffers*)p.buffers;
    (void)buffers;
    ResidentOwner o;
    unsigned int exit_state = 0;
    unsigned long long batch_start = 0;
    unsigned int handled = 0;  // thread 0: messages of the batch handed to the handler
    bool heads_early = false;  // thread 0: this batch's lane heads went out before its output wait
// The capacity of gather index l's ring (a lane, or the peer ring).
#define RESIDENT_CAP_OF(l) ((l) == RESIDENT_PEER ? s_peer_cap : p.lane_capacity)

    if (tid == 0) {
        resident_bus_begin(ctl, sizeof(ControlBlock));
        s_start = RESIDENT_CMD_RUN;
        unsigned int err = 0;
        if (blockDim.x != RESIDENT_BATCH || blockDim.y != 1 || blockDim.z != 1 || gridDim.x != 1 ||
            gridDim.y != 1 || gridDim.z != 1)
            err = RESIDENT_ERR_BAD_BLOCK_SIZE;
        else if (p.lane_count < 1 || p.lane_count > 8 || !resident_is_pow2(p.lane_capacity) ||
                 !resident_is_pow2(p.out_capacity) || p.out_capacity < RESIDENT_BATCH)
            err = RESIDENT_ERR_BAD_PARAMS;
        else if (p.bulk_tails != 0ull) {
            if (p.bulk_heads == 0ull) err = RESIDENT_ERR_BAD_PARAMS;
            for (unsigned int l = 0; l < p.lane_count; ++l)
                if (p.bulk_slots[l] == 0ull) err = RESIDENT_ERR_BAD_PARAMS;
        }
        if (err != 0) {
            resident_st_relaxed_u32(&ctl->error_code, err);
            resident_st_release_u32(&ctl->device_state, RESIDENT_DEV_ERROR);
            s_start = RESIDENT_CMD_EXIT;
        } else {
            for (unsigned int l = 0; l < 8; ++l) {
                o.head[l] = 0;
                o.cached_tail[l] = 0;
                if (l < p.lane_count) {
                    RingHeader* r = (RingHeader*)p.lanes[l];
                    // Own index: the host never writes it, a relaxed read is exact.
                    o.head[l] = resident_ld_relaxed_u64(&r->head);
                    // Acquire: pairs with the host's release store of tail. Never below the
                    // head (a slot taken by its flags before a quiesce may be ahead of it).
                    const unsigned long long t = resident_ld_acquire_u64(&r->tail);
                    o.cached_tail[l] = t > o.head[l] ? t : o.head[l];
                }
                o.bulk_head[l] = 0;
                o.bulk_cached_tail[l] = 0;
                if (l < p.lane_count && p.bulk_tails != 0ull) {
                    // Own index (relaxed is exact), then the copy stream's tail (acquire: its
                    // copies are visible); a relaunch after a quiesce resumes from both.
                    o.bulk_head[l] = resident_ld_relaxed_u64(resident_bulk_head(&p, l));
                    const unsigned long long b = resident_ld_dev_acquire_u64(resident_bulk_tail(&p, l));
                    o.bulk_cached_tail[l] = b > o.bulk_head[l] ? b : o.bulk_head[l];
                }
            }
            RingHeader* out = (RingHeader*)p.out;
            o.out_tail = resident_ld_relaxed_u64(&out->tail);
            o.out_cached_head = resident_ld_acquire_u64(&out->head);
            // Device-written counters continue from the control block, so a kernel relaunched
            // over the same queues (after a quiesce) counts on where it left off.
            o.processed = resident_ld_relaxed_u64(&ctl->processed);
            o.batches = resident_ld_relaxed_u64(&ctl->batches);
            o.busy_cycles = resident_ld_relaxed_u64(&ctl->busy_cycles);
            o.undelivered = resident_ld_relaxed_u64(&ctl->undelivered);
            o.peer_taken = resident_ld_relaxed_u64(&ctl->peer_taken);
            // No peer until the first control check adopts the slot (also after a relaunch).
            o.peer = 0;
            o.peer_head = 0;
            o.peer_cached_tail = 0;
            o.peer_cap = 0;
            o.peer_seq = 0;
            o.peer_blocked = 0;
            o.hb_value = resident_ld_acquire_u64(&ctl->heartbeat);
            o.hb_time_ns = resident_now_ns();
            o.last_check_ns = 0;
            o.run_state = RESIDENT_RUN_LAUNCHED;
            o.shown_state = 0;
            o.backoff_ns = RESIDENT_MIN_BACKOFF_NS;
            o.last_outputs = 0;
            o.covered = 0;
        }
    }
    __syncthreads();
    if (s_start == RESIDENT_CMD_EXIT) return;

    for (;;) {
        // ---- warp 0: control (thread 0), a poll of the lanes (the warp), the gather (thread 0) ----
        // Idle polls stay inside warp 0's loop: the other warps wait at barrier A (on the GPU a
        // warp waiting at bar.sync costs no issue slots) and the block's shared state (s_cmd,
        // s_take, ...) is written only when there is a batch or an exit to announce. So s_cmd is
        // never rewritten while another thread may still read it (the race compute-sanitizer's
        // racecheck reported when idle polls went through the block's barriers), and an idle
        // poll costs two warp barriers, not block ones.
        //
        // One round of the loop: thread 0 checks the control block and decides (s_act: poll,
        // wait while inactive, run the batch found, exit); warp barrier S1; in a poll, every
        // thread of the warp reads its chunks of the head slots of the lanes that look empty
        // (the LL format: each chunk shows by its flags whether the message is there) while
        // thread 0 reads those lanes' tails in the same round trip; warp barrier S2; thread 0
        // gathers. A message that finds the kernel polling therefore waits for one bus read.
        if (tid < 32u) {
            unsigned int cmd = RESIDENT_CMD_IDLE;
            unsigned int total = 0;
            bool found = false;
            // Thread 0's loads of a poll, used after S2.
            unsigned long long t[RESIDENT_PEER + 1] = {};
            unsigned long long out_head = 0;
            bool out_low = false, peer_on = false;
            const bool fast_on = RESIDENT_FAST_POLL != 0u && p.lane_count * RESIDENT_LL_W <= RESIDENT_FAST_WORDS;
            for (;;) {
                if (tid == 0) {
                    unsigned int act = RESIDENT_ACT_WAIT;
                    if (found) {
                        act = RESIDENT_ACT_RUN;
                    } else {
                        unsigned long long now = resident_now_ns();
                        // The control block is read on every poll only while not active (it is
                        // all the kernel waits for then); while active, at most every
                        // control_poll_ns, so a poll of an idle kernel costs the lanes, not the
                        // control line.
                        if (o.run_state != RESIDENT_RUN_ACTIVE || now - o.last_check_ns >= p.control_poll_ns) {
                            exit_state = resident_check_control(ctl, &o, now);
                            if (exit_state == 0) {
                                resident_check_peer(&p, ctl, &o);
                                resident_show_state(ctl, &o, o.run_state == RESIDENT_RUN_ACTIVE ? RESIDENT_DEV_RUNNING : RESIDENT_DEV_IDLE);
                            }
                        }
                        if (exit_state != 0) {
                            act = RESIDENT_ACT_EXIT;
                        } else if (o.run_state == RESIDENT_RUN_ACTIVE) {
                            act = RESIDENT_ACT_POLL;
                            resident_bus_poll();
                            unsigned int m = 0;
                            for (unsigned int l = 0; fast_on && l < p.lane_count; ++l) {
                                if (o.cached_tail[l] == o.head[l]) {
                                    m |= 1u << l;
                                    s_poll_head[l] = o.head[l];
                                }
                            }
                            s_poll_mask = m;
                            s_poll_bad = 0;
                        }
                    }
                    s_act = act;
                }
                __syncwarp();  // S1: s_act / s_poll_* visible to the warp
                const unsigned int act = s_act;
                if (act == RESIDENT_ACT_EXIT) {
                    if (tid == 0) cmd = RESIDENT_CMD_EXIT;
                    break;
                }
                if (act == RESIDENT_ACT_RUN) {
                    if (tid == 0) cmd = RESIDENT_CMD_RUN;
                    break;
                }
                if (act == RESIDENT_ACT_POLL) {
                    // Every load of the poll is issued before any is used: independent, so they
                    // overlap in one PCIe round trip (unrolled so each is its own load).
                    const unsigned int pm = s_poll_mask;
                    unsigned long long ra[RESIDENT_FAST_K], rb[RESIDENT_FAST_K];
#pragma unroll
                    for (unsigned int k = 0; k < RESIDENT_FAST_K; ++k) {
                        const unsigned int c = tid + 32u * k;
                        const unsigned int l = c / RESIDENT_LL_W;
                        ra[k] = 0;
                        rb[k] = 0;
                        if (l < 8u && ((pm >> l) & 1u) != 0u)
                            resident_ld_relaxed_v2_u64(resident_ll_slot(p.lanes[l], s_poll_head[l], p.lane_capacity) +
                                                           2u * (c - l * RESIDENT_LL_W),
                                                       &ra[k], &rb[k]);
                    }
                    if (tid == 0) {
                        // The tails of the lanes that look empty: whether more than the head slot
                        // is there (pairs, behind the fence below, with the host's release store
                        // of tail after its slot stores).
                        peer_on = o.peer != 0 && !o.peer_blocked;
#pragma unroll
                        for (unsigned int l = 0; l < 8; ++l) {
                            t[l] = 0;
                            if (l < p.lane_count && o.cached_tail[l] == o.head[l])
                                t[l] = resident_ld_fenced(&((RingHeader*)p.lanes[l])->tail);
                        }
                        // The producing kernel's tail likewise (pairs with its release store of
                        // the tail after its slot writes).
                        if (peer_on && o.peer_cached_tail == o.peer_head)
                            t[RESIDENT_PEER] = resident_ld_fenced(&((RingHeader*)o.peer)->tail);
                        // And the host's output head, when the room it last showed would not
                        // take as many outputs as the last batch made: read in the same round
                        // trip, not after the handlers as one more (pairs with the host's release
                        // store of head). One message in flight reads it about once per ring's
                        // worth of outputs; full batches on every poll.
                        const unsigned long long room = p.out_capacity - (o.out_tail - o.out_cached_head);
                        out_low = room < (o.last_outputs > 0u ? o.last_outputs : 1u);
                        if (out_low) out_head = resident_ld_fenced(&((RingHeader*)p.out)->head);
                        // Last, once the bus loads above are in flight: the bulk tails of the
                        // lanes whose device ring looks empty. Device memory (L2, no bus round
                        // trip); each an acquire, which pairs with the stream order of the copy
                        // before the memory operation that wrote it, so the slots below are
                        // visible to this thread and, via barrier A, to all.
                        if (p.bulk_tails != 0ull) {
                            for (unsigned int l = 0; l < p.lane_count; ++l) {
                                if (o.bulk_cached_tail[l] != o.bulk_head[l]) continue;
                                const unsigned long long b = resident_ld_dev_acquire_u64(resident_bulk_tail(&p, l));
                                if (b > o.bulk_head[l]) o.bulk_cached_tail[l] = b;
                            }
                        }
                    }
                    // Each chunk's data word goes to the staging line (read only for a lane
                    // whose every chunk matched); a mismatch marks its lane.
                    unsigned int bad = 0;
#pragma unroll
                    for (unsigned int k = 0; k < RESIDENT_FAST_K; ++k) {
                        const unsigned int c = tid + 32u * k;
                        const unsigned int l = c / RESIDENT_LL_W;
                        if (l < 8u && ((pm >> l) & 1u) != 0u) {
                            unsigned long long w;
                            if (resident_ll_decode(ra[k], rb[k], resident_ll_flag(s_poll_head[l]), &w))
                                s_fast[c] = w;
                            else
                                bad |= 1u << l;
                        }
                    }
                    if (bad != 0u) atomicOr(&s_poll_bad, bad);
                }
                __syncwarp();  // S2: s_poll_bad final; every thread has read s_act / s_poll_*
                if (tid == 0 && act == RESIDENT_ACT_POLL) {
                    const unsigned int ready = s_poll_mask & ~s_poll_bad;
                    unsigned int fast = 0;
                    bool fresh = false;
#pragma unroll
                    for (unsigned int l = 0; l < 8; ++l) {
                        if (l < p.lane_count && o.cached_tail[l] == o.head[l]) {
                            // The tail may trail a slot already seen by its flags (the host
                            // stores the slot first): never below the head.
                            unsigned long long tl = t[l] > o.head[l] ? t[l] : o.head[l];
                            const bool seen = ((ready >> l) & 1u) != 0u;
                            const bool was_covered = ((o.covered >> l) & 1u) != 0u;
                            o.covered &= ~(1u << l);
                            if (seen && tl <= o.head[l] + 1u) {
                                // The head slot is in the staging line and nothing is behind
                                // it: no fence, no further read.
                                fast |= 1u << l;
                                o.cached_tail[l] = o.head[l] + 1u;
                            } else if (seen || !fast_on || was_covered) {
                                // More than the head slot (or no slot poll, or a slot the tail
                                // covered a round ago that still shows no flags: its copy
                                // then waits for them, bounded): read behind the fence.
                                fresh |= tl != o.head[l];
                                o.cached_tail[l] = tl;
                            } else if (tl != o.head[l]) {
                                // The tail shows a message whose slot did not: it landed while
                                // the round's loads were in flight (the tail was read later
                                // than the slot). The next round reads it by its flags.
                                o.covered |= 1u << l;
                            }
                        }
                    }
                    if (peer_on && o.peer_cached_tail == o.peer_head) {
                        fresh |= t[RESIDENT_PEER] != o.peer_cached_tail;
                        o.peer_cached_tail = t[RESIDENT_PEER];
                    }
                    // One acquire fence for what the tails show beyond a staged slot: pairs with
                    // the host's release stores of those tails, so the slots up to them are
                    // visible to this thread and, via barrier A, to all.
                    if (out_low) o.out_cached_head = out_head;
                    if (fresh || out_low) resident_fence_acquire();
                    total = 0;
                    unsigned int bulk = 0;
                    for (int l = (int)p.lane_count - 1; l >= 0; --l) {
                        // One path per lane holds messages: the LL lane's, else the bulk lane's.
                        unsigned long long avail = o.cached_tail[l] - o.head[l];
                        const bool from_bulk = avail == 0 && o.bulk_cached_tail[l] != o.bulk_head[l];
                        if (from_bulk) avail = o.bulk_cached_tail[l] - o.bulk_head[l];
                        unsigned int room = RESIDENT_BATCH - total;
                        unsigned int tk = avail < room ? (unsigned int)avail : room;
                        s_take[l] = tk;
                        if (from_bulk && tk != 0u) bulk |= 1u << l;
                        total += tk;
                    }
                    s_bulk_mask = bulk;
                    // The peer ring fills what room the own lanes leave: inputs sent to this
                    // kernel directly come first, as a higher lane would; forwarded ones keep
                    // their ring's FIFO order, and wait (their producer backpressured) while the
                    // own lanes keep the batch full.
                    unsigned int pt = 0;
                    if (peer_on) {
                        unsigned long long avail = o.peer_cached_tail - o.peer_head;
                        unsigned int room = RESIDENT_BATCH - total;
                        pt = avail < room ? (unsigned int)avail : room;
                    }
                    s_take[RESIDENT_PEER] = pt;
                    total += pt;
                    // A staged lane gives its one slot from the staging line.
                    unsigned int staged = 0;
                    for (unsigned int l = 0; l < p.lane_count; ++l)
                        if (((fast >> l) & 1u) != 0u && s_take[l] == 1u) staged |= 1u << l;
                    s_fast_mask = staged;
                    found = total > 0;
                    // No pause before the next round when a message is known to be landing.
                    if (!found && o.covered == 0u) resident_backoff(&o, p.max_backoff_ns);
                } else if (tid == 0 && act == RESIDENT_ACT_WAIT) {
                    resident_backoff(&o, p.max_backoff_ns);
                }
            }
            if (tid == 0) {
                if (cmd == RESIDENT_CMD_RUN) {
                    for (unsigned int l = 0; l < 8; ++l) {
                        if (l >= p.lane_count) s_take[l] = 0;
                        s_head[l] = ((s_bulk_mask >> l) & 1u) != 0u ? o.bulk_head[l] : o.head[l];
                    }
                    s_head[RESIDENT_PEER] = o.peer_head;
                    s_peer_ring = o.peer;
                    s_peer_cap = o.peer_cap;
                    s_peer_stop = s_take[RESIDENT_PEER];
                } else {
                    total = 0;
                }
                s_count = total;
                s_cmd = cmd;
                o.backoff_ns = RESIDENT_MIN_BACKOFF_NS;
                batch_start = clock64();
            }
        }
        __syncthreads();  // A: s_cmd / s_take / s_head visible to all
        const unsigned int cmd = s_cmd;
        if (cmd == RESIDENT_CMD_EXIT) break;

        // ---- all threads: copy the batch out of the lanes, warp by warp ----
        // A warp whose 32 slots are one contiguous run of one ring (the common case) reads it
        // in rounds of 32 loads, lane L making load L of the round (consecutive lanes,
        // consecutive addresses: coalesced), and hands each word to its slot's thread through a
        // per-warp staging line in shared memory. A lane's run is LL chunks (one 16-byte load
        // per data word, checked by its flags); the peer ring's is plain slots (another
        // kernel's output ring, published by its tail). Runs that cross rings or wrap, and a
        // lane's slot staged by the poll, go one slot per thread. The choice is warp-uniform,
        // so every lane takes part in every __syncwarp.
        const unsigned int n = s_count;
        const unsigned int lane = tid & 31u;
        const unsigned int warp = tid >> 5;
        InSlot in;
        OutSlot out;
        bool produced = false;
        if (warp * 32u < n) {
            const unsigned int w_first = warp * 32u;
            const unsigned int w_count = n - w_first < 32u ? n - w_first : 32u;
            unsigned int l0, r0, l1, r1;
            resident_locate(&p, s_take, w_first, &l0, &r0);
            resident_locate(&p, s_take, w_first + w_count - 1u, &l1, &r1);
            const unsigned int cap0 = RESIDENT_CAP_OF(l0);
            const unsigned long long pos0 = (s_head[l0] + r0) & (unsigned long long)(cap0 - 1);
            const unsigned int W = (unsigned int)(sizeof(InSlot) / 8);
            unsigned long long* mine = (unsigned long long*)&in;
            const bool staged0 = l0 != RESIDENT_PEER && ((s_fast_mask >> l0) & 1u) != 0u;
            const bool bulk0 = l0 != RESIDENT_PEER && ((s_bulk_mask >> l0) & 1u) != 0u;
            if (l0 == l1 && pos0 + w_count <= cap0 && l0 != RESIDENT_PEER && !staged0 && !bulk0) {
                // A lane's run: chunk g is data word g of the run, its flag its slot's position.
                const unsigned long long first_pos = s_head[l0] + r0;
                const unsigned long long* src = resident_ll_slot(p.lanes[l0], first_pos, cap0);
                const unsigned int words = w_count * W;
                // The loads of up to RESIDENT_LL_PREFETCH rounds are all issued into registers
                // before the first is staged, so they share one bus round trip instead of one
                // each (staging waits for a load's value; see CudaSim's bus model). A full
                // warp's run takes W rounds.
                constexpr unsigned int KL = RESIDENT_LL_W < RESIDENT_LL_PREFETCH ? RESIDENT_LL_W : RESIDENT_LL_PREFETCH;
                for (unsigned int group = 0; group < words; group += 32u * KL) {
                    unsigned long long ra[KL], rb[KL];
#pragma unroll
                    for (unsigned int k = 0; k < KL; ++k) {
                        const unsigned int w = group + k * 32u + lane;
                        ra[k] = 0;
                        rb[k] = 0;
                        if (w < words) resident_ld_relaxed_v2_u64(src + 2u * w, &ra[k], &rb[k]);
                    }
#pragma unroll
                    for (unsigned int k = 0; k < KL; ++k) {
                        const unsigned int base = group + k * 32u;
                        if (base >= words) break;  // warp-uniform
                        const unsigned int w = base + lane;
                        if (w < words) {
                            const unsigned int f = resident_ll_flag(first_pos + w / W);
                            unsigned long long v;
                            if (!resident_ll_decode(ra[k], rb[k], f, &v)) v = resident_ll_wait(src + 2u * w, f);
                            s_stage[warp][lane] = v;
                        }
                        __syncwarp();
                        if (lane < w_count) {
                            const unsigned int first = lane * W;
                            const unsigned int lo = first > base ? first : base;
                            const unsigned int hi = first + W < base + 32u ? first + W : base + 32u;
                            for (unsigned int g = lo; g < hi; ++g) mine[g - first] = s_stage[warp][g - base];
                        }
                        __syncwarp();
                    }
                }
            } else if (l0 == l1 && pos0 + w_count <= cap0 && (l0 == RESIDENT_PEER || bulk0)) {
                // Plain slots: the peer ring (another kernel's output ring, host memory) or a
                // bulk lane's device ring (device memory: L2 reads, the copy engine put them
                // there). Warp-uniform either way.
                const unsigned long long* src =
                    bulk0 ? (const unsigned long long*)((const InSlot*)p.bulk_slots[l0] + pos0)
                          : (const unsigned long long*)(resident_in_slots(s_peer_ring) + pos0);
                const unsigned int words = w_count * W;
                // 16-byte loads (64 words per round, half the bus reads) where the run starts
                // on a 16-byte boundary; 8-byte ones otherwise. Warp-uniform: one src per warp.
                // Prefetched as above: as many rounds as a full warp's run takes with 16-byte
                // loads, at most RESIDENT_PREFETCH (registers: the 1024-thread block has 64 per
                // thread).
                constexpr unsigned int KP = (32u * (sizeof(InSlot) / 8) + 63u) / 64u < RESIDENT_PREFETCH
                                                ? (32u * (sizeof(InSlot) / 8) + 63u) / 64u
                                                : RESIDENT_PREFETCH;
                const unsigned int per = (((unsigned long long)src) & 15ull) == 0 ? 2u : 1u;
                const unsigned int step = 32u * per;
                for (unsigned int group = 0; group < words; group += step * KP) {
                    unsigned long long ra[KP], rb[KP];
#pragma unroll
                    for (unsigned int k = 0; k < KP; ++k) {
                        const unsigned int w = group + k * step + per * lane;
                        ra[k] = 0;
                        rb[k] = 0;
                        if (per == 2u && w + 1u < words) {
                            if (bulk0)
                                resident_ld_dev_v2_u64(src + w, &ra[k], &rb[k]);
                            else
                                resident_ld_relaxed_v2_u64(src + w, &ra[k], &rb[k]);
                        } else if (w < words) {
                            ra[k] = bulk0 ? resident_ld_dev_u64(src + w) : resident_ld_relaxed_u64(src + w);
                        }
                    }
#pragma unroll
                    for (unsigned int k = 0; k < KP; ++k) {
                        const unsigned int base = group + k * step;
                        if (base >= words) break;  // warp-uniform
                        s_stage[warp][per * lane] = ra[k];
                        if (per == 2u) s_stage[warp][2u * lane + 1u] = rb[k];
                        __syncwarp();
                        if (lane < w_count) {
                            const unsigned int first = lane * W;
                            const unsigned int lo = first > base ? first : base;
                            const unsigned int hi = first + W < base + step ? first + W : base + step;
                            for (unsigned int g = lo; g < hi; ++g) mine[g - first] = s_stage[warp][g - base];
                        }
                        __syncwarp();
                    }
                }
            } else if (tid < n) {
                unsigned int l, rem;
                resident_locate(&p, s_take, tid, &l, &rem);
                if (l == RESIDENT_PEER) {
                    resident_copy_in(&in, resident_in_slots(s_peer_ring) + ((s_head[l] + rem) & (unsigned long long)(s_peer_cap - 1)));
                } else if (((s_bulk_mask >> l) & 1u) != 0u) {
                    resident_copy_in<true>(&in, (const InSlot*)p.bulk_slots[l] + ((s_head[l] + rem) & (unsigned long long)(p.lane_capacity - 1)));
                } else if (((s_fast_mask >> l) & 1u) != 0u) {
                    // The poll's staged slot (its one slot of the batch: rem is 0).
                    for (unsigned int g = 0; g < W; ++g) mine[g] = s_fast[l * W + g];
                } else {
                    const unsigned long long pos = s_head[l] + rem;
                    resident_copy_in_ll(&in, resident_ll_slot(p.lanes[l], pos, p.lane_capacity), resident_ll_flag(pos));
                }
            }
        }

        // ---- a call reply met in the peer ring: stop there ----
        // A `call` to the producing kernel is answered to its caller, never forwarded (as on the
        // host). Its reply is not handled here: the batch ends before the first one (the peer's
        // slots are last in gathered order, so what stays is a suffix), and thread 0 stops
        // taking from the peer and tells the host, which takes the ring back (unlink) and
        // routes the reply. s_take[RESIDENT_PEER] is the same for every thread (shared, written
        // before barrier A), so the barrier below is taken by all or none.
        bool live = tid < n;
        if (s_take[RESIDENT_PEER] != 0) {
            unsigned int pl = 0, prem = 0;
            if (tid < n) {
                resident_locate(&p, s_take, tid, &pl, &prem);
                if (pl == RESIDENT_PEER && (in.env.flags & 1u) != 0u) atomicMin(&s_peer_stop, prem);
            }
            __syncthreads();  // P: s_peer_stop final
            if (tid < n && pl == RESIDENT_PEER && prem >= s_peer_stop) live = false;
        }

        // ---- all threads: handle ----
#ifdef RESIDENT_KEYED
        // A keyed kernel: one thread per message, and the messages of one key in gathered order
        // (the order sent, within a lane). A message's rank is the number of messages of its key
        // before it in the batch; round r runs the rank-r messages, so a key's messages run one
        // per round, in order, and different keys run in the same round. Barrier R makes a
        // round's writes to the key states visible to the next round. Bounded: at most n rounds,
        // every thread takes the same number of barriers.
        unsigned int rank = 0u;
        {
            const unsigned int key = live ? RESIDENT_KEY_OF(&in.payload) : 0u;
            if (tid < n) s_key[tid] = key;
            // s_rounds was last read before barrier D of the previous batch.
            if (tid == 0) s_rounds = 0u;
            __syncthreads();  // K1: keys and the reset visible
            if (live) {
                for (unsigned int j = 0; j < tid; ++j) rank += s_key[j] == key ? 1u : 0u;
                atomicMax(&s_rounds, rank + 1u);
            }
            __syncthreads();  // K2: s_rounds final
        }
        const unsigned int rounds = s_rounds;
        for (unsigned int r = 0; r < rounds; ++r) {
            if (live && rank == r) {
                out.payload = ResidentOut{};
                out.env = resident_reply_env(&in.env);
                produced = RESIDENT_CALL(state, &in.payload, &out.payload, &in.env, buffers);
            }
            __syncthreads();  // R: this round's key-state writes visible to the next round
        }
#else
        if (live) {
            out.payload = ResidentOut{};
            out.env = resident_reply_env(&in.env);
            produced = RESIDENT_CALL(state, &in.payload, &out.payload, &in.env, buffers);
        }
#endif

        // ---- compaction: rank = outputs before this thread in gathered order ----
        const unsigned int mask = __ballot_sync(0xffffffffu, produced);
        if (lane == 0) s_warp_base[warp] = __popc(mask);
        __syncthreads();  // D: per-warp counts visible; every slot read and handler done

        if (tid == 0) {
            // The lane heads are published at the end of the batch with the output tail, or
            // before the wait for output room (see there). The peer ring's head is published now, up to the first call reply
            // (s_peer_stop), after every handler of the batch returned; the producing
            // kernel's acquire of its output head then lets it reuse those slots.
            handled = n;
            if (s_take[RESIDENT_PEER] != 0) {
                const unsigned int used = s_peer_stop;
                handled = n - (s_take[RESIDENT_PEER] - used);
                if (used != 0) {
                    o.peer_head += used;
                    o.peer_taken += used;
                    resident_st_release_u64(&((RingHeader*)o.peer)->head, o.peer_head);
                }
                if (used < s_take[RESIDENT_PEER]) {
                    o.peer_blocked = 1;
                    // Release: after the head above; the host that sees it takes the ring back.
                    resident_st_release_u32(&ctl->peer_call_seen, o.peer_seq);
                }
            }
            unsigned int sum = 0;
            for (unsigned int w = 0; w < RESIDENT_BATCH / 32; ++w) {
                unsigned int c = s_warp_base[w];
                s_warp_base[w] = sum;
                sum += c;
            }
            // Wait for room for all `sum` outputs; never drop. Re-read the host's head only when
            // the cached copy shows too little room.
            unsigned int abandon = 0;
            unsigned long long cap = p.out_capacity;
            unsigned int wait_ns = RESIDENT_MIN_BACKOFF_NS;
            // About to wait for room: the batch's inputs are taken now, as the host sees them
            // (each head a release store: our reads of its slots, ordered by barrier D, happen
            // before the host's acquire of it lets it overwrite them). Otherwise the heads go
            // out with the output tail, under one fence (the end of the batch).
            heads_early = o.out_tail + sum - o.out_cached_head > cap;
            if (heads_early) {
                for (unsigned int l = 0; l < p.lane_count; ++l) {
                    if (s_take[l] == 0) continue;
                    if (((s_bulk_mask >> l) & 1u) != 0u) {
                        o.bulk_head[l] += s_take[l];
                        resident_st_release_u64(resident_bulk_head(&p, l), o.bulk_head[l]);
                    } else {
                        o.head[l] += s_take[l];
                        resident_st_release_u64(&((RingHeader*)p.lanes[l])->head, o.head[l]);
                    }
                }
            }
            while (o.out_tail + sum - o.out_cached_head > cap) {
                // Acquire: pairs with the host's release store of head; its reads of those
                // slots happen before our writes.
                o.out_cached_head = resident_ld_acquire_u64(&((RingHeader*)p.out)->head);
                if (o.out_tail + sum - o.out_cached_head <= cap) break;
                // Blocked on a full output: make the counters current for whoever watches.
                if (wait_ns == RESIDENT_MIN_BACKOFF_NS) resident_publish_counters(ctl, &o);
                exit_state = resident_check_control(ctl, &o, resident_now_ns());
                if (exit_state == RESIDENT_DEV_QUIESCED) {
                    // A quiesce never drops outputs: keep waiting for the host to drain; the
                    // next control check after this batch exits.
                    exit_state = 0;
                } else if (exit_state != 0) {
                    abandon = 1;
                    break;
                }
                __nanosleep(wait_ns);
                wait_ns = wait_ns * 2 < p.max_backoff_ns ? wait_ns * 2 : p.max_backoff_ns;
            }
            s_abandon = abandon;
            s_out_base = o.out_tail;
            s_count = sum;  // reused: outputs in this batch
        }
        __syncthreads();  // E: s_abandon / s_out_base / ranks visible

        // A warp's outputs are consecutive in the ring (ranks s_warp_base[warp] + 0..count):
        // staged through shared memory and stored in coalesced 32-word chunks, unless they
        // wrap the ring (then one slot per thread).
        const unsigned int abandon = s_abandon;
        const unsigned int w_out = __popc(mask);
        if (!abandon && w_out != 0) {
            const unsigned int wrank = __popc(mask & ((1u << lane) - 1u));
            const unsigned long long pos0 = (s_out_base + s_warp_base[warp]) & (unsigned long long)(p.out_capacity - 1);
            if (pos0 + w_out <= p.out_capacity) {
                const unsigned int W = (unsigned int)(sizeof(OutSlot) / 8);
                unsigned long long* dst = (unsigned long long*)(resident_out_slots(p.out) + pos0);
                const unsigned long long* mine = (const unsigned long long*)&out;
                const unsigned int words = w_out * W;
                // 16-byte stores where the run starts on a 16-byte boundary, as the loads above.
                const bool v2 = (((unsigned long long)dst) & 15ull) == 0;
                const unsigned int step = v2 ? 64u : 32u;
                for (unsigned int base = 0; base < words; base += step) {
                    if (produced) {
                        const unsigned int first = wrank * W;
                        const unsigned int lo = first > base ? first : base;
                        const unsigned int hi = first + W < base + step ? first + W : base + step;
                        for (unsigned int g = lo; g < hi; ++g) s_stage[warp][g - base] = mine[g - first];
                    }
                    __syncwarp();
                    if (v2) {
                        const unsigned int w = base + 2u * lane;
                        if (w + 1u < words)
                            resident_st_relaxed_v2_u64(dst + w, s_stage[warp][2u * lane], s_stage[warp][2u * lane + 1u]);
                        else if (w < words)
                            resident_st_relaxed_u64(dst + w, s_stage[warp][2u * lane]);
                    } else if (base + lane < words) {
                        resident_st_relaxed_u64(dst + base + lane, s_stage[warp][lane]);
                    }
                    __syncwarp();
                }
            } else if (produced) {
                OutSlot* dst = resident_out_slots(p.out) + ((pos0 + wrank) & (unsigned long long)(p.out_capacity - 1));
                resident_copy_out(dst, &out);
            }
        }
        __syncthreads();  // F: every output slot written before the tail is published

        if (tid == 0) {
            unsigned int outputs = s_count;
            // Count the batch first and publish the counters before the outputs: the release
            // store of tail below orders these relaxed stores too, so a host that sees an
            // output also sees it counted in `processed`.
            o.processed += handled;
            o.batches += 1;
            o.busy_cycles += (unsigned long long)(clock64() - (long long)batch_start);
            if (abandon) {
                o.undelivered += outputs;
            }
            resident_publish_counters(ctl, &o);
            // One release fence for the output tail and the lane heads (two release stores each
            // waited for the earlier writes on their own). The fence is cumulative: the slot
            // writes of all threads (ordered before it by barrier F) are visible to the host's
            // acquire load of tail, and our reads of the input slots (barrier D) happen before
            // the host's acquire of a head lets it overwrite them. The heads are published only
            // now, after every handler of the batch returned: a batch whose handler faults
            // (trap) is never marked consumed, so the host takes those inputs back instead of
            // losing them.
            const bool tail_moves = !abandon && outputs != 0;
            bool heads_move = false;
            if (!heads_early)
                for (unsigned int l = 0; l < p.lane_count; ++l) heads_move |= s_take[l] != 0;
            if (tail_moves || heads_move) resident_fence_release();
            if (tail_moves) {
                o.out_tail += outputs;
                resident_st_covered_u64(&((RingHeader*)p.out)->tail, o.out_tail);
            }
            for (unsigned int l = 0; heads_move && l < p.lane_count; ++l) {
                if (s_take[l] == 0) continue;
                if (((s_bulk_mask >> l) & 1u) != 0u) {
                    o.bulk_head[l] += s_take[l];
                    resident_st_covered_u64(resident_bulk_head(&p, l), o.bulk_head[l]);
                } else {
                    o.head[l] += s_take[l];
                    resident_st_covered_u64(&((RingHeader*)p.lanes[l])->head, o.head[l]);
                }
            }
            o.last_outputs = outputs;
            resident_bus_batch(handled);
        }
        if (abandon) break;
        // No extra barrier needed: thread 0 next writes shared state (s_cmd, s_take, s_head,
        // s_count) before barrier A, and every other thread's last read of them was before F.
    }

    if (tid == 0) {
        resident_publish_counters(ctl, &o);
        // Release: after the counters; the host's acquire of device_state sees final counters.
        resident_st_release_u32(&ctl->device_state, exit_state);
    }
}

#undef RESIDENT_CAP_OF

// Launch-per-batch baseline (handlers without bound buffers only: it passes no table, and the
// runner refuses a source with buffers): the same handler over `n` slots in device memory, on a grid that
// covers the batch (ceil(n / RESIDENT_BATCH) blocks, one message per thread); outputs compacted
// in input order across the whole grid; `*out_count` = outputs.
//
// Cross-block order comes from a chained scan over `scan` (zeroed before the launch):
// scan[0] is a ticket that numbers blocks in the order they start, and block b publishes its
// inclusive output count in scan[2 + 2b] with a release of its flag scan[1 + 2b]. A block only
// waits for a lower ticket, i.e. a block that has already started, so the chain completes
// whatever order the hardware schedules blocks in.
extern "C" __global__ void __launch_bounds__(RESIDENT_BATCH)
    resident_batch(const InSlot* in, unsigned int n, OutSlot* out, unsigned int* out_count, ResidentState* state,
                   unsigned int* scan) {
    __shared__ unsigned int s_warp_base[RESIDENT_BATCH / 32];
    __shared__ unsigned int s_block;
    __shared__ unsigned int s_prefix;
    const unsigned int tid = threadIdx.x;
    const unsigned int lane = tid & 31u;
    const unsigned int warp = tid >> 5;
    if (tid == 0) s_block = atomicAdd(&scan[0], 1u);
    __syncthreads();
    const unsigned int b = s_block;
    const unsigned int i = b * RESIDENT_BATCH + tid;
    bool produced = false;
    OutSlot o;
    if (i < n) {
        InSlot s = in[i];
        o.payload = ResidentOut{};
        o.env = resident_reply_env(&s.env);
        produced = RESIDENT_CALL(state, &s.payload, &o.payload, &s.env, (ResidentBuffers*)0);
    }
    const unsigned int mask = __ballot_sync(0xffffffffu, produced);
    if (lane == 0) s_warp_base[warp] = __popc(mask);
    __syncthreads();
    if (tid == 0) {
        unsigned int sum = 0;
        for (unsigned int w = 0; w < RESIDENT_BATCH / 32; ++w) {
            unsigned int c = s_warp_base[w];
            s_warp_base[w] = sum;
            sum += c;
        }
        unsigned int prefix = 0;
        if (b > 0) {
            // Acquire: pairs with the previous block's release of its flag (its count first).
            while (resident_ld_acquire_u32(&scan[1 + 2 * (b - 1)]) == 0u) __nanosleep(64);
            prefix = resident_ld_acquire_u32(&scan[2 + 2 * (b - 1)]);
        }
        resident_st_relaxed_u32(&scan[2 + 2 * b], prefix + sum);
        // Release: the count above is visible to whoever sees the flag.
        resident_st_release_u32(&scan[1 + 2 * b], 1u);
        s_prefix = prefix;
        if (b == gridDim.x * gridDim.y * gridDim.z - 1u) *out_count = prefix + sum;
    }
    __syncthreads();
    if (produced) out[s_prefix + s_warp_base[warp] + __popc(mask & ((1u << lane) - 1u))] = o;
}
