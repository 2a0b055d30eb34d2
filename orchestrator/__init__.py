"""orch: describe a distributed PyTorch training job once, run it locally or on Kubernetes, and watch it.

This module imports nothing heavy: `orch --help` must stay fast.
"""

__version__ = "0.1.0"
