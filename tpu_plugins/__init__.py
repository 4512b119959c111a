"""tpu-plugins core: device discovery, meshes, and (later) kernels, models and the engine.

Knows nothing of vLLM, SGLang or transformers; the adapters translate their objects into
calls on this package.
"""

__version__ = "0.1.0"
