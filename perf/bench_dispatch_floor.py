#!/usr/bin/env python3
"""What recording an op could cost without Python dispatch: a design measurement, not Genie.

A recorder reached through Python dispatch (a `__torch_dispatch__` subclass) pays PyTorch's
path into Python (the Python key's fallback, argument conversion, a Python call, output
wrapping) before it records anything. The alternative, which Genie's recorder is
(python/csrc/dispatch_kernel.cc), is a C++ backend: tensors whose dispatch key set is
PrivateUse1 (with its autograd key) and no Python key, and a boxed fallback kernel for
PrivateUse1 that records the op in C++, as PyTorch's Lazy Tensor Core does. This script
measures that floor on tiny (4x4 float32) tensors under `torch.no_grad()`,
in one process, against:

  - eager     the op on CPU tensors (dispatch plus a tiny kernel);
  - python    a wrapper subclass whose `__torch_dispatch__` only returns an output wrapper of
              the right shape (what any Python-dispatch recorder pays first);
  - c++ hit   the C++ fallback with its outputs' sizes and strides cached per (op, input
              shapes): the cost of a recorder's common case;
  - c++ meta  the same fallback running the op's meta kernel on every call (a cache miss; some
              meta kernels are Python decompositions and cost 100+ µs).

The fallback records nothing but a count (no graph, no values: the tensors' storages have no
bytes behind them), so "c++ hit" is a lower bound for a recorder built this way. It keys its
cache by op, input sizes and dtypes and scalar arguments, returns in-place and out= results
as the written argument resized, and new tensors otherwise. It is compiled at run time with `torch.utils.cpp_extension.load_inline` (~30 s) and registers a
PrivateUse1 fallback and device guard: it cannot run in a process that imported `genie`.

    .venv/bin/python perf/bench_dispatch_floor.py [--calls 3000] [--json out.json]

Best of 5 batches of `--calls` calls, µs per op.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time

import torch
from torch.utils._pytree import tree_map
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <unordered_map>
#include <vector>

C10_REGISTER_GUARD_IMPL(PrivateUse1, c10::impl::NoOpDeviceGuardImpl<c10::DeviceType::PrivateUse1>);

namespace {
std::atomic<int64_t> g_ops{0};
bool g_cache = true;

// (op, every input's sizes and dtype, every int argument) -> outputs' (sizes, strides, dtype).
struct Key {
  const void* op;
  std::vector<int64_t> shape;
  bool operator==(const Key& o) const { return op == o.op && shape == o.shape; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<const void*>()(k.op);
    for (int64_t s : k.shape) h = h * 31 + static_cast<size_t>(s);
    return h;
  }
};
struct Output {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
};
using Outputs = std::vector<Output>;
std::unordered_map<Key, Outputs, KeyHash> g_plans;

at::Tensor makeTensor(at::IntArrayRef sizes, at::IntArrayRef strides, at::ScalarType dtype) {
  auto keys = c10::DispatchKeySet({c10::DispatchKey::PrivateUse1, c10::DispatchKey::AutogradPrivateUse1,
                                   c10::DispatchKey::ADInplaceOrView});
  // A storage with no bytes behind it (its size is what the geometry spans): composite view
  // kernels (`_unsafe_view`, `alias`) share a tensor's storage, so there must be one.
  const auto meta = caffe2::TypeMeta::fromScalarType(dtype);
  const size_t nbytes = at::detail::computeStorageNbytes(sizes, strides, meta.itemsize());
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::DataPtr(nullptr, c10::Device(c10::DeviceType::PrivateUse1, 0)), nullptr, false);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, meta);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  return t;
}

void recordFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  ++g_ops;
  const size_t nargs = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, nargs);
  Key key{&op.operator_name(), {}};
  for (const auto& a : args) {
    if (a.isTensor()) {
      const auto& t = a.toTensor();
      for (int64_t s : t.sizes()) key.shape.push_back(s);
      key.shape.push_back(-1 - static_cast<int64_t>(t.scalar_type()));
    } else if (a.isTensorList()) {
      for (const at::Tensor& t : a.toTensorList().vec()) {
        for (int64_t s : t.sizes()) key.shape.push_back(s);
        key.shape.push_back(-1 - static_cast<int64_t>(t.scalar_type()));
      }
    } else if (a.isInt()) {
      key.shape.push_back(a.toInt());
    } else if (a.isIntList()) {
      for (int64_t s : a.toIntList()) key.shape.push_back(s);
    } else if (a.isDouble()) {
      const double d = a.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof(bits));
      key.shape.push_back(bits);
    } else if (a.isBool()) {
      key.shape.push_back(a.toBool() ? 1 : 0);
    } else if (a.isNone()) {
      key.shape.push_back(-1000);
    }
  }
  auto it = g_cache ? g_plans.find(key) : g_plans.end();
  if (it == g_plans.end()) {
    torch::jit::Stack meta;
    for (const auto& a : args) {
      if (a.isTensor()) {
        const auto& t = a.toTensor();
        meta.emplace_back(at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)));
      } else if (a.isTensorList()) {
        std::vector<at::Tensor> ts;
        for (const at::Tensor& t : a.toTensorList().vec()) {
          ts.push_back(at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)));
        }
        meta.emplace_back(c10::List<at::Tensor>(ts));
      } else {
        meta.push_back(a);
      }
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
    Outputs outs;
    for (auto& r : meta) {
      const auto& t = r.toTensor();
      outs.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
    }
    it = g_plans.insert_or_assign(std::move(key), std::move(outs)).first;
  }
  // An output that aliases a written argument (in-place and out= ops) is that argument,
  // resized as the meta kernel resized its meta copy; every other output is a new tensor.
  const auto& returns = op.schema().returns();
  std::vector<at::Tensor> results;
  for (size_t i = 0; i < it->second.size(); ++i) {
    const Output& out = it->second[i];
    const auto* alias = i < returns.size() ? returns[i].alias_info() : nullptr;
    at::Tensor written;
    if (alias != nullptr && alias->isWrite()) {
      for (size_t j = 0; j < nargs; ++j) {
        const auto* arg_alias = op.schema().arguments()[j].alias_info();
        if (arg_alias != nullptr && arg_alias->isWrite() && arg_alias->beforeSets() == alias->beforeSets()) {
          written = args[j].toTensor();
          break;
        }
      }
    }
    if (written.defined()) {
      written.unsafeGetTensorImpl()->set_sizes_and_strides(out.sizes, out.strides);
      results.push_back(written);
    } else {
      results.push_back(makeTensor(out.sizes, out.strides, out.dtype));
    }
  }
  torch::jit::drop(*stack, nargs);
  for (auto& r : results) stack->emplace_back(std::move(r));
}
}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&recordFallback>()); }

at::Tensor like(const at::Tensor& t) { return makeTensor(t.sizes(), t.strides(), t.scalar_type()); }
int64_t recorded() { return g_ops.load(); }
void cache(bool on) { g_cache = on; }
"""


