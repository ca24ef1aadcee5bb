"""The model stage: find and load a BERT checkpoint (loading, checkpoint), the encoder built from it
(bert), and its WordPiece tokenizer (tokens). The encoder's attention splits and merges heads with
attnviz.attention's functions, so this package sits above attnviz.attention."""
