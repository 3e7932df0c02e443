// Host emulation of the CUDA features the kernels use: one std::thread per CUDA thread, a
// std::barrier for __syncthreads, `__shared__` as function-static storage (one block runs at a
// time, so it is shared exactly by the block's threads). For checking the kernels' logic on a
// machine without a GPU; it says nothing about performance or the memory model of a real GPU.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>
using std::exp; using std::fabs; using std::fmax; using std::fmin; using std::isfinite; using std::log;
using std::max; using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(x)
#define __shared__ static
struct Dim3 { unsigned x = 1, y = 1, z = 1; };
inline thread_local Dim3 threadIdx, blockIdx;
inline Dim3 blockDim, gridDim;
inline std::barrier<>* epi_barrier = nullptr;
inline void __syncthreads() { epi_barrier->arrive_and_wait(); }

// kernel<<<grid, block>>>(args...) as launch(grid, block, [&] { kernel(args...); }).
inline void launch(unsigned grid, unsigned block, const std::function<void()>& body) {
    gridDim.x = grid;
    blockDim.x = block;
    for (unsigned b = 0; b < grid; ++b) {
        std::barrier<> bar(block);
        epi_barrier = &bar;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < block; ++t) {
            ts.emplace_back([&, b, t] {
                blockIdx.x = b;
                threadIdx.x = t;
                body();
            });
        }
        for (auto& t : ts) t.join();
    }
}