class PythonNop(torch.Tensor):
    """A wrapper subclass whose dispatch only returns wrappers shaped like the CPU result."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    OUTPUTS: dict = {}

    @staticmethod
    def __new__(cls, like: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, like.shape, strides=like.stride(), dtype=like.dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = cls.OUTPUTS[func]
        if isinstance(out, torch.Tensor):
            return PythonNop(out)
        return tree_map(lambda t: PythonNop(t) if isinstance(t, torch.Tensor) else t, out)


class _NoteOutputs(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        PythonNop.OUTPUTS[func] = out
        return out


OPS = {
    "add": lambda a, b: a + b,
    "mm": lambda a, b: a @ b,
    "addmm": lambda a, b: torch.addmm(a, a, b),
    "view": lambda a, b: a.view(-1),
    "t": lambda a, b: a.t(),
    "softmax": lambda a, b: a.softmax(-1),
}


def best_us(fn, a, b, calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn(a, b)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per batch (meta: a sixth of it)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    ext = load_inline("genie_dispatch_floor", cpp_sources=[_SOURCE], functions=["like", "recorded", "cache"],
                      extra_cflags=["-O2"])
    torch.manual_seed(0)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    cx, cy = ext.like(x), ext.like(y)
    rows = []
    with torch.no_grad():
        for name, fn in OPS.items():
            with _NoteOutputs():
                fn(x, y)
            row = {"op": name, "eager_us": best_us(fn, x, y, args.calls),
                   "python_us": best_us(fn, PythonNop(x), PythonNop(y), args.calls)}
            ext.cache(True)
            row["cpp_hit_us"] = best_us(fn, cx, cy, args.calls)
            ext.cache(False)
            row["cpp_meta_us"] = best_us(fn, cx, cy, max(args.calls // 6, 1))
            ext.cache(True)
            out = fn(cx, cy)
            assert out.shape == fn(x, y).shape and out.device.type == "privateuseone", name
            rows.append(row)
    print(f"{'op':8s} {'eager':>8s} {'python':>8s} {'c++ hit':>8s} {'c++ meta':>9s}   (µs per op, best of 5)")
    for r in rows:
        print(f"{r['op']:8s} {r['eager_us']:8.2f} {r['python_us']:8.2f} {r['cpp_hit_us']:8.2f} {r['cpp_meta_us']:9.2f}")
    print(f"ops recorded by the C++ fallback: {ext.recorded()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                                  f"torch {torch.__version__}", "calls": args.calls, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
