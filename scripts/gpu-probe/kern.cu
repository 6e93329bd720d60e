// Kernels of the driver probe (scripts/gpu-probe/probe.cpp); compiled to PTX on the GPU machine.
extern "C" __global__ void spin(volatile unsigned int* started, volatile unsigned int* stop, unsigned int i) {
    if (threadIdx.x != 0) return;
    started[i] = 1;
    __threadfence_system();
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        if (*stop) break;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > 3000000000ull) break;  // 3 s at most: the probe never hangs the machine
        __nanosleep(1000);
    }
}
extern "C" __global__ void mark(volatile unsigned int* flag) {
    if (threadIdx.x == 0) { *flag = 1; __threadfence_system(); }
}
extern "C" __global__ void trap_now() { asm volatile("trap;"); }

// Ping-pong floor: thread 0 polls host memory for sequence numbers and answers each.
// mode 0: the sequence word is the message (one dependent read per message);
// mode 1: poll a tail index, then read the 64-byte slot it publishes (two dependent reads);
// sleep_ns: __nanosleep between empty polls (0 = spin).
extern "C" __global__ void pingpong(const unsigned long long* in, unsigned long long* out, unsigned int n,
                                    unsigned int mode, unsigned int sleep_ns) {
    if (threadIdx.x != 0) return;
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (unsigned long long want = 1; want <= n; ++want) {
        unsigned long long v;
        for (;;) {
            asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(in) : "memory");
            if (v >= want) break;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            if (t - t0 > 5000000000ull) return;  // 5 s at most
            if (sleep_ns) __nanosleep(sleep_ns);
        }
        unsigned long long payload = v;
        if (mode == 1) {
            // the slot after the index: 8 words, read with relaxed system loads
            unsigned long long s = 0, w;
            for (int k = 0; k < 8; ++k) {
                asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(w) : "l"(in + 16 + k) : "memory");
                s += w;
            }
            payload = v + (s & 0);
        }
        asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(out), "l"(payload) : "memory");
    }
}

// Zero-copy read bandwidth: the grid reads n16 16-byte words of `src` (host memory mapped into
// the device, or device memory) with the ring template's loads (ld.relaxed.sys v2.u64), eight
// independent loads per thread in flight before any is used, as the template's LL copy does.
extern "C" __global__ void zcread(const unsigned long long* src, unsigned long long n16, unsigned long long* sink) {
    unsigned long long acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 7ull * stride < n16; i += 8ull * stride) {
        unsigned long long a[8], b[8];
#pragma unroll
        for (int k = 0; k < 8; ++k)
            asm volatile("ld.relaxed.sys.global.v2.u64 {%0,%1}, [%2];" : "=l"(a[k]), "=l"(b[k]) : "l"(src + 2ull * (i + k * stride)) : "memory");
#pragma unroll
        for (int k = 0; k < 8; ++k) acc += a[k] ^ b[k];
    }
    for (; i < n16; i += stride) {
        unsigned long long a, b;
        asm volatile("ld.relaxed.sys.global.v2.u64 {%0,%1}, [%2];" : "=l"(a), "=l"(b) : "l"(src + 2ull * i) : "memory");
        acc += a ^ b;
    }
    if (acc == 0x5eed5eed5eedull) sink[0] = acc;  // keeps the loads
}
