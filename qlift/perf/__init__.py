"""Throughput work on vLLM: offline batch inference, serving benchmarks, recipe tuning."""
