"""Generation step by step (`attnviz generate`): a decoder continues a prompt, and the attention around every
generated token is kept, per layer and head.

The model generates as it would (transformers' forward pass with its key/value cache, TransformersModel.decode):
greedy, the most likely next token, or sampled from the next-token distribution with a seed. At each pass attnviz's
own layers (the model's projections, own_layer.build_layers) read what entered each attention module, with their
own key/value cache (MultiHeadAttention.step). Two rows belong to generated token t (ROWS):

- chosen: the row that chose it, that of the position that predicted it (the prompt's last token for t = 0), over
  the prompt and the tokens generated before t: what transformers' generate(output_attentions=True) gives at step
  t as its last row, and what inseq attributes a token to;
- read: its own row as a query, over the prompt, the tokens before it and itself (the row that chose token t + 1).

Both are the rows of the positions P - 1 .. P + n - 1, kept once (Generation.query_rows): the prompt's pass fills
the caches with its first P - 1 tokens and attends from its last one alone (no (P, P) of scores), and each
generated token is read once more (the last one too, for its row). A token that ends a text (the checkpoint's
eos_token_id) ends the continuation, as transformers' generate stops there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnviz.run_data import Progress

MAX_TOKENS = 1024  # generated tokens at most
ROWS_BYTES = 2**30  # the rows of every layer and head, (L, H, n + 1, P + n) in float32, are kept: past this, refused
CHOSEN, READ = "chosen", "read"
ROWS = {  # which row of each generated token: its name and what it is, as every face says it
    CHOSEN: "the row that chose each token: that of the token before it",
    READ: "each generated token's own row, as the query",
}


@dataclass
class Generation:
    """A prompt and its continuation: ids, tokens as shown, and query_rows (L, H, n + 1, P + n) in float32: the rows
    of the positions P - 1 .. P + n - 1 (the prompt's last token, then each generated token as the query), each over
    the P prompt tokens and the generated ones (0 past its query). rows(CHOSEN) and rows(READ) are their n rows of
    each generated token."""

    prompt: str
    prompt_ids: list[int]
    ids: list[int]  # the generated ids
    continuation: str  # the generated ids decoded
    shown_tokens: list[str]  # prompt then continuation, as figures and tables show them
    query_rows: np.ndarray
    model: str
    sample: bool = False
    seed: int | None = None

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    def rows(self, which: str = CHOSEN) -> np.ndarray:
        """(L, H, n, P + n): row t is generated token t's row of that kind (ROWS): CHOSEN, the row of position
        P - 1 + t, that chose it; READ, the row of position P + t, its own."""
        return self.query_rows[:, :, :-1] if which == CHOSEN else self.query_rows[:, :, 1:]

    def queries(self, which: str = CHOSEN) -> np.ndarray:
        """(n,) the position of each row's query: P - 1 + t for CHOSEN, P + t for READ."""
        return self.num_prompt - (which == CHOSEN) + np.arange(len(self.ids))


def generate(
    loaded, prompt: str, spec, num_tokens: int, sample: bool = False, seed: int = 0, progress: Progress = Progress()
) -> Generation:
    """Continue prompt by num_tokens tokens with the decoder loaded (greedy, or sampled from seed) and keep the rows
    of the prompt's last token and of every generated token, per layer and head (attnviz's layers with the model's
    projections). progress: the tokens generated (fewer than num_tokens where a text-ending token comes)."""
    import torch

    from attnviz.errors import AttnvizError
    from attnviz.layer_inputs import encode_texts
    from attnviz.own_layer import build_layers

    check_decoder(loaded, "generate")
    if not 1 <= num_tokens <= MAX_TOKENS:
        raise AttnvizError(f"tokens {num_tokens}: generate makes 1 to {MAX_TOKENS:,} tokens")
    encoded = encode_texts(loaded, [prompt], spec)
    ids = encoded.queries.input_ids.to(spec.device)  # (1, P)
    total = ids.shape[1] + num_tokens
    if total > loaded.max_positions:
        raise AttnvizError(f"the prompt's {ids.shape[1]} tokens and {num_tokens} more pass the model's {loaded.max_positions:,} positions")
    layers = build_layers(loaded, spec)
    rows_bytes = 4 * len(layers) * layers[0].num_heads * (num_tokens + 1) * total
    if rows_bytes > ROWS_BYTES:
        most = ROWS_BYTES // (4 * len(layers) * layers[0].num_heads * total) - 1
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

    query_rows = np.zeros((len(layers), layers[0].num_heads, num_tokens + 1, total), dtype=np.float32)
    caches = [None] * len(layers)
    generated: list[int] = []
    advance = progress.counting("tokens generated", num_tokens)
    with torch.inference_mode():
        for step, (read, entering) in enumerate(loaded.model.decode(ids, num_tokens, choose)):
            if step:
                generated.append(int(read[0, 0]))
                advance(1)
            for layer, (attention, hidden) in enumerate(zip(layers, entering)):
                if not step:  # the prompt (1, P, D): its first P - 1 tokens fill the cache, its last one attends
                    _, _, caches[layer] = attention.step(hidden[:, :-1], None, attend=False)
                    hidden = hidden[:, -1:]  # (1, 1, D)
                _, weights, caches[layer] = attention.step(hidden, caches[layer])  # (1, H, 1, P + step)
                query_rows[layer, :, step, : weights.shape[-1]] = weights[0, :, -1].float().cpu().numpy()
    query_rows = query_rows[:, :, : len(generated) + 1, : ids.shape[1] + len(generated)]  # fewer, where a text-ending token came
    from attnviz.models.tokens import shown_rows

    every = ids[0].tolist() + generated
    return Generation(
        prompt=prompt,
        prompt_ids=ids[0].tolist(),
        ids=generated,
        continuation=loaded.tokenizer.decode(generated),
        shown_tokens=shown_rows(loaded.tokenizer, [_tokens(loaded.tokenizer, every)], None)[0],
        query_rows=query_rows,
        model=loaded.name,
        sample=sample,
        seed=seed if sample else None,
    )


def check_decoder(loaded, command: str) -> None:
    """Refuse a model that is no decoder: command continues a text with one."""
    from attnviz.errors import AttnvizError
    from attnviz.models.families import DECODER

    if loaded.family.kind != DECODER:
        raise AttnvizError(f"{command} continues a text with a decoder (GPT-2, Llama's layout); {loaded.name} is {loaded.family.kind} ({loaded.family.name})")


def _tokens(tokenizer, ids: list[int]) -> list[str]:
    """The tokens of ids; an id past the tokenizer's vocabulary (a model's embedding table may have more rows) as
    "<|id 1234|>", which models/shown.py shows as it is."""
    return [token if token is not None else f"<|id {index}|>" for token, index in zip(tokenizer.convert_ids_to_tokens(ids), ids)]
