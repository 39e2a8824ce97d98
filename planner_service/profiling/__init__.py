"""Operator profiling: micro-benchmarks (numpy always; torch on CPU/CUDA when installed;
torch.distributed collectives), PyTorch-profiler trace import, and the profile format (v1,
docs/PROFILE_FORMAT.md).  Calibration from a profile lives in :mod:`cost_model.profiles`."""

from planner_service.profiling.runner import ProfileOptions, run_profile

__all__ = ["ProfileOptions", "run_profile"]
