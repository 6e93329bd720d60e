// A driver probe for scripts/gpu-run-2.sh (not part of the build): what the CUDA driver does
// with (a) many streams each running a never-ending kernel (are streams beyond
// CUDA_DEVICE_MAX_CONNECTIONS serialised behind earlier ones?) and (b) a sticky fault (can a
// primary-context reset give a usable context in the same process?). One JSON line per finding.
#include <cuda.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

static std::string ptx;
static const char* name(CUresult r) { const char* s = nullptr; cuGetErrorName(r, &s); return s ? s : "?"; }
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { printf("{\"fatal\":\"%s\",\"at\":%d}\n", name(r_), __LINE__); return 1; } } while (0)

static double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

static int streams(int n) {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction spin, mark;
    CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, ptx.c_str()));
    CK(cuModuleGetFunction(&spin, mod, "spin")); CK(cuModuleGetFunction(&mark, mod, "mark"));
    unsigned int* h; CUdeviceptr d;
    CK(cuMemHostAlloc((void**)&h, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    memset(h, 0, 4096); CK(cuMemHostGetDevicePointer(&d, h, 0));
    volatile unsigned int* started = h; volatile unsigned int* stop = h + 512; volatile unsigned int* flag = h + 600;
    std::vector<CUstream> s(n + 2);
    // Whether creating a stream waits for the spinners already running (they end themselves
    // after 3 s): every create over 50 ms, with its index, goes into the JSON line.
    std::string slow; int slow_n = 0; double create_max = 0;
    for (int i = 0; i < n; ++i) {
        auto tc = std::chrono::steady_clock::now();
        CK(cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING));
        double cm = ms_since(tc);
        create_max = std::max(create_max, cm);
        if (cm > 50) { slow += (slow.empty() ? "" : ",") + std::to_string(i) + ":" + std::to_string((int)cm); ++slow_n; }
        CUdeviceptr a = d, b = d + 512 * 4; unsigned int idx = i;
        void* args[] = {&a, &b, &idx};
        auto tl = std::chrono::steady_clock::now();
        CK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, s[i], args, nullptr));
        double lm = ms_since(tl);
        if (lm > 50) fprintf(stderr, "launch %d took %.1f ms\n", i, lm);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::string bits; int count = 0;
    for (int i = 0; i < n; ++i) { bits += started[i] ? '1' : '0'; count += started[i] ? 1 : 0; }
    // A one-shot kernel on a new stream while they spin.
    CK(cuStreamCreate(&s[n], CU_STREAM_NON_BLOCKING));
    CUdeviceptr f = d + 600 * 4; void* margs[] = {&f};
    auto t = std::chrono::steady_clock::now();
    CK(cuLaunchKernel(mark, 1, 1, 1, 32, 1, 1, 0, s[n], margs, nullptr));
    while (!*flag && ms_since(t) < 500) {}
    double oneshot = *flag ? ms_since(t) : -1;
    const char* env = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    printf("{\"probe\":\"streams\",\"CUDA_DEVICE_MAX_CONNECTIONS\":\"%s\",\"streams\":%d,\"started_after_300ms\":%d,"
           "\"bitmap\":\"%s\",\"oneshot_on_stream_%d_ms\":%.3f,\"create_max_ms\":%.3f,\"slow_creates\":%d,"
           "\"slow_at_ms\":\"%s\"}\n", env ? env : "unset", n, count, bits.c_str(), n + 1, oneshot, create_max, slow_n,
           slow.c_str());
    fflush(stdout);
    *stop = 1;
    t = std::chrono::steady_clock::now();
    CUresult r = cuCtxSynchronize();
    printf("{\"probe\":\"streams-end\",\"sync\":\"%s\",\"ms\":%.1f}\n", name(r), ms_since(t));
    return 0;
}

