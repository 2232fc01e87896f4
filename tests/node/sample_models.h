// Small models used by both the executor tests and the genie-node integration tests: each is
// a captured graph, inputs for it, and the same computation run eagerly in libtorch.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "graph_builder.h"

namespace genie::node::testing {

struct SampleModel {
  GraphBuilder graph;
  uint32_t output = 0;             // value id of the result
  std::vector<at::Tensor> inputs;  // for the graph's inputs, in order
  at::Tensor expected;             // libtorch eager on the same inputs
};

/// relu(mm(x, w) + b), x [4, 8], w [8, 16], b [16].
inline SampleModel chainModel() {
  SampleModel m;
  auto& g = m.graph;
  uint32_t x = g.input(wire::DType::Float32, {4, 8});
  uint32_t w = g.input(wire::DType::Float32, {8, 16});
  uint32_t b = g.input(wire::DType::Float32, {16});
  uint32_t mm = g.op("aten::mm", "", {T(x), T(w)});
  uint32_t add = g.op("aten::add", "Tensor", {T(mm), T(b)});
  m.output = g.op("aten::relu", "", {T(add)});
  m.inputs = {at::randn({4, 8}), at::randn({8, 16}), at::randn({16})};
  m.expected = at::relu(at::mm(m.inputs[0], m.inputs[1]) + m.inputs[2]);
  return m;
}

/// Two layers: linear(relu(addmm(b1, x, w1.t())), w2, b2).
inline SampleModel mlpModel() {
  SampleModel m;
  auto& g = m.graph;
  uint32_t x = g.input(wire::DType::Float32, {32, 64}), w1 = g.input(wire::DType::Float32, {128, 64});
  uint32_t b1 = g.input(wire::DType::Float32, {128}), w2 = g.input(wire::DType::Float32, {10, 128});
  uint32_t b2 = g.input(wire::DType::Float32, {10});
  uint32_t w1t = g.op("aten::t", "", {T(w1)});
  uint32_t h = g.op("aten::addmm", "", {T(b1), T(x), T(w1t)});
  uint32_t r = g.op("aten::relu", "", {T(h)});
  m.output = g.op("aten::linear", "", {T(r), T(w2), T(b2)});
  m.inputs = {at::randn({32, 64}), at::randn({128, 64}), at::randn({128}), at::randn({10, 128}), at::randn({10})};
  const auto& in = m.inputs;
  m.expected = at::linear(at::relu(at::addmm(in[2], in[0], in[1].t())), in[3], in[4]);
  return m;
}

/// conv2d (3x3, padding 1) -> batch_norm (eval) -> relu -> max_pool2d (2x2), [2, 3, 16, 16].
inline SampleModel convBnPoolModel() {
  SampleModel m;
  auto& g = m.graph;
  uint32_t x = g.input(wire::DType::Float32, {2, 3, 16, 16}), w = g.input(wire::DType::Float32, {8, 3, 3, 3});
  uint32_t mean = g.input(wire::DType::Float32, {8}), var = g.input(wire::DType::Float32, {8});
  uint32_t gamma = g.input(wire::DType::Float32, {8}), beta = g.input(wire::DType::Float32, {8});
  uint32_t conv = g.op("aten::conv2d", "", {T(x), T(w), None(), Ints({1, 1}), Ints({1, 1})});
  uint32_t bn = g.op("aten::batch_norm", "",
                     {T(conv), T(gamma), T(beta), T(mean), T(var), B(false), D(0.1), D(1e-5), B(false)});
  uint32_t relu = g.op("aten::relu", "", {T(bn)});
  m.output = g.op("aten::max_pool2d", "", {T(relu), Ints({2, 2}), Named("stride", I(2))});
  m.inputs = {at::randn({2, 3, 16, 16}), at::randn({8, 3, 3, 3}), at::randn({8}),
              at::rand({8}) + 0.5, at::randn({8}), at::randn({8})};
  const auto& in = m.inputs;
  m.expected = at::max_pool2d(
      at::relu(at::batch_norm(at::conv2d(in[0], in[1], {}, {1, 1}, {1, 1}), in[4], in[5], in[2], in[3], false, 0.1,
                              1e-5, false)),
      {2, 2}, {2, 2});
  return m;
}

/// Causal scaled_dot_product_attention over [2, 4 heads, 16, 32], heads merged back:
/// transpose(1, 2) and reshape to [2, 16, 128].
inline SampleModel attentionModel() {
  SampleModel m;
  auto& g = m.graph;
  uint32_t q = g.input(wire::DType::Float32, {2, 4, 16, 32}), k = g.input(wire::DType::Float32, {2, 4, 16, 32});
  uint32_t v = g.input(wire::DType::Float32, {2, 4, 16, 32});
  uint32_t out = g.op("aten::scaled_dot_product_attention", "", {T(q), T(k), T(v), None(), D(0.0), B(true)});
  uint32_t t = g.op("aten::transpose", "int", {T(out), I(1), I(2)});
  m.output = g.op("aten::reshape", "", {T(t), Ints({2, 16, 128})});
  m.inputs = {at::randn({2, 4, 16, 32}), at::randn({2, 4, 16, 32}), at::randn({2, 4, 16, 32})};
  const auto& in = m.inputs;
  m.expected =
      at::scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.0, true).transpose(1, 2).reshape({2, 16, 128});
  return m;
}

}  // namespace genie::node::testing
