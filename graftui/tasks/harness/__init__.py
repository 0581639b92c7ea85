"""lm-evaluation-harness tasks: their training documents, and a model in memory scored by the harness itself."""
