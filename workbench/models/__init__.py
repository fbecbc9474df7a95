"""Real models' configs and the rules that refuse a layer.

``config`` holds what the rules ask about a model (``ModelConfig``, one ``LayerConfig`` a
layer); ``families`` reads a Hugging Face ``config.json`` into it, one reader a family
(each says which keys it takes); ``loader`` loads the fifteen real models shipped in
``data/models/`` by name; ``refusals`` holds the rules frink-models applies before it
fuses an attention tail, every one that holds for a layer with its reason.
"""
