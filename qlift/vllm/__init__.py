"""What every stage that runs vLLM shares: its argument names, its server process, its worker processes."""
