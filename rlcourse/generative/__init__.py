"""Generative models: small flow-matching models on 2-D data and 8x8 digits, and their RL fine-tuning."""
