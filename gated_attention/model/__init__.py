"""The model: the variant space (variants.py), its description (model_config.py), the layers
(layers/), the transformer (transformer.py), what it exposes to analysis (capture.py), the
numbers read off it (reductions.py: F-Attn, M-Act; accounting.py: parameters and FLOPs), and
initialisation by parameter name (init_by_name.py).
"""
