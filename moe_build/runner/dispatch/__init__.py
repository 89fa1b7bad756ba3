"""Expert parallelism's dispatch and combine (seed 000's prepare/finalize side of an expert-parallel layer): how
a rank's tokens reach the ranks holding their experts, and how the experts' partial outputs come back."""
from .nccl import Dispatched, NcclDispatch
from .nvlink import NvlinkDispatch, NvlinkDispatched
from .permuted import PermutedDispatched, PermuteLayout

__all__ = ["Dispatched", "NcclDispatch", "NvlinkDispatch", "NvlinkDispatched", "PermutedDispatched", "PermuteLayout"]
