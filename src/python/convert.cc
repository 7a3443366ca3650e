#include "convert.h"

#include <nanobind/stl/string.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "attnkit/core/dtype.h"
#include "attnkit/invariants/checker.h"
#include "attnkit/selection/platform_choice.h"
#include "attnkit/selection/selector.h"
#include "attnkit/selection/validate.h"

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace attnkit::python {

namespace {

PyObject* g_error = nullptr;
PyObject* g_selection_error = nullptr;
PyObject* g_invariant_error = nullptr;

nb::list candidate_list(const std::vector<CandidateReport>& candidates) {
  nb::list out;
  for (const CandidateReport& c : candidates) {
    nb::list reasons;
    for (const Reason& r : c.reasons) {
      nb::dict d;
      d["kind"] = std::string(to_string(r.kind));
      d["parameter"] = r.parameter;
      d["value"] = r.value;
      d["supported"] = r.supported;
      d["explanation"] = r.explanation;
      d["message"] = r.message();
      reasons.append(d);
    }
    nb::dict d;
    d["backend"] = std::string(c.backend);
    d["valid"] = c.valid();
    d["reasons"] = reasons;
    out.append(d);
  }
  return out;
}

// Raises `type(message)` with field/value/allowed (and `extra` attributes) set on the instance.
void raise_error(PyObject* type, const Error& e, const char* extra_name = nullptr, nb::handle extra = {}) {
  nb::object instance = nb::steal(PyObject_CallFunction(type, "s", e.what()));
  if (!instance.is_valid()) return;  // the call set a Python error already
  instance.attr("field") = e.field();
  instance.attr("value") = e.value();
  instance.attr("allowed") = e.allowed();
  if (extra_name) instance.attr(extra_name) = extra;
  PyErr_SetObject(type, instance.ptr());
}

std::string join(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

bool is_str(nb::handle h) { return PyUnicode_Check(h.ptr()); }

// DLPack arrays on the CPU with an integer dtype: read directly (the common NumPy int32/int64 case).
bool read_int_array(nb::handle value, std::vector<std::int32_t>& out, std::vector<std::int64_t>& shape,
                    const std::string& field) {
  if (!PyObject_HasAttrString(value.ptr(), "__dlpack__")) return false;
  nb::ndarray<nb::ro, nb::device::cpu> a;
  if (!nb::try_cast(value, a)) return false;
  const auto dt = a.dtype();
  const bool is_int = dt.lanes == 1 && (dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) ||
                                        dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt));
  if (!is_int || (dt.bits != 32 && dt.bits != 64)) {
    throw Error(field, "an array of " + std::to_string(dt.bits) + "-bit code " + std::to_string(dt.code),
                "integers (int32 or int64)");
  }
  shape.assign(a.shape_ptr(), a.shape_ptr() + a.ndim());
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  out.resize(static_cast<std::size_t>(n));
  const auto* base = static_cast<const std::uint8_t*>(a.data());
  const std::size_t item = dt.bits / 8;
  std::vector<std::int64_t> index(a.ndim(), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < a.ndim(); ++d) offset += index[d] * a.stride(d);
    const std::uint8_t* p = base + offset * static_cast<std::int64_t>(item);
    std::int64_t v = 0;
    if (dt.bits == 32) {
      // Two statements, not a conditional expression: `?:` of int32 and uint32 has type uint32, and
      // read an int32 -1 (a padded block-table entry) as 4294967295.
      if (dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int)) {
        v = *reinterpret_cast<const std::int32_t*>(p);
      } else {
        v = *reinterpret_cast<const std::uint32_t*>(p);
      }
    } else if (dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int)) {
      v = *reinterpret_cast<const std::int64_t*>(p);
    } else {
      // A uint64 past int64's range must not wrap to a negative value that passes as -1.
      const std::uint64_t u = *reinterpret_cast<const std::uint64_t*>(p);
      v = u > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()) ? std::numeric_limits<std::int64_t>::max()
                                                                                   : static_cast<std::int64_t>(u);
    }
    if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max()) {
      throw Error(field + "[" + std::to_string(i) + "]", std::to_string(v), "a 32-bit integer");
    }
    out[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(v);
    for (std::size_t d = a.ndim(); d-- > 0;) {  // row-major increment
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return true;
}

}  // namespace

std::string py_type_name(nb::handle value) { return nb::cast<std::string>(nb::type_name(value.type())); }

