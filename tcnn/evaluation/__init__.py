"""Evaluation: scores on clean and corrupted data, the attention analysis of the paper's figures, and plots."""
