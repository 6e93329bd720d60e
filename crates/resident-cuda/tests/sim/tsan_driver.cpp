// ThreadSanitizer driver for the persistent ring kernel (appended to a CudaSim translation unit:
// shim + generated prelude + handler + template; see tests/sim_tsan.rs).
//
// It plays the host's half of the protocol exactly as PersistentQueues does it: producers write
// lane slots in the LL format with relaxed 8-byte atomic stores and publish the lane tail with a
// release store (after an acquire load of the head for room); the consumer loads the output tail with acquire, reads
// the slots with plain loads and publishes the head with release; the control block's host line
// is written with release stores. The kernel runs as one block of RESIDENT_BATCH threads.
// Checks: every message exactly once, FIFO per lane, correct payload, the device counters and the
// device state agree. Any data race is reported by TSan (the test fails on any report).
//
// The handler is expected to compute out = in * 2 + 1 and count messages in state->n.

#include <cstdlib>

namespace drv {

constexpr unsigned LANES = 4;
constexpr unsigned LANE_CAP = 64;    // small: producers wait on the device's head
constexpr unsigned pow2_at_least(unsigned n) { unsigned p = 1; while (p < n) p *= 2; return p; }
// Smallest legal output ring (a power of two holding a batch): the device waits on our head.
constexpr unsigned OUT_CAP = pow2_at_least(RESIDENT_BATCH);

template <typename T>
T load_acq(T* p) { return std::atomic_ref<T>(*p).load(std::memory_order_acquire); }
template <typename T>
void store_rel(T* p, T v) { std::atomic_ref<T>(*p).store(v, std::memory_order_release); }

[[noreturn]] void fail(const char* what, unsigned long long a = 0, unsigned long long b = 0) {
    std::fprintf(stderr, "DRIVER FAILURE: %s (%llu, %llu)\n", what, a, b);
    std::exit(3);
}

struct Ring {
    RingHeader* hdr;
    unsigned char* slots;
    unsigned cap;
};

template <typename S>
Ring make_ring(unsigned cap) {
    size_t bytes = sizeof(RingHeader) + sizeof(S) * cap;
    void* mem = std::aligned_alloc(128, (bytes + 127) / 128 * 128);
    std::memset(mem, 0, bytes);
    return Ring{(RingHeader*)mem, (unsigned char*)mem + sizeof(RingHeader), cap};
}

// An input lane in the LL format (the template's "input lanes"; resident_cuda::persistent::lane):
// a header, then 2 * sizeof(InSlot) bytes a slot.
Ring make_lane(unsigned cap) { return make_ring<InSlot[2]>(cap); }

// Writes slot `pos` of lane `r` as the host does: every 8 bytes a relaxed atomic store of 32
// data bits and the flag pos + 1 in the high 32 bits (the kernel may read the slot meanwhile).
void ll_write(Ring& r, unsigned long long pos, const InSlot& s) {
    unsigned long long w[sizeof(InSlot) / 8];
    std::memcpy(w, &s, sizeof s);
    unsigned long long* dst = (unsigned long long*)(r.slots + 2 * sizeof(InSlot) * (pos & (r.cap - 1)));
    const unsigned long long f = (unsigned long long)(unsigned int)(pos + 1) << 32;
    for (size_t g = 0; g < sizeof(InSlot) / 8; ++g) {
        std::atomic_ref<unsigned long long>(dst[2 * g]).store((w[g] & 0xffffffffull) | f, std::memory_order_relaxed);
        std::atomic_ref<unsigned long long>(dst[2 * g + 1]).store((w[g] >> 32) | f, std::memory_order_relaxed);
    }
}

unsigned long long deadline_ns(unsigned long long s) { return resident_sim::now_ns() + s * 1000000000ull; }

}  // namespace drv

