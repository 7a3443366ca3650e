// Choosing the next token from a request's logits: greedy, or seeded sampling with temperature,
// top-k and top-p (nucleus). Per request a generator seeded once, so a request's tokens depend on
// its own seed and logits only, never on which other requests share its steps.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace attnkit {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, the lowest id on ties)
  std::int32_t top_k = 0;    // 0: every token
  float top_p = 1.0f;        // (0, 1]: the smallest set of most likely tokens whose mass reaches it
  std::uint64_t seed = 0;

  // Throws Error naming the field for a value outside its range.
  void validate() const;
  bool greedy() const { return temperature == 0.0f; }
  std::string describe() const;
};

// The greedy rule, on the host: the index of the largest value (the lowest on ties), or -1 when a
// value is not finite. The CPU ops' argmax_rows and argmax_token apply it; the CUDA kernel
// (model_kernels.cu) is its device twin.
std::int32_t greedy_index(std::span<const float> values);
// The greedy choice: greedy_index, with non-finite logits refused by an Error naming the first one
// (a NaN would otherwise pick token 0 silently).
std::int32_t argmax_token(std::span<const float> logits);

// One request's sampler (host). Allocation-free after its first call for a vocabulary size.
class TokenSampler {
 public:
  explicit TokenSampler(const SamplingParams& params);
  std::int32_t next(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::int32_t> order_;
  std::vector<double> probs_;
};

}  // namespace attnkit
