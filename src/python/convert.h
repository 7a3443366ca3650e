// The Python binding's conversions: Python values (dicts, small classes, sequences, DLPack
// arrays) into the library's types, and attnkit::Error into the Python exception attnkit.Error.
// Every refusal is an attnkit::Error naming the field, the value and what is allowed, so that a
// caller sees the same kind of error from a bad argument as from the library itself.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/core/tensor.h"
#include "attnkit/parallel/in_process_group.h"
#include "attnkit/platform/platform.h"
#include "attnkit/platform/stream.h"
#include "attnkit/runner/model_runner.h"

namespace attnkit::python {

namespace nb = nanobind;

// Creates attnkit._attnkit.Error (a ValueError), SelectionError and InvariantError (subclasses of
// Error) in `m` and installs the translator that raises them for every attnkit::Error.
void register_errors(nb::module_& m);
// attnkit.LLM, attnkit.SamplingParams and attnkit.Completion (engine.cc).
void bind_engine(nb::module_& m);

// The fields of a dict, or the attributes of any other object (a dataclass, a namespace). A dict
// with a key outside `known` is refused: a typo must not be ignored silently.
class Fields {
 public:
  Fields(nb::handle source, std::string where, std::vector<std::string_view> known);
  // The value, or nullopt when the key is absent or None.
  std::optional<nb::object> get(std::string_view name) const;
  std::string where(std::string_view name) const { return where_ + "." + std::string(name); }

  std::string required_string(std::string_view name) const;
  std::optional<std::string> optional_string(std::string_view name) const;
  std::int32_t required_int(std::string_view name) const;
  std::int32_t int_or(std::string_view name, std::int32_t fallback) const;
  std::optional<std::int32_t> optional_int(std::string_view name) const;
  std::optional<float> optional_float(std::string_view name) const;
  float float_or(std::string_view name, float fallback) const;
  bool bool_or(std::string_view name, bool fallback) const;
  std::vector<float> floats(std::string_view name) const;  // absent/None: empty
  std::vector<std::int32_t> ints(std::string_view name) const;

 private:
  nb::handle source_;
  bool is_dict_;
  std::string where_;
};

// A value's repr for an error message (at most 80 characters), and its type's name.
std::string py_repr(nb::handle value);
std::string py_type_name(nb::handle value);
// The items of a sequence that is not a str (a list, a tuple); Error naming `field` with `allowed`
// for anything else.
std::vector<nb::object> sequence_items(nb::handle value, const std::string& field, const std::string& allowed);
// A Python int (anything with __index__) as int32; Error naming `field` otherwise.
std::int32_t to_int32(nb::handle value, const std::string& field);
// The same for the other scalar kinds an API argument may be: a non-negative int as uint64, a
// number (not a bool) as float, a bool, a str. Error naming `field`, the value and its type.
std::uint64_t to_uint64(nb::handle value, const std::string& field);
float to_float(nb::handle value, const std::string& field);
bool to_bool(nb::handle value, const std::string& field);
std::string to_string_arg(nb::handle value, const std::string& field);
// A 1-D sequence or array of integers (lists, tuples, NumPy arrays, CPU tensors).
std::vector<std::int32_t> int_vector(nb::handle value, const std::string& field);
// A 2-D table [rows][columns] of integers: a 2-D array, or a sequence of rows (rows may differ in
// length; shorter ones are padded with `pad` to the longest). Returns the row stride.
std::int32_t int_table(nb::handle value, const std::string& field, std::int32_t pad, std::vector<std::int32_t>& out);

DType parse_dtype_field(std::string_view text, const std::string& field);
// `where` names the spec in errors ("layers[2]", "layer").
LayerSpec to_layer_spec(nb::handle spec, const std::string& where);
std::vector<LayerSpec> to_layer_specs(nb::handle layers);
// D1 from Python: one rank of an in-process context-parallel group (attnkit.ContextParallelHub.group),
// the ranks being threads of one process (ModelRunner.prepare_step and attention release the GIL
// while they run, so the ranks' all-gathers meet).
struct PyContextParallelGroup {
  std::unique_ptr<InProcessContextParallelGroup> group;  // its address is the config's pointer
};

// `log` receives the runner's start-up log lines when it is callable. `group`, when given, receives
// the config's context_parallel_group object (the runner keeps it alive: the config holds a raw
// pointer to its group).
RunnerConfig to_runner_config(nb::handle config, nb::handle log, nb::object* group = nullptr);
// DLPack array -> TensorView, faithfully: data (with the byte offset), dtype, ndim <= 4, shape,
// strides in elements, and the memory space from the device type (CPU and CUDA-pinned host memory
// are host memory; CUDA memory is device memory, checked against the current device). No copy.
TensorView to_view(const nb::ndarray<nb::ro>& array, const char* name);
TensorView to_view(const nb::ndarray<>& array, const char* name);

// An integer stream handle (cudaStream_t; 0 = the legacy default stream).
Stream to_stream(std::uintptr_t handle);

}  // namespace attnkit::python
