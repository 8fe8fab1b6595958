"""Using a trained model: generation with the KV cache (generation.py), and loading a run's
workdir or a Hugging Face folder for generation or evaluation (loading.py).
"""