static int sticky(int how) {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction trap, mark;
    CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, ptx.c_str()));
    CK(cuModuleGetFunction(&trap, mod, "trap_now"));
    CUstream st; CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CK(cuLaunchKernel(trap, 1, 1, 1, 32, 1, 1, 0, st, nullptr, nullptr));
    CUresult r1 = cuStreamSynchronize(st);
    CUresult r2 = cuCtxSynchronize();
    CUcontext ctx2 = nullptr;
    CUresult rr = CUDA_SUCCESS, rel = CUDA_SUCCESS;
    if (how == 0) {           // reset while this retain is held, then retain again
        rr = cuDevicePrimaryCtxReset(dev);
    } else {                  // release to zero, then retain
        rel = cuDevicePrimaryCtxRelease(dev);
    }
    CUresult rt = cuDevicePrimaryCtxRetain(&ctx2, dev);
    CUresult rs = ctx2 ? cuCtxSetCurrent(ctx2) : CUDA_ERROR_INVALID_CONTEXT;
    CUmodule mod2 = nullptr; CUresult rm = cuModuleLoadData(&mod2, ptx.c_str());
    CUresult rl = CUDA_ERROR_NOT_FOUND, rsync = CUDA_ERROR_NOT_FOUND, rmem = CUDA_ERROR_NOT_FOUND;
    if (rm == CUDA_SUCCESS) {
        cuModuleGetFunction(&mark, mod2, "mark");
        CUdeviceptr p; rmem = cuMemAlloc(&p, 64);
        if (rmem == CUDA_SUCCESS) {
            void* a[] = {&p};
            rl = cuLaunchKernel(mark, 1, 1, 1, 32, 1, 1, 0, 0, a, nullptr);
            rsync = cuCtxSynchronize();
        }
    }
    printf("{\"probe\":\"sticky\",\"how\":\"%s\",\"stream_sync\":\"%s\",\"ctx_sync\":\"%s\",\"reset\":\"%s\",\"release\":\"%s\","
           "\"retain\":\"%s\",\"same_handle\":%s,\"set_current\":\"%s\",\"module_load\":\"%s\",\"alloc\":\"%s\",\"launch\":\"%s\",\"sync_after\":\"%s\"}\n",
           how == 0 ? "reset-while-retained" : "release-to-zero-then-retain", name(r1), name(r2), name(rr), name(rel), name(rt),
           ctx2 == ctx ? "true" : "false", name(rs), name(rm), name(rmem), name(rl), name(rsync));
    return 0;
}


