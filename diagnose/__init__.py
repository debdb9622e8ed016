"""diagnose: why is my LLM inference slow? Prefill/decode analysis of profiler traces."""

__version__ = "0.1.0"