std::string py_repr(nb::handle value) {
  std::string text = nb::cast<std::string>(nb::repr(value));
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

std::vector<nb::object> sequence_items(nb::handle value, const std::string& field, const std::string& allowed) {
  if (!PySequence_Check(value.ptr()) || PyUnicode_Check(value.ptr())) throw Error(field, py_repr(value), allowed);
  const Py_ssize_t n = PySequence_Size(value.ptr());
  if (n < 0) throw nb::python_error();
  std::vector<nb::object> items;
  items.reserve(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    nb::object item = nb::steal(PySequence_GetItem(value.ptr(), i));
    if (!item.is_valid()) throw nb::python_error();
    items.push_back(std::move(item));
  }
  return items;
}

void register_errors(nb::module_& m) {
  g_error = PyErr_NewExceptionWithDoc(
      "attnkit._attnkit.Error",
      "An error of the attnkit library: a configuration or input it refuses.\n\n"
      "A ValueError with the attributes ``field`` (what was wrong), ``value`` (the value given) and "
      "``allowed`` (what is allowed); str() is the library's full message.",
      PyExc_ValueError, nullptr);
  g_selection_error = PyErr_NewExceptionWithDoc(
      "attnkit._attnkit.SelectionError",
      "No backend can run a layer's configuration (an explicit backend is invalid, or every candidate is).\n\n"
      "An attnkit.Error (field 'backend', value the requested name or 'auto', allowed the backends that would "
      "accept the configuration) with ``candidates``: a list of {backend, valid, reasons}.",
      g_error, nullptr);
  g_invariant_error = PyErr_NewExceptionWithDoc(
      "attnkit._attnkit.InvariantError",
      "A prepared step broke invariants V1-V9 (RunnerConfig.check_invariants).\n\n"
      "An attnkit.Error (field the first violated invariant, e.g. 'V5') with ``violations``: a list of "
      "(invariant number, message).",
      g_error, nullptr);
  m.attr("Error") = nb::handle(g_error);
  m.attr("SelectionError") = nb::handle(g_selection_error);
  m.attr("InvariantError") = nb::handle(g_invariant_error);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const SelectionError& e) {
      raise_error(g_selection_error, e, "candidates", candidate_list(e.candidates()));
    } catch (const InvariantError& e) {
      nb::list violations;
      for (const Violation& v : e.violations()) violations.append(nb::make_tuple(v.invariant, v.message));
      raise_error(g_invariant_error, e, "violations", violations);
    } catch (const Error& e) {
      raise_error(g_error, e);
    } catch (const nb::cast_error& e) {
      // A value of another type than a binding converts (nanobind's own conversion, after the call
      // was dispatched): a refusal of the input, not a bug, so an attnkit.Error like the others.
      raise_error(g_error, Error("argument", "a value of another type", "the documented type", e.what()));
    }
  });
}

// --- fields ---------------------------------------------------------------------------------

Fields::Fields(nb::handle source, std::string where, std::vector<std::string_view> known)
    : source_(source), is_dict_(PyDict_Check(source.ptr())), where_(std::move(where)) {
  if (!is_dict_) return;
  for (auto [key, value] : nb::borrow<nb::dict>(source)) {
    (void)value;
    if (!is_str(key)) throw Error(where_ + " key", py_repr(key), "strings: " + join(known));
    const std::string name = nb::cast<std::string>(key);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw Error(where_ + " key", name, join(known));
    }
  }
}

std::optional<nb::object> Fields::get(std::string_view name) const {
  const std::string key(name);
  nb::object value;
  if (is_dict_) {
    PyObject* item = PyDict_GetItemString(source_.ptr(), key.c_str());  // borrowed
    if (!item) return std::nullopt;
    value = nb::borrow(item);
  } else {
    if (!PyObject_HasAttrString(source_.ptr(), key.c_str())) return std::nullopt;
    value = source_.attr(key.c_str());
  }
  if (value.is_none()) return std::nullopt;
  return value;
}

std::string Fields::required_string(std::string_view name) const {
  auto s = optional_string(name);
  if (!s) throw Error(where(name), "missing", "a string");
  return *s;
}

std::optional<std::string> Fields::optional_string(std::string_view name) const {
  auto v = get(name);
  if (!v) return std::nullopt;
  if (!is_str(*v)) throw Error(where(name), py_repr(*v) + " (" + py_type_name(*v) + ")", "a string");
  return nb::cast<std::string>(*v);
}

