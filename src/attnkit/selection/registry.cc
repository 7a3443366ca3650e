#include "attnkit/selection/registry.h"

#include <algorithm>

#include "attnkit/backends/csr_plan/csr_plan_backend.h"
#include "attnkit/backends/gpu_reference/gpu_reference_backend.h"
#include "attnkit/backends/recurrent/recurrent_backend.h"
#include "attnkit/backends/reference/reference_backend.h"
#include "attnkit/backends/varlen/varlen_backend.h"
#if ATTNKIT_HAVE_CUDNN
#include "attnkit/backends/cudnn/cudnn_backend.h"
#endif
#if ATTNKIT_HAVE_FLASHINFER
#include "attnkit/backends/flashinfer/flashinfer_backend.h"
#endif
#include "attnkit/core/error.h"
#include "attnkit/selection/validate.h"

namespace attnkit {

namespace {

template <class T>
bool subset_of(const std::vector<T>& narrowed, const std::vector<T>& declared) {
  return std::all_of(narrowed.begin(), narrowed.end(), [&](const T& value) {
    return std::find(declared.begin(), declared.end(), value) != declared.end();
  });
}

// The first set of `v` that is not within its backend's, as "platforms cuda (any) where EXACT
// declares cpu"; empty when the variant only narrows.
std::string widened_set(const VariantCaps& v, const BackendCaps& caps) {
  const std::string within = " where " + std::string(caps.name) + " declares ";
  if (!subset_of(v.platforms, caps.platforms)) {
    return "platforms " +
           supported::platforms(v.platforms, v.cuda_compute_capability.value_or(caps.cuda_compute_capability)) +
           within + supported::platforms(caps);
  }
  if (v.cuda_compute_capability && (v.cuda_compute_capability->min < caps.cuda_compute_capability.min ||
                                    v.cuda_compute_capability->max > caps.cuda_compute_capability.max)) {
    return "compute capability " + v.cuda_compute_capability->describe() + within +
           caps.cuda_compute_capability.describe();
  }
  if (!subset_of(v.dtypes, caps.dtypes)) {
    return "dtypes " + supported::dtypes(v.dtypes) + within + supported::dtypes(caps.dtypes);
  }
  if (!subset_of(v.kv_cache_dtypes, caps.kv_cache_dtypes)) {
    return "KV dtypes " + supported::dtypes(v.kv_cache_dtypes) + within + supported::dtypes(caps.kv_cache_dtypes);
  }
  if (!subset_of(v.head_sizes, caps.head_sizes)) {
    return "head sizes " + supported::head_sizes(v.head_sizes) + within + supported::head_sizes(caps);
  }
  for (int b : v.block_sizes) {
    if (!caps.block_sizes.contains(b)) {
      return "block size " + std::to_string(b) + within + caps.block_sizes.describe();
    }
  }
  if (v.features && (v.features->bits() & ~caps.features.bits()) != 0) {
    return "features " + supported::features(*v.features) + within + supported::features(caps.features);
  }
  return {};
}

// Variants are dispatch handles, so their names and ids are unique within the backend; and they
// only narrow its sets, so validate() checks the backend's sets once for all of them.
void check_variants(const BackendCaps& caps) {
  const std::string backend(caps.name);
  ATTNKIT_REQUIRE(!caps.variants.empty(), "kernel variants", "none", "at least one",
                  backend + " declares no kernel variant, so nothing could run it");
  for (std::size_t i = 0; i < caps.variants.size(); ++i) {
    const KernelVariant v = caps.variants[i].variant;
    const std::string described = std::string(v.name) + " (id " + std::to_string(v.id) + ")";
    ATTNKIT_REQUIRE(!v.name.empty(), "kernel variant name", "\"\"", "a non-empty name", backend);
    for (std::size_t j = 0; j < i; ++j) {
      const KernelVariant earlier = caps.variants[j].variant;
      ATTNKIT_REQUIRE(earlier.name != v.name && earlier.id != v.id, "kernel variant", described,
                      "unique names and ids", backend + " declares two variants with this name or id");
    }
    const std::string widened = widened_set(caps.variants[i], caps);
    ATTNKIT_REQUIRE(widened.empty(), "kernel variant", described, "sets within " + backend + "'s",
                    "a variant may only narrow its backend's platforms, compute capabilities, dtypes, KV dtypes, "
                    "head sizes, block sizes and features; this one declares " + widened);
  }
}

}  // namespace

BackendRegistry::BackendRegistry(std::vector<BackendType> backends, std::vector<PriorityList> priorities)
    : backends_(std::move(backends)) {
  for (std::size_t i = 0; i < backends_.size(); ++i) {
    const std::string_view name = backends_[i].name();
    ATTNKIT_REQUIRE(!name.empty(), "backend name", "\"\"", "a non-empty name");
    for (std::size_t j = 0; j < i; ++j) {
      ATTNKIT_REQUIRE(backends_[j].name() != name, "backend name", std::string(name), "unique names",
              "two registered backends share this name");
    }
    check_variants(backends_[i].caps());
  }
  for (const PriorityList& list : priorities) {
    std::vector<std::size_t> order;
    for (std::string_view name : list.backends) {
      const BackendType* type = find(name);
      ATTNKIT_REQUIRE(type != nullptr, "priority list entry", std::string(name), names(),
              std::string("the ") + std::string(to_string(list.platform)) + " priority list names an unregistered backend");
      order.push_back(static_cast<std::size_t>(type - backends_.data()));
    }
    priorities_.emplace_back(list.platform, std::move(order));
  }
}

std::optional<Platform> platform_here(const BackendCaps& caps) {
  const auto declares = [&](PlatformKind k) {
    return std::find(caps.platforms.begin(), caps.platforms.end(), k) != caps.platforms.end();
  };
  if (declares(PlatformKind::kCuda)) {
    const GpuProbe gpu = probe_gpu();
    if (gpu.available()) return Platform::cuda(gpu.compute_capability, gpu.device_name);
  }
  if (declares(PlatformKind::kCpu)) return Platform::cpu();
  return std::nullopt;
}

const BackendType* BackendRegistry::find(std::string_view name) const {
  for (const BackendType& type : backends_) {
    if (type.name() == name) return &type;
  }
  return nullptr;
}

std::vector<const BackendType*> BackendRegistry::priority_list(PlatformKind platform) const {
  std::vector<const BackendType*> out;
  for (const auto& [kind, order] : priorities_) {
    if (kind != platform) continue;
    for (std::size_t index : order) out.push_back(&backends_[index]);
  }
  return out;
}

std::string BackendRegistry::names() const {
  std::string out;
  for (const BackendType& type : backends_) {
    if (!out.empty()) out += ", ";
    out += type.name();
  }
  return out;
}

const BackendRegistry& default_registry() {
  static const BackendRegistry registry = [] {
    const BackendType reference = backend_type_of<ReferenceBackend>();
    const BackendType varlen = backend_type_of<VarlenBackend>();
    const BackendType csr_plan = backend_type_of<CsrPlanBackend>();
    const BackendType recurrent = backend_type_of<RecurrentStateBackend>();
    const BackendType gpu_reference = backend_type_of<GpuReferenceBackend>();
    // Auto selection takes the fastest backend that validates, and an exact oracle only where
    // nothing faster does. CPU: the float32 kernels (one varlen launch, then the plan/run pair),
    // then the float64 reference (it alone has cascade and every layout), then the state backend
    // (it serves only recurrent-state layers, which the others reject). CUDA: the fast backends
    // first (no CUDA kernel of theirs yet, so they are skipped with their reasons), the exact
    // GPU reference last.
    std::vector<BackendType> backends{reference, varlen, csr_plan, recurrent, gpu_reference};
    std::vector<std::string_view> cuda_order{varlen.name()};
#if ATTNKIT_HAVE_FLASHINFER
    // A build with the kernel library only: its kernels exist only there.
    const BackendType flashinfer = backend_type_of<FlashInferBackend>();
    backends.push_back(flashinfer);
    cuda_order.push_back(flashinfer.name());
#endif
#if ATTNKIT_HAVE_CUDNN
    const BackendType cudnn = backend_type_of<CudnnBackend>();
    backends.push_back(cudnn);
    cuda_order.push_back(cudnn.name());
#endif
    cuda_order.push_back(csr_plan.name());
    cuda_order.push_back(gpu_reference.name());
    std::vector<BackendRegistry::PriorityList> priorities{
        {PlatformKind::kCpu, {varlen.name(), csr_plan.name(), reference.name(), recurrent.name()}},
        {PlatformKind::kCuda, std::move(cuda_order)},
    };
    return BackendRegistry(std::move(backends), std::move(priorities));
  }();
  return registry;
}

const std::vector<BackendType>& registered_backends() { return default_registry().backends(); }

const BackendType* find_backend(std::string_view name) { return default_registry().find(name); }

std::vector<const BackendType*> priority_list(PlatformKind platform) {
  return default_registry().priority_list(platform);
}

}  // namespace attnkit
