// Test helper: builds serialized wire::Graph bytes op by op, the way a client records them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "genie/wire/codec.h"

namespace genie::node::testing {

/// One argument of a node: positional (empty name) or keyword.
struct Arg {
  std::string name;
  std::function<flatbuffers::Offset<wire::Argument>(flatbuffers::FlatBufferBuilder&, const std::string&)> make;
};

template <typename T, typename Make>
Arg makeArg(wire::Value type, Make make_value) {
  return Arg{"", [type, make_value](flatbuffers::FlatBufferBuilder& fbb, const std::string& name) {
               auto value = make_value(fbb);
               auto n = name.empty() ? 0 : fbb.CreateString(name);
               return wire::CreateArgument(fbb, n, type, value.Union());
             }};
}

inline Arg T(uint32_t value) {
  return makeArg<void>(wire::Value::TensorValue, [=](auto& fbb) { return wire::CreateTensorValue(fbb, value); });
}
inline Arg I(int64_t v) {
  return makeArg<void>(wire::Value::IntValue, [=](auto& fbb) { return wire::CreateIntValue(fbb, v); });
}
inline Arg D(double v) {
  return makeArg<void>(wire::Value::DoubleValue, [=](auto& fbb) { return wire::CreateDoubleValue(fbb, v); });
}
inline Arg B(bool v) {
  return makeArg<void>(wire::Value::BoolValue, [=](auto& fbb) { return wire::CreateBoolValue(fbb, v); });
}
inline Arg None() {
  return makeArg<void>(wire::Value::NoneValue, [](auto& fbb) { return wire::CreateNoneValue(fbb); });
}
inline Arg Ints(std::vector<int64_t> v, std::vector<int32_t> slots = {}) {
  return makeArg<void>(wire::Value::IntListValue, [=](auto& fbb) {
    return wire::CreateIntListValue(fbb, fbb.CreateVector(v), slots.empty() ? 0 : fbb.CreateVector(slots));
  });
}
inline Arg Doubles(std::vector<double> v, std::vector<int32_t> slots = {}) {
  return makeArg<void>(wire::Value::DoubleListValue, [=](auto& fbb) {
    return wire::CreateDoubleListValue(fbb, fbb.CreateVector(v), slots.empty() ? 0 : fbb.CreateVector(slots));
  });
}
inline Arg Tensors(std::vector<uint32_t> ids) {
  return makeArg<void>(wire::Value::TensorListValue,
                       [=](auto& fbb) { return wire::CreateTensorListValue(fbb, fbb.CreateVector(ids)); });
}
inline Arg Slot(uint32_t slot) {
  return makeArg<void>(wire::Value::ScalarInputValue, [=](auto& fbb) { return wire::CreateScalarInputValue(fbb, slot); });
}
inline Arg Dtype(wire::DType dtype) {
  return makeArg<void>(wire::Value::DTypeValue, [=](auto& fbb) { return wire::CreateDTypeValue(fbb, dtype); });
}
inline Arg Device(std::string type, int32_t index) {
  return makeArg<void>(wire::Value::DeviceValue,
                       [=](auto& fbb) { return wire::CreateDeviceValue(fbb, fbb.CreateString(type), index); });
}
inline Arg Named(std::string name, Arg arg) {
  arg.name = std::move(name);
  return arg;
}

class GraphBuilder {
 public:
  /// A tensor input; returns its value id. `bound`: GraphInput.handle (a bound input, taken
  /// from the running session's tensor unless RunGraph binds it); {0,0}: not bound.
  uint32_t input(wire::DType dtype, std::vector<int64_t> shape, wire::Handle bound = {}) {
    inputs_.push_back({dtype, std::move(shape), bound});
    return next_value_++;
  }
  uint32_t scalarSlot() { return num_scalars_++; }

  /// Appends an op; returns the value id of its first output.
  uint32_t op(std::string name, std::string overload, std::vector<Arg> args, uint32_t num_outputs = 1) {
    nodes_.push_back({std::move(name), std::move(overload), std::move(args), num_outputs, wire::DType::Undefined});
    uint32_t first = next_value_;
    next_value_ += num_outputs;
    return first;
  }

  /// The last op's Node.default_dtype (the client's torch.get_default_dtype()).
  void defaultDtype(wire::DType dtype) { nodes_.back().default_dtype = dtype; }

  /// Serialized Graph bytes (8-byte aligned storage).
  flatbuffers::DetachedBuffer finish() {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<flatbuffers::Offset<wire::GraphInput>> inputs;
    for (auto& [dtype, shape, bound] : inputs_) {
      auto desc = wire::createTensorDesc(fbb, dtype, shape);
      inputs.push_back(wire::CreateGraphInput(fbb, wire::InputKind::Tensor, desc.isOk() ? *desc : 0,
                                              wire::isNull(bound) ? nullptr : &bound));
    }
    std::vector<flatbuffers::Offset<wire::Node>> nodes;
    for (auto& node : nodes_) {
      std::vector<flatbuffers::Offset<wire::Argument>> args;
      for (auto& arg : node.args) args.push_back(arg.make(fbb, arg.name));
      nodes.push_back(wire::CreateNode(fbb, fbb.CreateString(node.name), fbb.CreateString(node.overload),
                                       fbb.CreateVector(args), node.num_outputs, node.default_dtype));
    }
    auto graph = wire::CreateGraph(fbb, fbb.CreateString("test"), fbb.CreateVector(inputs), num_scalars_,
                                   fbb.CreateVector(nodes));
    wire::finishGraph(fbb, graph);
    return fbb.Release();
  }

 private:
  struct NodeSpec {
    std::string name, overload;
    std::vector<Arg> args;
    uint32_t num_outputs;
    wire::DType default_dtype;
  };
  struct InputSpec {
    wire::DType dtype;
    std::vector<int64_t> shape;
    wire::Handle bound;
  };
  std::vector<InputSpec> inputs_;
  std::vector<NodeSpec> nodes_;
  uint32_t next_value_ = 0;
  uint32_t num_scalars_ = 0;
};

}  // namespace genie::node::testing
