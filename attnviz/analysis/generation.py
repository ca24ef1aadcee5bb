"""Generation step by step (`attnviz generate`): a decoder continues a prompt, and every generated token's attention
over everything before it is kept, per layer and head.

The model generates as it would (transformers' forward pass with its key/value cache, TransformersModel.decode):
greedy, the most likely next token, or sampled from the next-token distribution with a seed. At each pass attnviz's
own layers (the model's projections, pipeline.build_layers) read what entered each attention module, with their
own key/value cache (MultiHeadAttention.step): the new token's row of weights over the prompt and the tokens
generated so far. The prompt's pass fills the caches; each generated token is read once more (the last one too,
for its row), so a continuation of n tokens makes n rows per head, each over P + i + 1 tokens. A token that ends a
text (the checkpoint's eos_token_id) ends the continuation, as transformers' generate stops there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOKENS = 1024  # generated tokens at most
ROWS_BYTES = 2**30  # the rows of every layer and head, (L, H, n, P + n) in float32, are kept: past this, refused


@dataclass
class Generation:
    """A prompt and its continuation: ids, tokens as shown, and rows (L, H, n, P + n) in float32: row i is generated
    token i's weights over the P prompt tokens and the generated ones (0 past itself)."""

    prompt: str
    prompt_ids: list[int]
    ids: list[int]  # the generated ids
    continuation: str  # the generated ids decoded
    shown_tokens: list[str]  # prompt then continuation, as figures and tables show them
    rows: np.ndarray
    model: str
    sample: bool = False
    seed: int | None = None

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)


def generate(loaded, prompt: str, spec, num_tokens: int, sample: bool = False, seed: int = 0) -> Generation:
    """Continue prompt by num_tokens tokens with the decoder loaded (greedy, or sampled from seed) and keep every
    generated token's attention rows, per layer and head (attnviz's layers with the model's projections)."""
    import torch

    from attnviz.errors import AttnvizError
    from attnviz.layer_inputs import encode_texts
    from attnviz.models.families import DECODER
    from attnviz.pipeline import build_layers

    if loaded.family.kind != DECODER:
        raise AttnvizError(f"generate continues a text with a decoder (GPT-2, Llama's layout); {loaded.name} is {loaded.family.kind} ({loaded.family.name})")
    if not 1 <= num_tokens <= MAX_TOKENS:
        raise AttnvizError(f"tokens {num_tokens}: generate makes 1 to {MAX_TOKENS:,} tokens")
    encoded = encode_texts(loaded, [prompt], spec)
    ids = encoded.queries.input_ids.to(spec.device)  # (1, P)
    total = ids.shape[1] + num_tokens
    if total > loaded.max_positions:
        raise AttnvizError(f"the prompt's {ids.shape[1]} tokens and {num_tokens} more pass the model's {loaded.max_positions:,} positions")
    layers = build_layers(loaded, spec)
    rows_bytes = 4 * len(layers) * layers[0].num_heads * num_tokens * total
    if rows_bytes > ROWS_BYTES:
        most = ROWS_BYTES // (4 * len(layers) * layers[0].num_heads * total)
        raise AttnvizError(
            f"{num_tokens} tokens after a prompt of {ids.shape[1]:,}: every layer and head's rows would take "
            f"{rows_bytes / 2**30:.1f} GB, more than {ROWS_BYTES / 2**30:g} GB; "
            + (f"give --tokens {most} or fewer" if most >= 1 else "give a shorter prompt")
        )
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def choose(logits) -> int:
        if not sample:
            return int(logits.argmax())
        return int(torch.multinomial(torch.softmax(logits.double().cpu(), dim=-1), 1, generator=generator))

    rows = np.zeros((len(layers), layers[0].num_heads, num_tokens, total), dtype=np.float32)
    caches = [None] * len(layers)
    generated: list[int] = []
    with torch.inference_mode():
        for step, (read, entering) in enumerate(loaded.model.decode(ids, num_tokens, choose)):
            if step:
                generated.append(int(read[0, 0]))
            for layer, (attention, hidden) in enumerate(zip(layers, entering)):
                _, weights, caches[layer] = attention.step(hidden, caches[layer], attend=step > 0)  # the prompt's: the cache alone
                if step:  # a generated token's row (1, H, 1, T)
                    rows[layer, :, step - 1, : weights.shape[-1]] = weights[0, :, -1].float().cpu().numpy()
    rows = rows[:, :, : len(generated), : ids.shape[1] + len(generated)]  # fewer, where a text-ending token came
    from attnviz.models.tokens import shown_rows

    every = ids[0].tolist() + generated
    return Generation(
        prompt=prompt,
        prompt_ids=ids[0].tolist(),
        ids=generated,
        continuation=loaded.tokenizer.decode(generated),
        shown_tokens=shown_rows(loaded.tokenizer, [_tokens(loaded.tokenizer, every)], None)[0],
        rows=rows,
        model=loaded.name,
        sample=sample,
        seed=seed if sample else None,
    )


def _tokens(tokenizer, ids: list[int]) -> list[str]:
    """The tokens of ids; an id past the tokenizer's vocabulary (a model's embedding table may have more rows) as
    "<|id 1234|>", which models/shown.py shows as it is."""
    return [token if token is not None else f"<|id {index}|>" for token, index in zip(tokenizer.convert_ids_to_tokens(ids), ids)]
