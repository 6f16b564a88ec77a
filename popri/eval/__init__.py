"""Evaluation: the downstream model (training and next-token accuracy) and its statistics."""
