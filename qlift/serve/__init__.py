"""Serving: vLLM processes, recipes, memory plans."""
