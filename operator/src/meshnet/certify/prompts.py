"""The fixed prompt set every certification runs: short, varied, and the same forever, so
certificates of different lanes compare like with like."""

from __future__ import annotations

PROMPTS: tuple[str, ...] = (
    "The three primary colors are",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Question: What is the capital of France?\nAnswer:",
    "Once upon a time, in a village by the sea,",
)