std::int32_t Fields::required_int(std::string_view name) const {
  auto v = get(name);
  if (!v) throw Error(where(name), "missing", "an integer");
  return to_int32(*v, where(name));
}

std::int32_t Fields::int_or(std::string_view name, std::int32_t fallback) const {
  return optional_int(name).value_or(fallback);
}

std::optional<std::int32_t> Fields::optional_int(std::string_view name) const {
  auto v = get(name);
  if (!v) return std::nullopt;
  return to_int32(*v, where(name));
}

std::optional<float> Fields::optional_float(std::string_view name) const {
  auto v = get(name);
  if (!v) return std::nullopt;
  if (PyBool_Check(v->ptr())) throw Error(where(name), py_repr(*v), "a number");
  const double d = PyFloat_AsDouble(v->ptr());
  if (d == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw Error(where(name), py_repr(*v) + " (" + py_type_name(*v) + ")", "a number");
  }
  return static_cast<float>(d);
}

float Fields::float_or(std::string_view name, float fallback) const { return optional_float(name).value_or(fallback); }

bool Fields::bool_or(std::string_view name, bool fallback) const {
  auto v = get(name);
  if (!v) return fallback;
  if (!PyBool_Check(v->ptr())) throw Error(where(name), py_repr(*v), "True or False");
  return v->ptr() == Py_True;
}

std::vector<float> Fields::floats(std::string_view name) const {
  auto v = get(name);
  std::vector<float> out;
  if (!v) return out;
  if (is_str(*v)) throw Error(where(name), py_repr(*v), "a sequence of numbers");
  nb::object iter = nb::steal(PyObject_GetIter(v->ptr()));
  if (!iter.is_valid()) {
    PyErr_Clear();
    throw Error(where(name), py_repr(*v) + " (" + py_type_name(*v) + ")", "a sequence of numbers");
  }
  while (PyObject* item = PyIter_Next(iter.ptr())) {
    nb::object owned = nb::steal(item);
    const double d = PyFloat_AsDouble(item);
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      throw Error(where(name) + "[" + std::to_string(out.size()) + "]", py_repr(owned), "a number");
    }
    out.push_back(static_cast<float>(d));
  }
  if (PyErr_Occurred()) throw nb::python_error();
  return out;
}

std::vector<std::int32_t> Fields::ints(std::string_view name) const {
  auto v = get(name);
  if (!v) return {};
  return int_vector(*v, where(name));
}

// --- integers -------------------------------------------------------------------------------

std::int32_t to_int32(nb::handle value, const std::string& field) {
  if (PyBool_Check(value.ptr()) || PyFloat_Check(value.ptr())) {
    throw Error(field, py_repr(value) + " (" + py_type_name(value) + ")", "an integer");
  }
  nb::object index = nb::steal(PyNumber_Index(value.ptr()));
  if (!index.is_valid()) {
    PyErr_Clear();
    throw Error(field, py_repr(value) + " (" + py_type_name(value) + ")", "an integer");
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0 || v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max()) {
    throw Error(field, py_repr(value), "a 32-bit integer");
  }
  return static_cast<std::int32_t>(v);
}

std::uint64_t to_uint64(nb::handle value, const std::string& field) {
  if (PyBool_Check(value.ptr()) || !PyLong_Check(value.ptr())) {
    throw Error(field, py_repr(value) + " (" + py_type_name(value) + ")", "an integer >= 0");
  }
  const unsigned long long v = PyLong_AsUnsignedLongLong(value.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw Error(field, py_repr(value), "an integer in [0, 2^64)");
  }
  return static_cast<std::uint64_t>(v);
}

float to_float(nb::handle value, const std::string& field) {
  if (PyBool_Check(value.ptr()) || !(PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr()))) {
    throw Error(field, py_repr(value) + " (" + py_type_name(value) + ")", "a number");
  }
  const double d = PyFloat_AsDouble(value.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw Error(field, py_repr(value), "a number a float holds");
  }
  return static_cast<float>(d);
}

bool to_bool(nb::handle value, const std::string& field) {
  if (!PyBool_Check(value.ptr())) throw Error(field, py_repr(value) + " (" + py_type_name(value) + ")", "True or False");
  return value.ptr() == Py_True;
}

std::string to_string_arg(nb::handle value, const std::string& field) {
  if (!PyUnicode_Check(value.ptr())) throw Error(field, py_repr(value) + " (" + py_type_name(value) + ")", "a str");
  return nb::cast<std::string>(value);
}

