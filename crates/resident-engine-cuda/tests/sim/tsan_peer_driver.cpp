// ThreadSanitizer driver for device-side forwarding (appended to a CudaSim translation unit:
// shim + generated prelude + handler + template; see tests/sim_tsan.rs).
//
// One block of the persistent kernel, C (the consumer), and a producer P played by a host thread
// exactly as a producing kernel writes its output ring (slot stores, then a release store of the
// tail after an acquire load of the head for room; two blocks of one CudaSim module would share
// their `__shared__` variables, so the producing kernel's side, unchanged by forwarding, is
// played by the host). C's control block names P's output ring in its peer-input slot for a
// while (link), then the host takes the ring back (unlink: a new peer_seq with no ring, then it
// waits for C's acknowledgement) and pops it itself for a while, and links again, over and over,
// as resident's PeerInput does. Every 97th message is a `call` (FLAG_CALL): C must stop at its
// reply (peer_call_seen) and leave it to the host. Another host thread consumes C's output ring.
//
// Checks: every message exactly once, either handled twice (by P then C, on the device) or
// popped by the host after P; call replies only by the host; FIFO on both paths; the device
// counters (peer_taken) agree. Any data race on the ring handoff is reported by TSan.
//
// The handler is expected to compute out = in * 2 + 1 and count messages in state->n.

#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace drv {

constexpr unsigned LANE_CAP = 64;
constexpr unsigned pow2_at_least(unsigned n) { unsigned p = 1; while (p < n) p *= 2; return p; }
constexpr unsigned OUT_CAP = pow2_at_least(RESIDENT_BATCH);

template <typename T>
T load_acq(T* p) { return std::atomic_ref<T>(*p).load(std::memory_order_acquire); }
template <typename T>
void store_rel(T* p, T v) { std::atomic_ref<T>(*p).store(v, std::memory_order_release); }
template <typename T>
void store_rlx(T* p, T v) { std::atomic_ref<T>(*p).store(v, std::memory_order_relaxed); }

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

// An input lane in the LL format (the template's "input lanes"): 2 * sizeof(InSlot) bytes a slot.
Ring make_lane(unsigned cap) { return make_ring<InSlot[2]>(cap); }

unsigned long long deadline_ns(unsigned long long s) { return resident_sim::now_ns() + s * 1000000000ull; }

struct Block {
    ControlBlock* ctl;
    Ring lane;
    Ring out;
    ResidentState* state;
    PersistentParams p{};
    std::thread thread;
    std::atomic<int> rc{-1};

    void start() {
        ctl = (ControlBlock*)std::aligned_alloc(128, sizeof(ControlBlock));
        std::memset((void*)ctl, 0, sizeof(ControlBlock));
        lane = make_lane(LANE_CAP);
        out = make_ring<OutSlot>(OUT_CAP);
        state = (ResidentState*)std::aligned_alloc(128, 128);
        std::memset((void*)state, 0, 128);
        p.lanes[0] = (unsigned long long)lane.hdr;
        p.out = (unsigned long long)out.hdr;
        p.control = (unsigned long long)ctl;
        p.state = (unsigned long long)state;
        p.lane_count = 1;
        p.lane_capacity = LANE_CAP;
        p.out_capacity = OUT_CAP;
        p.max_backoff_ns = 20000;
        p.control_poll_ns = 50000;
        store_rel(&ctl->heartbeat_timeout_ns, 0ull);
        store_rel(&ctl->heartbeat, 1ull);
        thread = std::thread([this] {
            resident_sim::Dims d{{1, 1, 1}, {RESIDENT_BATCH, 1, 1}};
            void* args[1] = {&p};
            unsigned long long sizes[1] = {sizeof(PersistentParams)};
            char err[256] = {0};
            rc.store(resident_sim::launch(&resident_persistent, &d, args, sizes, 1, err, sizeof err));
            if (rc.load() != 0) std::fprintf(stderr, "launch: %s\n", err);
        });
        unsigned long long dl = deadline_ns(60);
        while (load_acq(&ctl->device_state) == 0u) {
            if (resident_sim::now_ns() > dl) fail("kernel never became resident");
            std::this_thread::yield();
        }
        store_rel(&ctl->run_state, RESIDENT_RUN_ACTIVE);
    }
};

}  // namespace drv

