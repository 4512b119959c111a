"""JAX models written against the core's layers, configured from a Hugging Face config.json."""
