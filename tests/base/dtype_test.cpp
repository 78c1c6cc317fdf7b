#include <gtest/gtest.h>

#include <cmath>

#include "base/dtype.h"

namespace m3 {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), f32_to_bf16(1.0f));        // exact tie → even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), f32_to_bf16(1.0f + 4.0f / 256));  // tie → even (up)
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

TEST(DType, F16RoundTripsRepresentableValues) {
  for (float v : {0.f, 1.f, -2.5f, 65504.f, 6.103515625e-05f, 5.960464477539063e-08f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
}

TEST(DType, E4m3DecodesTheOcpTable) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.f);             // exp 7, man 0
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.f);           // max finite
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0xb8), -1.f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  for (int v = 0; v < 256; ++v) {
    if ((v & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(uint8_t(v))) & 0x7f, v & 0x7f) << v;
  }
  EXPECT_EQ(f32_to_e4m3(1000.f), 0x7e);  // saturates
}

TEST(DType, Ue8m0IsAPowerOfTwo) {
  EXPECT_EQ(ue8m0_to_f32(127), 1.f);
  EXPECT_EQ(ue8m0_to_f32(130), 8.f);
  EXPECT_EQ(ue8m0_to_f32(120), std::ldexp(1.f, -7));
  EXPECT_TRUE(std::isnan(ue8m0_to_f32(255)));
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::F8_E4M3, DType::U8, DType::I32}) {
    DType back;
    ASSERT_TRUE(dtype_from_name(dtype_name(t), &back));
    EXPECT_EQ(back, t);
  }
  DType x;
  EXPECT_FALSE(dtype_from_name("F4", &x));
}

}  // namespace
}  // namespace m3
