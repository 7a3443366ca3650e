#include "attnkit/ops/bf16_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

// A shape as cuBLASLt's choice of algorithm sees it.
struct PlanKey {
  std::int64_t m = 0, n = 0, k = 0, ldx = 0, ldy = 0;
  std::uint32_t align_x = 0, align_w = 0, align_y = 0, align_bias = 0;
  bool bias = false;
  bool operator==(const PlanKey&) const = default;
};

// The descriptors and algorithm of one shape, initialised in place (cuBLASLt's *Init calls write
// into caller memory: nothing is allocated per plan).
struct Plan {
  PlanKey key;
  bool valid = false;
  std::uint64_t last_used = 0;
  cublasLtMatmulDescOpaque_t desc{};
  cublasLtMatrixLayoutOpaque_t w_layout{}, x_layout{}, y_layout{};
  cublasLtMatmulAlgo_t algo{};
};

// Slots probed from a shape's hash: its plan lives in one of them.
constexpr std::size_t kProbe = 8;

void check(cublasStatus_t status, const char* call) {
  ATTNKIT_REQUIRE(status == CUBLAS_STATUS_SUCCESS, "linear", std::string(call) + ": " + cublasLtGetStatusName(status),
                  "CUBLAS_STATUS_SUCCESS", cublasLtGetStatusString(status));
}

// The largest power of two up to 256 that divides the address (what cuBLASLt's alignment
// preferences take).
std::uint32_t alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h;
}

std::size_t hash_of(const PlanKey& key) {
  std::uint64_t h = 0;
  for (const std::uint64_t v :
       {static_cast<std::uint64_t>(key.m), static_cast<std::uint64_t>(key.n), static_cast<std::uint64_t>(key.k),
        static_cast<std::uint64_t>(key.ldx), static_cast<std::uint64_t>(key.ldy),
        (static_cast<std::uint64_t>(key.align_x) << 32) | key.align_w,
        (static_cast<std::uint64_t>(key.align_y) << 32) | key.align_bias, static_cast<std::uint64_t>(key.bias)}) {
    h = mix(h, v);
  }
  return static_cast<std::size_t>(h);
}

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  check(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), "cublasLtMatmulDescSetAttribute");
}

template <class T>
void set_preference(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
  check(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)),
        "cublasLtMatmulPreferenceSetAttribute");
}

}  // namespace

struct Bf16Gemm::Impl {
  explicit Impl(MemoryResource& device_memory) : workspace(device_memory, kWorkspaceBytes), plans(kPlanSlots) {
    check(cublasLtCreate(&handle), "cublasLtCreate");
  }
  ~Impl() { (void)cublasLtDestroy(handle); }

  Plan& plan_for(const PlanKey& key, const void* bias);
  void build(Plan& plan, const PlanKey& key, const void* bias);

  cublasLtHandle_t handle = nullptr;
  DeviceArray<unsigned char> workspace;
  std::vector<Plan> plans;  // kPlanSlots entries, never resized
  std::uint64_t clock = 0;
};

// The plan of `key`: a hit among its probe slots, else built into a free slot or in place of the
// least recently used one there.
Plan& Bf16Gemm::Impl::plan_for(const PlanKey& key, const void* bias) {
  const std::size_t start = hash_of(key) % plans.size();
  Plan* victim = nullptr;
  for (std::size_t j = 0; j < kProbe; ++j) {
    Plan& slot = plans[(start + j) % plans.size()];
    if (slot.valid && slot.key == key) {
      slot.last_used = ++clock;
      return slot;
    }
    if (victim == nullptr || (victim->valid && (!slot.valid || slot.last_used < victim->last_used))) victim = &slot;
  }
  build(*victim, key, bias);
  victim->last_used = ++clock;
  return *victim;
}

// Column-major as cuBLASLt sees row-major data: y^T [n, m] = op_T(w as [k, n]) * x^T [k, m].
void Bf16Gemm::Impl::build(Plan& plan, const PlanKey& key, const void* bias) {
  plan.valid = false;
  check(cublasLtMatmulDescInit(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescInit");
  set_desc(&plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_desc(&plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  if (key.bias) {
    set_desc(&plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set_desc(&plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);  // the heuristic reads its alignment
  }
  check(cublasLtMatrixLayoutInit(&plan.w_layout, CUDA_R_16BF, static_cast<std::uint64_t>(key.k),
                                 static_cast<std::uint64_t>(key.n), key.k),
        "cublasLtMatrixLayoutInit");
  check(cublasLtMatrixLayoutInit(&plan.x_layout, CUDA_R_16BF, static_cast<std::uint64_t>(key.k),
                                 static_cast<std::uint64_t>(key.m), key.ldx),
        "cublasLtMatrixLayoutInit");
  check(cublasLtMatrixLayoutInit(&plan.y_layout, CUDA_R_16BF, static_cast<std::uint64_t>(key.n),
                                 static_cast<std::uint64_t>(key.m), key.ldy),
        "cublasLtMatrixLayoutInit");
  cublasLtMatmulPreferenceOpaque_t pref{};
  check(cublasLtMatmulPreferenceInit(&pref), "cublasLtMatmulPreferenceInit");
  set_preference(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(kWorkspaceBytes));
  set_preference(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_w);
  set_preference(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_x);
  set_preference(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_y);
  set_preference(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_y);
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  check(cublasLtMatmulAlgoGetHeuristic(handle, &plan.desc, &plan.w_layout, &plan.x_layout, &plan.y_layout,
                                       &plan.y_layout, &pref, 1, &result, &count),
        "cublasLtMatmulAlgoGetHeuristic");
  ATTNKIT_REQUIRE(count > 0 && result.state == CUBLAS_STATUS_SUCCESS, "linear",
                  "[" + std::to_string(key.m) + ", " + std::to_string(key.k) + "] x [" + std::to_string(key.n) + ", " +
                      std::to_string(key.k) + "]^T",
                  "a product cuBLASLt has a bf16 algorithm for", "cublasLtMatmulAlgoGetHeuristic returned none");
  plan.algo = result.algo;
  plan.key = key;
  plan.valid = true;
}

Bf16Gemm::Bf16Gemm(MemoryResource& device_memory) : impl_(std::make_unique<Impl>(device_memory)) {}
Bf16Gemm::~Bf16Gemm() = default;

void Bf16Gemm::run(const void* x, std::int64_t ldx, const void* w, const void* bias, void* y, std::int64_t ldy,
                   std::int64_t m, std::int64_t n, std::int64_t k, Stream stream) {
  PlanKey key;
  key.m = m;
  key.n = n;
  key.k = k;
  key.ldx = ldx;
  key.ldy = ldy;
  key.align_x = alignment(x);
  key.align_w = alignment(w);
  key.align_y = alignment(y);
  key.align_bias = bias != nullptr ? alignment(bias) : 0;
  key.bias = bias != nullptr;
  Plan& plan = impl_->plan_for(key, bias);
  if (bias != nullptr) set_desc(&plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasLtMatmul(impl_->handle, &plan.desc, &alpha, w, &plan.w_layout, x, &plan.x_layout, &beta, y,
                       &plan.y_layout, y, &plan.y_layout, &plan.algo, impl_->workspace.data(), kWorkspaceBytes,
                       static_cast<cudaStream_t>(stream.handle)),
        "cublasLtMatmul");
}

}  // namespace attnkit
