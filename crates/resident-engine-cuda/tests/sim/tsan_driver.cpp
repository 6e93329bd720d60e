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
//
// With DRV_BULK defined (tests/sim_tsan.rs prepends it), the lanes also have bulk paths
// (resident_cuda::persistent::bulk) and the producer sends runs: a run of 16 or more goes to the
// lane's staging ring and a copy-engine thread copies it into the lane's device ring and then
// stores the lane's bulk tail with a release store, as the copy stream's memory operation does;
// shorter runs go to the LL lane. One path per lane at a time, as the host does: a bulk run
// waits for the lane's LL head to cover its LL tail, a short run follows the lane's bulk messages
// onto the bulk path.

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>

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

#ifdef DRV_BULK
// Runs this long or longer take the bulk path (1: every message, as RESIDENT_BULK_LANE=on).
#ifndef DRV_BULK_THRESHOLD
#define DRV_BULK_THRESHOLD 16
#endif
// The copy engine: jobs in order, each a copy of `n` slots (at most two ranges, the ring may
// wrap) and then the release store of a lane's bulk tail.
struct CopyJob {
    const unsigned char* src[2];
    unsigned char* dst[2];
    size_t len[2];
    unsigned long long* tail;
    unsigned long long value;
};
struct CopyEngine {
    std::mutex m;
    std::condition_variable cv;
    std::deque<CopyJob> q;
    bool stop = false;
    void submit(const CopyJob& j) {
        std::lock_guard<std::mutex> g(m);
        q.push_back(j);
        cv.notify_one();
    }
    void run() {
        for (;;) {
            CopyJob j;
            {
                std::unique_lock<std::mutex> g(m);
                cv.wait(g, [&] { return stop || !q.empty(); });
                if (q.empty()) return;
                j = q.front();
                q.pop_front();
            }
            for (int k = 0; k < 2; ++k)
                if (j.len[k] != 0) std::memcpy(j.dst[k], j.src[k], j.len[k]);
            store_rel(j.tail, j.value);
        }
    }
};
#endif

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
#ifdef DRV_BULK
    // Device rings and staging rings (plain slots), the heads line (device-written) and the
    // tails line (written by the copy engine).
    unsigned char* dev_ring[LANES];
    unsigned char* staging[LANES];
    for (unsigned l = 0; l < LANES; ++l) {
        dev_ring[l] = (unsigned char*)std::aligned_alloc(128, sizeof(InSlot) * LANE_CAP);
        staging[l] = (unsigned char*)std::aligned_alloc(128, sizeof(InSlot) * LANE_CAP);
        std::memset(dev_ring[l], 0, sizeof(InSlot) * LANE_CAP);
        std::memset(staging[l], 0, sizeof(InSlot) * LANE_CAP);
        p.bulk_slots[l] = (unsigned long long)dev_ring[l];
    }
    unsigned long long* bulk_heads = (unsigned long long*)std::aligned_alloc(128, 128);
    unsigned long long* bulk_tails = (unsigned long long*)std::aligned_alloc(128, 128);
    std::memset(bulk_heads, 0, 128);
    std::memset(bulk_tails, 0, 128);
    p.bulk_heads = (unsigned long long)bulk_heads;
    p.bulk_tails = (unsigned long long)bulk_tails;
    CopyEngine engine;
    std::thread copier([&] { engine.run(); });
    unsigned long long bulk_sent = 0;
#endif

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
        // One message on lane l's LL path: room from an acquire of the device's head (its reads
        // of the old slot happened before), the slot, then the tail with a release store.
        auto ll_send = [&](unsigned l, unsigned long long id, unsigned char prio, unsigned long long dl2) {
            Ring& r = lanes[l];
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
        };
#ifdef DRV_BULK
        unsigned long long btails[LANES] = {0, 0, 0, 0};
        unsigned long long id = 1;
        while (id <= N) {
            const unsigned long long h = id * 2654435761ull;
            unsigned char prio = (unsigned char)(h >> 8);
            unsigned l = (unsigned)prio * LANES >> 8;
            unsigned long long len = 1 + (h >> 20) % 40;
            if (id + len > N + 1) len = N + 1 - id;
            Ring& r = lanes[l];
            unsigned long long dl2 = deadline_ns(120);
            const bool bulk_pending = btails[l] != load_acq(&bulk_heads[l]);
            if (len >= DRV_BULK_THRESHOLD || bulk_pending) {
                // The bulk path: the LL path drained first (its head covers its tail), room in
                // the ring, the staging slots written, then one job.
                while (load_acq(&r.hdr->head) != tails[l] || btails[l] + len - load_acq(&bulk_heads[l]) > LANE_CAP) {
                    if (resident_sim::now_ns() > dl2) fail("bulk lane never drained", l, btails[l]);
                    std::this_thread::yield();
                }
                for (unsigned long long k = 0; k < len; ++k) {
                    InSlot s{};
                    s.env.message_id = id + k;
                    s.env.priority = prio;
                    s.env.timestamp_ns = (id + k) * 10;
                    s.payload = (ResidentIn)(id + k);
                    std::memcpy(staging[l] + sizeof(InSlot) * ((btails[l] + k) & (LANE_CAP - 1)), &s, sizeof s);
                }
                CopyJob j{};
                const unsigned long long first = btails[l] & (LANE_CAP - 1);
                const unsigned long long until_wrap = LANE_CAP - first < len ? LANE_CAP - first : len;
                j.src[0] = staging[l] + sizeof(InSlot) * first;
                j.dst[0] = dev_ring[l] + sizeof(InSlot) * first;
                j.len[0] = sizeof(InSlot) * until_wrap;
                j.src[1] = staging[l];
                j.dst[1] = dev_ring[l];
                j.len[1] = sizeof(InSlot) * (len - until_wrap);
                btails[l] += len;
                j.tail = &bulk_tails[l];
                j.value = btails[l];
                engine.submit(j);
                bulk_sent += len;
                id += len;
                continue;
            }
            for (unsigned long long k = 0; k < len; ++k, ++id) ll_send(l, id, prio, dl2);
        }
#else
        for (unsigned long long id = 1; id <= N; ++id) {
            unsigned char prio = (unsigned char)((id * 2654435761ull) >> 8);
            ll_send((unsigned)prio * LANES >> 8, id, prio, deadline_ns(120));
        }
#endif
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
#ifdef DRV_BULK
    {
        std::lock_guard<std::mutex> g(engine.m);
        engine.stop = true;
        engine.cv.notify_one();
    }
    copier.join();
#if DRV_BULK_THRESHOLD == 1
    if (bulk_sent != N) fail("every message must take the bulk path", bulk_sent, N);
#else
    if (bulk_sent == 0 || bulk_sent == N) fail("both paths must carry messages", bulk_sent, N);
#endif
    std::printf("bulk path: %llu of %llu messages\n", bulk_sent, N);
#endif
    std::printf("ok: %llu messages, %llu batches, batch size %d\n", N,
                std::atomic_ref<unsigned long long>(ctl->batches).load(), RESIDENT_BATCH);
    return 0;
}