std::vector<std::int32_t> int_vector(nb::handle value, const std::string& field) {
  std::vector<std::int32_t> out;
  std::vector<std::int64_t> shape;
  if (read_int_array(value, out, shape, field)) {
    if (shape.size() != 1) throw Error(field, "an array of " + std::to_string(shape.size()) + " dimensions", "1-D");
    return out;
  }
  if (is_str(value)) throw Error(field, py_repr(value), "a sequence of integers");
  nb::object iter = nb::steal(PyObject_GetIter(value.ptr()));
  if (!iter.is_valid()) {
    PyErr_Clear();
    throw Error(field, py_repr(value) + " (" + py_type_name(value) + ")", "a sequence of integers");
  }
  while (PyObject* item = PyIter_Next(iter.ptr())) {
    nb::object owned = nb::steal(item);
    out.push_back(to_int32(owned, field + "[" + std::to_string(out.size()) + "]"));
  }
  if (PyErr_Occurred()) throw nb::python_error();
  return out;
}

std::int32_t int_table(nb::handle value, const std::string& field, std::int32_t pad, std::vector<std::int32_t>& out) {
  std::vector<std::int64_t> shape;
  out.clear();
  if (read_int_array(value, out, shape, field)) {
    if (shape.size() != 2) throw Error(field, "an array of " + std::to_string(shape.size()) + " dimensions", "2-D [rows, columns]");
    return static_cast<std::int32_t>(shape[1]);
  }
  if (is_str(value)) throw Error(field, py_repr(value), "a sequence of rows of integers");
  nb::object iter = nb::steal(PyObject_GetIter(value.ptr()));
  if (!iter.is_valid()) {
    PyErr_Clear();
    throw Error(field, py_repr(value) + " (" + py_type_name(value) + ")", "a 2-D array or a sequence of rows of integers");
  }
  std::vector<std::vector<std::int32_t>> rows;
  while (PyObject* item = PyIter_Next(iter.ptr())) {
    nb::object owned = nb::steal(item);
    rows.push_back(int_vector(owned, field + "[" + std::to_string(rows.size()) + "]"));
  }
  if (PyErr_Occurred()) throw nb::python_error();
  std::size_t stride = 0;
  for (const auto& r : rows) stride = std::max(stride, r.size());
  out.assign(rows.size() * stride, pad);
  for (std::size_t i = 0; i < rows.size(); ++i) std::copy(rows[i].begin(), rows[i].end(), out.begin() + static_cast<std::ptrdiff_t>(i * stride));
  return static_cast<std::int32_t>(stride);
}

// --- specs and configs ----------------------------------------------------------------------

DType parse_dtype_field(std::string_view text, const std::string& field) {
  auto d = parse_dtype(text);
  if (!d) throw Error(field, std::string(text), describe_dtypes({std::begin(kAllDTypes), std::end(kAllDTypes)}));
  return *d;
}

LayerSpec to_layer_spec(nb::handle spec, const std::string& where) {
  const Fields f(spec, where,
                 {"name", "num_q_heads", "num_kv_heads", "head_size", "dtype", "kv_cache_dtype", "block_size",
                  "sliding_window", "soft_cap", "scale", "sinks", "alibi_slopes", "attn_type", "kind", "backend",
                  "kv_layout", "kernel_block_size", "state_decay"});
  LayerSpec l;
  l.name = f.required_string("name");
  LayerParams& p = l.params;
  p.num_q_heads = f.required_int("num_q_heads");
  p.num_kv_heads = f.required_int("num_kv_heads");
  p.head_size = f.required_int("head_size");
  p.dtype = parse_dtype_field(f.optional_string("dtype").value_or("float16"), f.where("dtype"));
  const auto kv_dtype = f.optional_string("kv_cache_dtype");
  p.kv_cache_dtype = kv_dtype && *kv_dtype != "auto" ? parse_dtype_field(*kv_dtype, f.where("kv_cache_dtype")) : p.dtype;
  p.sliding_window = f.optional_int("sliding_window");
  p.soft_cap = f.optional_float("soft_cap");
  p.scale = f.optional_float("scale");
  p.sinks = f.floats("sinks");
  p.alibi_slopes = f.floats("alibi_slopes");
  if (auto t = f.optional_string("attn_type")) {
    auto parsed = parse_attention_type(*t);
    if (!parsed) throw Error(f.where("attn_type"), *t, describe_attention_types());
    p.attn_type = *parsed;
  }
  p.state_decay = f.float_or("state_decay", p.state_decay);

  KVCacheSpec& s = l.kv_spec;
  s.kind = p.sliding_window ? KVSpecKind::kSlidingWindow : KVSpecKind::kFullAttention;
  if (auto k = f.optional_string("kind")) {
    const std::optional<KVSpecKind> kind = parse_kv_spec_kind(*k);
    if (!kind) throw Error(f.where("kind"), *k, describe_kv_spec_kinds());
    s.kind = *kind;
  }
  s.block_size = f.int_or("block_size", s.kind == KVSpecKind::kRecurrentState ? 1 : 16);
  s.num_kv_heads = p.num_kv_heads;
  s.head_size = p.head_size;
  s.dtype = p.kv_cache_dtype;
  s.sliding_window = s.kind == KVSpecKind::kSlidingWindow ? p.sliding_window.value_or(0) : 0;
  if (auto layout = f.optional_string("kv_layout")) {
    auto parsed = parse_kv_layout(*layout);
    if (!parsed) {
      throw Error(f.where("kv_layout"), *layout, describe_layouts({std::begin(kAllKVLayouts), std::end(kAllKVLayouts)}));
    }
    s.forced_layout = *parsed;
  }
  s.forced_kernel_block_size = f.optional_int("kernel_block_size");
  if (auto b = f.optional_string("backend"); b && *b != "auto") l.backend = *b;
  return l;
}

