"""PyDotCompute's ``core.orchestrator`` names (the package's own objects)."""

from ..orchestrator import ComputeOrchestrator, KernelExecution, KernelLaunchConfig

__all__ = ["ComputeOrchestrator", "KernelLaunchConfig", "KernelExecution"]
