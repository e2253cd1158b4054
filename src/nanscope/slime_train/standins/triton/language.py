"""Stand-in for triton.language (slime utils/fp8_kernel.py:3): the names its kernels' signatures use."""

constexpr = int