std::vector<LayerSpec> to_layer_specs(nb::handle layers) {
  if (PyDict_Check(layers.ptr()) || is_str(layers)) throw Error("layers", py_repr(layers), "a sequence of layer specs");
  nb::object iter = nb::steal(PyObject_GetIter(layers.ptr()));
  if (!iter.is_valid()) {
    PyErr_Clear();
    throw Error("layers", py_repr(layers), "a sequence of layer specs (dicts or attnkit.LayerSpec)");
  }
  std::vector<LayerSpec> out;
  while (PyObject* item = PyIter_Next(iter.ptr())) {
    nb::object owned = nb::steal(item);
    out.push_back(to_layer_spec(owned, "layers[" + std::to_string(out.size()) + "]"));
  }
  if (PyErr_Occurred()) throw nb::python_error();
  return out;
}

RunnerConfig to_runner_config(nb::handle config, nb::handle log, nb::object* group) {
  RunnerConfig c;
  if (config.is_none()) return c;
  const Fields f(config, "config",
                 {"platform", "backend", "max_num_reqs", "max_num_tokens", "max_model_len", "num_blocks",
                  "num_state_slots", "capture_sizes", "need_lse", "cascade", "optimistic_cpu_lengths",
                  "check_invariants", "k_scale", "v_scale", "kv_poison", "compute_capability",
                  "context_parallel_size", "context_parallel_rank", "context_parallel_interleave",
                  "context_parallel_group"});
  if (auto b = f.optional_string("backend"); b && *b != "auto") c.backend = *b;
  c.platform = choose_platform(f.optional_string("platform").value_or("cpu"), c.backend.value_or(""),
                               f.where("platform"), f.int_or("compute_capability", 0));
  c.max_num_reqs = f.int_or("max_num_reqs", c.max_num_reqs);
  c.max_num_tokens = f.int_or("max_num_tokens", c.max_num_tokens);
  c.max_model_len = f.int_or("max_model_len", c.max_model_len);
  c.num_manager_blocks = f.int_or("num_blocks", c.num_manager_blocks);
  c.num_state_slots = f.int_or("num_state_slots", c.num_state_slots);
  c.capture_sizes = f.ints("capture_sizes");
  c.need_lse = f.bool_or("need_lse", c.need_lse);
  if (auto cascade = f.optional_string("cascade")) {
    if (*cascade == "heuristic") c.cascade = CascadePolicy::kHeuristic;
    else if (*cascade == "never") c.cascade = CascadePolicy::kNever;
    else if (*cascade == "always") c.cascade = CascadePolicy::kAlways;
    else throw Error(f.where("cascade"), *cascade, "heuristic, never, always");
  }
  c.optimistic_cpu_lengths = f.bool_or("optimistic_cpu_lengths", c.optimistic_cpu_lengths);
  c.check_invariants = f.bool_or("check_invariants", c.check_invariants);
  c.k_scale = f.optional_float("k_scale");
  c.v_scale = f.optional_float("v_scale");
  c.kv_poison = f.optional_float("kv_poison");
  c.context_parallel.size = f.int_or("context_parallel_size", c.context_parallel.size);
  c.context_parallel.rank = f.int_or("context_parallel_rank", c.context_parallel.rank);
  c.context_parallel.interleave = f.int_or("context_parallel_interleave", c.context_parallel.interleave);
  if (auto g = f.get("context_parallel_group")) {
    if (!nb::isinstance<PyContextParallelGroup>(*g)) {
      throw Error(f.where("context_parallel_group"), py_repr(*g), "None or an attnkit.ContextParallelGroup");
    }
    c.context_parallel_group = nb::cast<PyContextParallelGroup&>(*g).group.get();
    if (group != nullptr) *group = *g;
  }
  if (log.is_valid() && !log.is_none()) {
    if (!PyCallable_Check(log.ptr())) throw Error("log", py_repr(log), "None or a callable taking one str");
    nb::object fn = nb::borrow(log);
    c.log = [fn](std::string_view line) {
      nb::gil_scoped_acquire gil;
      fn(nb::str(line.data(), line.size()));
    };
  }
  return c;
}

