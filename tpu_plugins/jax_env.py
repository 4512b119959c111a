"""Import this before jax in every core module that uses JAX.

It settles JAX's platform and simulated device count (runtime.prepare_jax) before JAX
starts, so that on a host with no TPU libtpu is never asked to look for one. It is not done
in the package's __init__ because the framework entry points import the package on every
`import torch` / vLLM / SGLang start, and those programs must stay untouched.
"""

from tpu_plugins import runtime

runtime.prepare_jax()
