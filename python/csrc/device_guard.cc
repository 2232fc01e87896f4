// The remote_accelerator device as PyTorch's PrivateUse1 backend: what c10 needs to accept
// tensors and device guards on it, and what ATen asks of an accelerator (its hooks: the
// autograd engine runs a backward pass's ops for this device on a thread of its own once the
// device reports a primary context). Genie's tensors on this device are LazyTensors (Python
// wrapper subclasses, python/genie/lazy.py): they own no local memory, so there are no
// streams, events, pointers or pinned memory to manage here; the guard only tracks the
// current device index.
//
// What the device-generic API (torch.accelerator) asks of the device beyond that is answered
// in Python, by the hooks genie.device installs (set_accelerator_hooks): synchronizing a
// device (the guard's synchronizeDevice: genie.synchronize) and the allocator's books (the
// session's resident bytes on the node, as its replies report them; the node's free and
// total memory). C++ calls them holding the GIL; their exceptions pass through as Python's.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ATen/core/Tensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "bindings.h"
#include "frontend/device_storage.h"

namespace genie::python {
namespace {

std::atomic<c10::DeviceIndex> g_device_count{1};
thread_local c10::DeviceIndex t_current_device = 0;

/// genie.device's accelerator hooks (a strong reference, kept for the process's life: PyTorch
/// may call the allocator during interpreter shutdown, after a py::object would be destroyed).
std::atomic<PyObject*> g_accelerator_hooks{nullptr};

/// Calls `hooks.<name>(args...)` holding the GIL. A Python exception passes through
/// (py::error_already_set); before genie registered its device, a c10::Error.
template <typename... Args>
py::object callHook(const char* name, Args&&... args) {
  PyObject* hooks = g_accelerator_hooks.load();
  TORCH_CHECK(hooks != nullptr, "remote_accelerator: ", name, " before genie registered the device (import genie)");
  py::gil_scoped_acquire gil;
  return py::reinterpret_borrow<py::object>(hooks).attr(name)(std::forward<Args>(args)...);
}

struct RemoteAcceleratorGuardImpl final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kType, t_current_device); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "remote_accelerator guard got device ", d);
    TORCH_CHECK(d.index() < g_device_count.load(), "remote_accelerator:", static_cast<int>(d.index()),
                " does not exist: genie has ", static_cast<int>(g_device_count.load()), " device(s)");
    t_current_device = d.index() < 0 ? 0 : d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { t_current_device = d.index() < 0 ? 0 : d.index(); }
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return g_device_count.load(); }

  // Events. Each device has one stream, the program order of its recorded ops, and data that
  // crosses devices goes through the host (`.to()` reads it from one node, then puts it on the
  // other), so an event needs nothing to wait for: recording marks it (non-null, as PyTorch
  // expects of a recorded event), blocking is a no-op. The autograd engine records and blocks
  // on events when a gradient crosses devices (model parallel over two nodes); without these,
  // backward raised "Backend doesn't support events". Host-side waits (synchronizeEvent,
  // synchronizeStream) stay unsupported: genie.synchronize() waits for a device's work.
  void record(void** event, const c10::Stream& stream, c10::DeviceIndex /*device_index*/,
              c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(stream.device_type() == kType, "remote_accelerator: an event recorded on a stream of ", stream.device());
    *event = reinterpret_cast<void*>(uintptr_t{1});
  }
  void block(void* /*event*/, const c10::Stream& stream) const override {
    TORCH_CHECK(stream.device_type() == kType, "remote_accelerator: an event blocks a stream of ", stream.device());
  }
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* /*event*/, const c10::DeviceIndex /*device_index*/) const noexcept override {}

  /// torch.accelerator.synchronize(i): runs device i's pending ops and waits for its
  /// asynchronous runs (genie.synchronize). Raises what they raise (GenieRemoteError, ...).
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    callHook("synchronize", static_cast<int>(device_index < 0 ? t_current_device : device_index));
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, RemoteAcceleratorGuardImpl);

struct RemoteAcceleratorHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  /// Every device is usable at once: its node connects on first use (genie.init).
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    return device_index >= 0 && device_index < g_device_count.load();
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    TORCH_CHECK(false, "remote_accelerator tensors have no local memory: no device owns a host pointer");
  }
  /// `tensor.pin_memory()` and `DataLoader(pin_memory=True)` once remote_accelerator is the
  /// current accelerator: ordinary host memory. Nothing is page-locked here: the data plane
  /// registers host buffers with UCX itself when it sends them (its registration cache).
  at::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
};