// --- tensors --------------------------------------------------------------------------------

namespace {

std::optional<DType> dtype_of(nb::dlpack::dtype dt) {
  using code = nb::dlpack::dtype_code;
  if (dt.lanes != 1) return std::nullopt;
  const auto c = static_cast<code>(dt.code);
  if (c == code::Float && dt.bits == 32) return DType::kFloat32;
  if (c == code::Float && dt.bits == 16) return DType::kFloat16;
  if (c == code::Bfloat && dt.bits == 16) return DType::kBFloat16;
  if (c == code::Float8_E4M3FN && dt.bits == 8) return DType::kFp8E4M3;
  if (c == code::Float8_E5M2 && dt.bits == 8) return DType::kFp8E5M2;
  return std::nullopt;
}

std::string describe_dlpack_dtype(nb::dlpack::dtype dt) {
  using code = nb::dlpack::dtype_code;
  std::string name;
  switch (static_cast<code>(dt.code)) {
    case code::Int: name = "int"; break;
    case code::UInt: name = "uint"; break;
    case code::Float: name = "float"; break;
    case code::Bfloat: name = "bfloat"; break;
    case code::Complex: name = "complex"; break;
    case code::Bool: name = "bool"; break;
    default: name = "dlpack code " + std::to_string(dt.code) + " of "; break;
  }
  name += std::to_string(dt.bits);
  if (dt.lanes != 1) name += "x" + std::to_string(dt.lanes);
  return name;
}

template <class Array>
TensorView view_of(const Array& a, const char* name) {
  const std::string field(name);
  const auto dtype = dtype_of(a.dtype());
  if (!dtype) {
    throw Error(field + " dtype", describe_dlpack_dtype(a.dtype()), "float32, float16, bfloat16, fp8_e4m3, fp8_e5m2");
  }
  if (a.ndim() > static_cast<std::size_t>(kMaxDims)) {
    throw Error(field + " ndim", std::to_string(a.ndim()), "at most " + std::to_string(kMaxDims));
  }
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = *dtype;
  v.ndim = static_cast<int>(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    v.shape[i] = static_cast<std::int64_t>(a.shape(i));
    v.stride[i] = a.stride(i);
  }
  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value:  // pinned host memory: the host reads it
      v.space = MemorySpace::kHost;
      break;
    case nb::device::cuda::value: {
      v.space = MemorySpace::kDevice;
#if ATTNKIT_HAVE_CUDA
      int current = -1;
      if (cudaGetDevice(&current) == cudaSuccess && current != a.device_id()) {
        throw Error(field + " device", "cuda:" + std::to_string(a.device_id()),
                    "cuda:" + std::to_string(current) + " (the current device)");
      }
#endif
      break;
    }
    default:
      throw Error(field + " device", "DLPack device type " + std::to_string(a.device_type()),
                  "cpu (1), cuda (2), cuda_host (3)");
  }
  return v;
}

}  // namespace

TensorView to_view(const nb::ndarray<nb::ro>& array, const char* name) { return view_of(array, name); }
TensorView to_view(const nb::ndarray<>& array, const char* name) { return view_of(array, name); }

Stream to_stream(std::uintptr_t handle) { return Stream{reinterpret_cast<void*>(handle)}; }

}  // namespace attnkit::python
