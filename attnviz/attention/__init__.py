"""attnviz's own multi-head attention layer (layer: MultiHeadAttention, split_heads, merge_heads).

The lowest stage: it knows tensors only, not models or texts. attnviz.models builds BERT's
encoder from its split and merge; attnviz.pipeline feeds the layer a BERT layer's input.
"""
