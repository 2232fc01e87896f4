// The one table between wire::DType and c10::ScalarType, for the code that includes torch
// headers (the node's executor, the Python extension). Header-only: it needs only c10.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

#include "genie/wire/genie_generated.h"

namespace genie::wire {

struct TorchDTypePair {
  DType wire;
  c10::ScalarType torch;
};

/// Every wire dtype and its torch scalar type (DType::Undefined has none).
inline constexpr TorchDTypePair kTorchDTypes[] = {
    {DType::Float32, c10::ScalarType::Float},
    {DType::Float64, c10::ScalarType::Double},
    {DType::Float16, c10::ScalarType::Half},
    {DType::BFloat16, c10::ScalarType::BFloat16},
    {DType::Int8, c10::ScalarType::Char},
    {DType::Int16, c10::ScalarType::Short},
    {DType::Int32, c10::ScalarType::Int},
    {DType::Int64, c10::ScalarType::Long},
    {DType::UInt8, c10::ScalarType::Byte},
    {DType::Bool, c10::ScalarType::Bool},
    {DType::Complex64, c10::ScalarType::ComplexFloat},
    {DType::Complex128, c10::ScalarType::ComplexDouble},
    {DType::Float8_e4m3fn, c10::ScalarType::Float8_e4m3fn},
    {DType::Float8_e5m2, c10::ScalarType::Float8_e5m2},
    {DType::UInt16, c10::ScalarType::UInt16},
    {DType::UInt32, c10::ScalarType::UInt32},
    {DType::UInt64, c10::ScalarType::UInt64},
    {DType::ComplexHalf, c10::ScalarType::ComplexHalf},
    {DType::Float8_e4m3fnuz, c10::ScalarType::Float8_e4m3fnuz},
    {DType::Float8_e5m2fnuz, c10::ScalarType::Float8_e5m2fnuz},
    {DType::Float8_e8m0fnu, c10::ScalarType::Float8_e8m0fnu},
    {DType::Float4_e2m1fn_x2, c10::ScalarType::Float4_e2m1fn_x2},
    {DType::Bits1x8, c10::ScalarType::Bits1x8},
    {DType::Bits2x4, c10::ScalarType::Bits2x4},
    {DType::Bits4x2, c10::ScalarType::Bits4x2},
    {DType::Bits8, c10::ScalarType::Bits8},
    {DType::Bits16, c10::ScalarType::Bits16},
    {DType::QInt8, c10::ScalarType::QInt8},
    {DType::QUInt8, c10::ScalarType::QUInt8},
    {DType::QInt32, c10::ScalarType::QInt32},
    {DType::QUInt4x2, c10::ScalarType::QUInt4x2},
    {DType::QUInt2x4, c10::ScalarType::QUInt2x4},
};

/// The torch scalar type of a wire dtype; nullopt for Undefined and values outside the enum.
inline std::optional<c10::ScalarType> torchScalarType(DType dtype) {
  for (const auto& pair : kTorchDTypes) {
    if (pair.wire == dtype) return pair.torch;
  }
  return std::nullopt;
}

/// The wire dtype of a torch scalar type; DType::Undefined when the wire has none.
inline DType wireDTypeOf(c10::ScalarType type) {
  for (const auto& pair : kTorchDTypes) {
    if (pair.torch == type) return pair.wire;
  }
  return DType::Undefined;
}

}  // namespace genie::wire