int main() {
    using namespace drv;
    const unsigned long long N = 20000;
    Block C;
    C.start();
    struct {
        Ring out;
    } P{make_ring<OutSlot>(64)};
    static_assert(sizeof(OutSlot) == sizeof(InSlot), "the handler maps U64 to U64");

    // P's outputs, as P's kernel writes them: ids 1..=N (the reply envelope of request `id`),
    // payload id * 2 + 1, every 97th the reply of a call.
    std::thread producer([&] {
        unsigned long long tail = 0;
        for (unsigned long long id = 1; id <= N; ++id) {
            unsigned long long dl2 = deadline_ns(120);
            // Acquire: pairs with the release of the head by whoever consumes (C or the host).
            while (tail - load_acq(&P.out.hdr->head) >= P.out.cap) {
                if (resident_sim::now_ns() > dl2) fail("P's output ring never drained", tail);
                std::this_thread::yield();
            }
            OutSlot s{};
            s.env.message_id = id;
            s.env.correlation_id = id;
            s.env.timestamp_ns = id * 10;
            s.env.flags = id % 97 == 0 ? 1 : 0;
            s.payload = (ResidentOut)(id * 2 + 1);
            std::memcpy(P.out.slots + sizeof(OutSlot) * (tail & (P.out.cap - 1)), &s, sizeof s);
            store_rel(&P.out.hdr->tail, ++tail);
        }
    });

    // Consumes C's outputs: messages forwarded on the device, handled twice.
    std::atomic<unsigned long long> device_count{0};
    std::vector<unsigned char> seen(N + 1, 0);
    std::mutex seen_mu;
    std::atomic<bool> done{false};
    std::thread c_consumer([&] {
        unsigned long long head = 0, last = 0;
        while (!done.load(std::memory_order_acquire)) {
            unsigned long long tail = load_acq(&C.out.hdr->tail);
            if (tail == head) {
                std::this_thread::yield();
                continue;
            }
            for (; head < tail; ++head) {
                OutSlot s;
                std::memcpy(&s, C.out.slots + sizeof(OutSlot) * (head & (C.out.cap - 1)), sizeof s);
                unsigned long long id = s.env.correlation_id;
                if (id == 0 || id > N) fail("C: bad id", id);
                if (id % 97 == 0) fail("C handled a call reply", id);
                if (s.payload != (ResidentOut)((id * 2 + 1) * 2 + 1)) fail("C: bad payload", id);
                if (id <= last) fail("C: out of order", last, id);
                last = id;
                std::lock_guard<std::mutex> g(seen_mu);
                if (seen[id]++) fail("twice (C)", id);
            }
            store_rel(&C.out.hdr->head, head);
            device_count.store(head);
        }
    });

    // The link manager and the host's own pops of P's output ring while it owns it.
    unsigned int seq = 0;
    unsigned long long host_count = 0, host_last = 0, links = 0, call_stops = 0;
    auto link = [&] {
        store_rlx(&C.ctl->peer_ring, (unsigned long long)P.out.hdr);
        store_rlx(&C.ctl->peer_capacity, P.out.cap);
        // Release: after the host's last release of P's output head.
        store_rel(&C.ctl->peer_seq, ++seq);
        ++links;
    };
    auto unlink = [&] {
        store_rlx(&C.ctl->peer_ring, 0ull);
        store_rlx(&C.ctl->peer_capacity, 0u);
        store_rel(&C.ctl->peer_seq, ++seq);
        unsigned long long dl3 = deadline_ns(60);
        // Acquire: pairs with C's release of the ack after its last head store.
        while (load_acq(&C.ctl->peer_ack) != seq) {
            if (resident_sim::now_ns() > dl3) fail("unlink never acknowledged", seq);
            std::this_thread::yield();
        }
    };
    auto host_pop = [&](unsigned long long for_ns) {
        unsigned long long until = resident_sim::now_ns() + for_ns;
        // The head as C left it (acquire: C's release store of it precedes its ack).
        unsigned long long head = load_acq(&P.out.hdr->head);
        do {
            unsigned long long tail = load_acq(&P.out.hdr->tail);
            for (; head < tail; ++head) {
                OutSlot s;
                std::memcpy(&s, P.out.slots + sizeof(OutSlot) * (head & (P.out.cap - 1)), sizeof s);
                unsigned long long id = s.env.correlation_id;
                if (id == 0 || id > N) fail("host: bad id", id);
                if (s.payload != (ResidentOut)(id * 2 + 1)) fail("host: bad payload", id);
                if (((s.env.flags & 1) != 0) != (id % 97 == 0)) fail("host: call flag", id);
                if (id <= host_last) fail("host: out of order", host_last, id);
                host_last = id;
                ++host_count;
                std::lock_guard<std::mutex> g(seen_mu);
                if (seen[id]++) fail("twice (host)", id);
            }
            store_rel(&P.out.hdr->head, head);
            std::this_thread::yield();
        } while (resident_sim::now_ns() < until);
    };

    unsigned long long dl = deadline_ns(400);
    for (unsigned round = 0;; ++round) {
        {
            std::lock_guard<std::mutex> g(seen_mu);
            unsigned long long total = 0;
            for (unsigned long long i = 1; i <= N; ++i) total += seen[i];
            if (total == N) break;
        }
        if (resident_sim::now_ns() > dl) fail("timed out", host_count, device_count.load());
        link();
        // Linked for a while, or until C stops at a call reply. A block of RESIDENT_BATCH OS
        // threads under TSan takes milliseconds per barrier, and C adopts a link only between
        // batches: the window grows with the block, so that C works through a good part of the
        // ring (and so meets call replies) in each link, not one batch at most.
        const unsigned long long scale = RESIDENT_BATCH / 32 > 0 ? RESIDENT_BATCH / 32 : 1;
        unsigned long long until = resident_sim::now_ns() + (1 + round % 5) * 1000000ull * scale;
        while (resident_sim::now_ns() < until && load_acq(&C.ctl->peer_call_seen) != seq)
            std::this_thread::yield();
        if (load_acq(&C.ctl->peer_call_seen) == seq) ++call_stops;
        unlink();
        // Until C has stopped at a call reply once, the host leaves the ring to C (it pops
        // nothing, so C must come to a reply: every 97th message is one), and the stop path is
        // exercised in every run whatever the scheduling; from then on both share the ring.
        if (call_stops > 0) host_pop((round % 3) * 300000ull);
    }
    producer.join();
    done.store(true, std::memory_order_release);
    c_consumer.join();

    store_rel(&C.ctl->run_state, RESIDENT_RUN_TERMINATE);
    C.thread.join();
    if (C.rc.load() != 0) fail("launch failed", (unsigned long long)C.rc.load());
    unsigned long long taken = std::atomic_ref<unsigned long long>(C.ctl->peer_taken).load(std::memory_order_relaxed);
    unsigned long long c_processed = std::atomic_ref<unsigned long long>(C.ctl->processed).load(std::memory_order_relaxed);
    if (taken + host_count != N) fail("peer_taken + host pops", taken + host_count, N);
    if (c_processed != taken) fail("C processed", c_processed, taken);
    if (taken == 0 || host_count < N / 97) fail("both paths used", taken, host_count);
    if (call_stops == 0) fail("C never stopped at a call reply");
    std::printf("ok: %llu messages, %llu on the device, %llu by the host, %llu links, %llu call stops, batch size %d\n",
                N, taken, host_count, links, call_stops, RESIDENT_BATCH);
    return 0;
}