static int pingpong(unsigned int mode, unsigned int sleep_ns) {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction pp;
    CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, ptx.c_str()));
    CK(cuModuleGetFunction(&pp, mod, "pingpong"));
    unsigned long long* h; CUdeviceptr d;
    CK(cuMemHostAlloc((void**)&h, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    memset(h, 0, 4096); CK(cuMemHostGetDevicePointer(&d, h, 0));
    volatile unsigned long long* in = h; volatile unsigned long long* out = h + 256;
    const unsigned int n = 20000;
    CUstream st; CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CUdeviceptr a = d, b = d + 256 * 8; unsigned int nn = n, m = mode, sl = sleep_ns;
    void* args[] = {&a, &b, &nn, &m, &sl};
    CK(cuLaunchKernel(pp, 1, 1, 1, 32, 1, 1, 0, st, args, nullptr));
    std::vector<double> us; us.reserve(n);
    for (unsigned long long i = 1; i <= n; ++i) {
        auto t = std::chrono::steady_clock::now();
        for (int k = 0; k < 8; ++k) in[16 + k] = i;
        __atomic_store_n((unsigned long long*)in, i, __ATOMIC_RELEASE);
        bool ok = false;
        while (ms_since(t) < 1000) { if (__atomic_load_n((unsigned long long*)out, __ATOMIC_ACQUIRE) >= i) { ok = true; break; } }
        if (!ok) { printf("{\"probe\":\"pingpong\",\"error\":\"no answer to %llu\"}\n", i); break; }
        us.push_back(ms_since(t) * 1000.0);
    }
    CUresult r = cuCtxSynchronize();
    std::sort(us.begin() + (us.size() > 1000 ? 1000 : 0), us.end());
    size_t base = us.size() > 1000 ? 1000 : 0, cnt = us.size() - base;
    auto q = [&](double f) { return cnt ? us[base + (size_t)(f * (cnt - 1))] : -1.0; };
    printf("{\"probe\":\"pingpong\",\"mode\":\"%s\",\"sleep_ns\":%u,\"samples\":%zu,\"p50_us\":%.3f,\"p99_us\":%.3f,\"p999_us\":%.3f,\"min_us\":%.3f,\"sync\":\"%s\"}\n",
           mode == 0 ? "one-read (sequence word is the message)" : "index-then-slot (two dependent reads)", sleep_ns, cnt,
           q(0.5), q(0.99), q(0.999), cnt ? us[base] : -1.0, name(r));
    fflush(stdout);
    return 0;
}

// Zero-copy read bandwidth by grid size (is one block's read of host memory the ring's volume
// limit?), beside the same kernel on device memory and cuMemcpyHtoD (the copy engine).
static int zcread() {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction k;
    CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, ptx.c_str()));
    CK(cuModuleGetFunction(&k, mod, "zcread"));
    const size_t big = 64u << 20;
    void* h; CUdeviceptr dh, dd, sink;
    CK(cuMemHostAlloc(&h, big, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    memset(h, 1, big); CK(cuMemHostGetDevicePointer(&dh, h, 0));
    CK(cuMemAlloc(&dd, big)); CK(cuMemAlloc(&sink, 64));
    CK(cuMemcpyHtoD(dd, h, big));
    CUstream st; CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CUevent e0, e1; CK(cuEventCreate(&e0, 0)); CK(cuEventCreate(&e1, 0));
    auto timed = [&](auto&& launch) -> double {  // median of 5 after a warm-up, ms
        std::vector<double> v;
        for (int r = 0; r < 6; ++r) {
            cuEventRecord(e0, st); launch(); cuEventRecord(e1, st); cuEventSynchronize(e1);
            float ms = 0; cuEventElapsedTime(&ms, e0, e1);
            if (r) v.push_back(ms);
        }
        std::sort(v.begin(), v.end()); return v[v.size() / 2];
    };
    const size_t sizes[] = {786432, big};  // a 4096-message batch of 64-byte LL slots; 64 MiB
    const unsigned int grids[] = {1, 2, 4, 8, 16, 33, 66, 132};
    for (size_t bytes : sizes) {
        for (int where = 0; where < 2; ++where) {
            for (unsigned int g : grids) {
                if (where == 1 && g != 1 && g != 132) continue;
                CUdeviceptr src = where == 0 ? dh : dd; unsigned long long n16 = bytes / 16;
                void* args[] = {&src, &n16, &sink};
                double ms = timed([&] { cuLaunchKernel(k, g, 1, 1, 1024, 1, 1, 0, st, args, nullptr); });
                printf("{\"probe\":\"zcread\",\"memory\":\"%s\",\"bytes\":%zu,\"blocks\":%u,\"threads\":1024,\"ms\":%.4f,\"GBps\":%.2f}\n",
                       where == 0 ? "host (mapped, zero-copy)" : "device", bytes, g, ms, bytes / ms / 1e6);
            }
        }
        double ms = timed([&] { cuMemcpyHtoDAsync(dd, h, bytes, st); });
        printf("{\"probe\":\"zcread\",\"memory\":\"cuMemcpyHtoDAsync from pinned\",\"bytes\":%zu,\"ms\":%.4f,\"GBps\":%.2f}\n",
               bytes, ms, bytes / ms / 1e6);
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 3) { fprintf(stderr, "probe PTX streams N | probe PTX sticky 0|1\n"); return 2; }
    FILE* f = fopen(argv[1], "rb"); if (!f) { perror("ptx"); return 2; }
    char buf[65536]; size_t n; while ((n = fread(buf, 1, sizeof buf, f)) > 0) ptx.append(buf, n); fclose(f);
    if (cuInit(0) != CUDA_SUCCESS) { printf("{\"fatal\":\"cuInit\"}\n"); return 1; }
    if (!strcmp(argv[2], "streams")) return streams(argc > 3 ? atoi(argv[3]) : 40);
    if (!strcmp(argv[2], "sticky")) return sticky(argc > 3 ? atoi(argv[3]) : 0);
    if (!strcmp(argv[2], "zcread")) return zcread();
    if (!strcmp(argv[2], "pingpong")) return pingpong(argc > 3 ? atoi(argv[3]) : 0, argc > 4 ? atoi(argv[4]) : 0);
    return 2;
}
