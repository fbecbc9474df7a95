"""Real models' configs and the rules that refuse a layer.

``config`` reads a model's config (fifteen real models ship in ``data/models/``; each
family's reader says which keys it takes) into ``ModelConfig``; ``refusals`` holds the
rules frink-models applies before it fuses an attention tail, every one that holds for a
layer with its reason.
"""
