"""Op numbers of the tensor kernels (csrc/tensor_ops.hpp: UnaryOp, BinaryOp,
ReduceOp), for pywgtrain._core.unary / binary / reduce_axis and friends.
tests/test_tensor_kernels.py checks that these agree with the header."""

UNARY = {
    "copy": 0,
    "neg": 1,
    "abs": 2,
    "exp": 3,
    "log": 4,
    "sqrt": 5,
    "rsqrt": 6,
    "tanh": 7,
    "sigmoid": 8,
    "relu": 9,
    "gelu_erf": 10,
    "gelu_tanh": 11,
    "silu": 12,
    "pow_scalar": 13,  # x ** a
    "clamp": 14,  # clamp(x, a, b)
    "add_scalar": 15,  # x + a
    "mul_scalar": 16,  # x * a
    "rsub_scalar": 17,  # a - x
    "rdiv_scalar": 18,  # a / x
    "sqrt_std": 19,  # sqrt, gradient 0 where the result is 0 (std)
}

BINARY = {
    "add": 0,
    "sub": 1,
    "mul": 2,
    "div": 3,
    "maximum": 4,
    "minimum": 5,
    "pow": 6,
    # comparisons give 1.0 / 0.0
    "gt": 7,
    "lt": 8,
    "ge": 9,
    "le": 10,
    "eq": 11,
    "ne": 12,
    "eq_nan": 13,  # a == b or both NaN
}

REDUCE = {"sum": 0, "max": 1}
