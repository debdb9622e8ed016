"""Normalized trace model and loaders."""
from diagnose.trace.load import load_trace
from diagnose.trace.model import DeviceInfo, QualityIssue, Trace

__all__ = ["load_trace", "Trace", "DeviceInfo", "QualityIssue"]