int main() {
    using namespace drv;
    const unsigned long long N = 20000;
    ControlBlock* ctl = (ControlBlock*)std::aligned_alloc(128, sizeof(ControlBlock));
    std::memset((void*)ctl, 0, sizeof(ControlBlock));
    Ring lanes[LANES];
    for (unsigned l = 0; l < LANES; ++l) lanes[l] = make_lane(LANE_CAP);
    Ring out = make_ring<OutSlot>(OUT_CAP);
    ResidentState* state = (ResidentState*)std::aligned_alloc(128, 128);
    std::memset((void*)state, 0, 128);

    PersistentParams p{};
    for (unsigned l = 0; l < LANES; ++l) p.lanes[l] = (unsigned long long)lanes[l].hdr;
    p.out = (unsigned long long)out.hdr;
    p.control = (unsigned long long)ctl;
    p.state = (unsigned long long)state;
    p.lane_count = LANES;
    p.lane_capacity = LANE_CAP;
    p.out_capacity = OUT_CAP;
    p.max_backoff_ns = 20000;
    p.control_poll_ns = 100000;

    store_rel(&ctl->heartbeat_timeout_ns, 0ull);
    store_rel(&ctl->heartbeat, 1ull);

    std::atomic<int> rc{-1};
    std::thread device([&] {
        resident_sim::Dims d{{1, 1, 1}, {RESIDENT_BATCH, 1, 1}};
        void* args[1] = {&p};
        unsigned long long sizes[1] = {sizeof(PersistentParams)};
        char err[256] = {0};
        rc.store(resident_sim::launch(&resident_persistent, &d, args, sizes, 1, err, sizeof err));
        if (rc.load() != 0) std::fprintf(stderr, "launch: %s\n", err);
    });

    // `launch` returns once the kernel reports it is resident.
    unsigned long long dl = deadline_ns(60);
    while (load_acq(&ctl->device_state) == 0u) {  // 0 = not started yet
        if (resident_sim::now_ns() > dl) fail("kernel never became resident");
        std::this_thread::yield();
    }

    if (load_acq(&ctl->device_state) >= RESIDENT_DEV_TERMINATED)
        fail("kernel exited at start; error code", load_acq(&ctl->device_state), load_acq(&ctl->error_code));

    // Producer: ids 1..=N, priority cycles through the lanes; lane = priority * LANES >> 8.
    std::atomic<bool> stop_beats{false};
    std::thread beats([&] {
        unsigned long long hb = 1;
        while (!stop_beats.load(std::memory_order_relaxed)) {
            store_rel(&ctl->heartbeat, ++hb);
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
    });
    std::thread producer([&] {
        unsigned long long tails[LANES] = {0, 0, 0, 0};
        for (unsigned long long id = 1; id <= N; ++id) {
            unsigned char prio = (unsigned char)((id * 2654435761ull) >> 8);
            unsigned l = (unsigned)prio * LANES >> 8;
            Ring& r = lanes[l];
            unsigned long long dl2 = deadline_ns(120);
            // Room: acquire of the device's head (its reads of the old slot happened before).
            while (tails[l] - load_acq(&r.hdr->head) >= r.cap) {
                if (resident_sim::now_ns() > dl2) fail("lane never drained", l, tails[l]);
                std::this_thread::yield();
            }
            InSlot s{};
            s.env.message_id = id;
            s.env.priority = prio;
            s.env.timestamp_ns = id * 10;
            s.payload = (ResidentIn)id;
            ll_write(r, tails[l], s);
            store_rel(&r.hdr->tail, ++tails[l]);
        }
    });
    // The control line changes while messages flow: queued before activation, then active,
    // parked (the producer stalls on full lanes), active again.
    std::thread controller([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        store_rel(&ctl->run_state, RESIDENT_RUN_ACTIVE);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        store_rel(&ctl->run_state, RESIDENT_RUN_INACTIVE);
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        store_rel(&ctl->run_state, RESIDENT_RUN_ACTIVE);
    });

    // Consumer: exactly once, FIFO per lane, payload.
    unsigned long long head = 0, received = 0, sum = 0;
    unsigned long long last_in_lane[LANES] = {0, 0, 0, 0};
    dl = deadline_ns(300);
    while (received < N) {
        if (resident_sim::now_ns() > dl) fail("timed out receiving", received, N);
        unsigned long long tail = load_acq(&out.hdr->tail);
        if (tail == head) {
            std::this_thread::yield();
            continue;
        }
        for (; head < tail; ++head) {
            OutSlot s;
            std::memcpy(&s, out.slots + sizeof(OutSlot) * (head & (out.cap - 1)), sizeof s);
            unsigned long long id = s.env.correlation_id;
            if (id == 0 || id > N) fail("bad id", id);
            if (s.payload != (ResidentOut)(id * 2 + 1)) fail("bad payload", id, (unsigned long long)s.payload);
            if (s.env.timestamp_ns != id * 10) fail("bad timestamp", id);
            unsigned l = (unsigned)s.env.priority * LANES >> 8;
            if (id <= last_in_lane[l]) fail("lane out of order", l, id);
            last_in_lane[l] = id;
            sum += id;
            ++received;
        }
        store_rel(&out.hdr->head, head);
    }
    producer.join();
    controller.join();
    if (sum != N * (N + 1) / 2) fail("checksum", sum, N * (N + 1) / 2);

    // Terminate; the kernel's counters are final once device_state says so.
    store_rel(&ctl->run_state, RESIDENT_RUN_TERMINATE);
    device.join();
    stop_beats.store(true);
    beats.join();
    if (rc.load() != 0) fail("launch failed", (unsigned long long)rc.load());
    if (load_acq(&ctl->device_state) != RESIDENT_DEV_TERMINATED) fail("final state", load_acq(&ctl->device_state));
    unsigned long long processed = std::atomic_ref<unsigned long long>(ctl->processed).load(std::memory_order_relaxed);
    if (processed != N) fail("processed", processed, N);
    if (state->n != N) fail("state counter", (unsigned long long)state->n, N);
    if (load_acq(&out.hdr->tail) != N) fail("output tail", load_acq(&out.hdr->tail));
    std::printf("ok: %llu messages, %llu batches, batch size %d\n", N,
                std::atomic_ref<unsigned long long>(ctl->batches).load(), RESIDENT_BATCH);
    return 0;
}
