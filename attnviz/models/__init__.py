"""The model stage: find a model (a hub id, a local folder or a bundled one: loading, hub, smollm2), read and
check its weights (weight_files), and give each layer's input and attention parameters: attnviz's own BERT encoder
for BERT checkpoints (bert_encoder, with its WordPiece tokenizer in tokens), transformers' model for the other families
(transformers_model, with one adapter per layout of weights in families/). Tokens as shown and the word of every
token live in shown and words. The encoder splits and merges heads with attnviz.attention's functions, so this
package sits above attnviz.attention."""
