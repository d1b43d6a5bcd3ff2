"""The names the speed verdict shares: contender keys and measured precision tiers (no torch)."""

# Contender keys; the lineup, the gate, tables and reports refer to contenders by these.
EAGER, COMPILE, CUSTOM, PRECISION_MATCHED = "eager", "compile", "custom", "precision-matched"
# The target branch's ModelNew (--cudaopt-baseline-workdir), timed for the regression check.
TARGET = "target"
PEER_PREFIX = "peer:"

# Measured precision tiers (pytest_cudaopt.compare.precision_tier), best first, and the
# verdict for an output that fits none.
FP32, TF32_LIKE, HALF_LIKE, UNKNOWN = "fp32", "tf32-like", "half-like", "unknown"
TIERS = (FP32, TF32_LIKE, HALF_LIKE)


def below_fp32(tier: str | None) -> bool:
    """True for a measured tier less precise than fp32 ("unknown" is not)."""
    return tier in TIERS[1:]
