#pragma once
// Shared math compiles for the host and, under nvcc, for the device.
#if defined(__CUDACC__)
#define ATTNKIT_HD __host__ __device__ __forceinline__
#else
#define ATTNKIT_HD inline
#endif