/// The device's allocator. remote_accelerator memory lives on the node: allocate(n) hands out a
/// device address range whose bytes become a uint8 [n] value on the node at first use
/// (frontend/device_storage.h), so `torch.UntypedStorage(n, device=...)`, `storage.to(device)`,
/// `torch.load(f, map_location="remote_accelerator")` and TypedStorage work as on CUDA. Nothing
/// is copied on the host (copy_data: a COW materialization, whose bytes the node cloned).
///
/// As a c10::DeviceAllocator it keeps the books torch.accelerator reads (memory_allocated,
/// max_memory_allocated, memory_stats, reset_peak_memory_stats, get_memory_info): the
/// session's resident bytes on the node, through genie.device's hooks. There is no cache on
/// either side (the node's own device allocator may cache: its figures are the node's), so
/// reserved bytes are the allocated ones and emptyCache only sends the frees that wait.
struct RemoteAcceleratorAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t n) override {
    return frontend::allocateDeviceStorage(n, c10::Device(c10::DeviceType::PrivateUse1, t_current_device));
  }
  void copy_data(void* dest, const void* /*src*/, std::size_t /*count*/) const override {
    frontend::noteDeviceStorageCopy(dest);
  }
  bool is_simple_data_ptr(const c10::DataPtr& data_ptr) const override {
    return frontend::isSimpleDeviceDataPtr(data_ptr);
  }

  bool initialized() override { return g_accelerator_hooks.load() != nullptr; }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override { callHook("empty_cache"); }
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}  // one stream per device

  /// allocated_bytes, reserved_bytes and active_bytes ("all" and "large_pool"): the session's
  /// resident bytes, {current, peak, allocated, freed} as genie.device's hooks report them.
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    py::gil_scoped_acquire gil;
    py::dict r = callHook("resident_stat", static_cast<int>(device));
    c10::CachingAllocator::Stat stat;
    stat.current = r["current"].cast<int64_t>();
    stat.peak = r["peak"].cast<int64_t>();
    stat.allocated = r["allocated"].cast<int64_t>();
    stat.freed = r["freed"].cast<int64_t>();
    c10::CachingDeviceAllocator::DeviceStats stats;
    for (auto* array : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes}) {
      (*array)[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)] = stat;
      (*array)[static_cast<size_t>(c10::CachingAllocator::StatType::LARGE_POOL)] = stat;
    }
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    callHook("reset_accumulated_memory_stats", static_cast<int>(device));
  }
  void resetPeakStats(c10::DeviceIndex device) override { callHook("reset_peak_memory_stats", static_cast<int>(device)); }
  /// (free, total) bytes of the node's device (a request: the node's Stats).
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    py::gil_scoped_acquire gil;
    return callHook("mem_get_info", static_cast<int>(device)).cast<std::pair<size_t, size_t>>();
  }
};

/// Registered when genie._C is loaded (PyTorch keeps the pointers for the process's life).
const bool g_hooks_registered = [] {
  static RemoteAcceleratorHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  static RemoteAcceleratorAllocator allocator;
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &allocator);
  return true;
}();

}  // namespace

void setAcceleratorHooks(py::object hooks) {
  PyObject* previous = g_accelerator_hooks.exchange(hooks.release().ptr());
  Py_XDECREF(previous);
}

void setDeviceCount(int count) { g_device_count.store(static_cast<c10::DeviceIndex>(count)); }

int currentDevice() { return t_current_device; }

void setCurrentDevice(int index) {
  RemoteAcceleratorGuardImpl().setDevice(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)));
}

void setGeometry(const at::Tensor& tensor, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t storage_offset) {
  TORCH_CHECK(tensor.device().type() == c10::DeviceType::PrivateUse1,
              "set_geometry: only remote_accelerator tensors, got one on ", tensor.device());
  TORCH_CHECK(sizes.size() == strides.size(), "set_geometry: ", sizes.size(), " sizes but ", strides.size(), " strides");
  tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, storage_offset);
}

}  // namespace genie::python
