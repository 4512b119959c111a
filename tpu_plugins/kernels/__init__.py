"""Kernels: each ships its TPU implementation, a reference with the same signature, and validation."""
