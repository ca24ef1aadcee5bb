"""`attnviz position`: attention alone cannot tell word order; position embeddings can.

Permute the tokens, x -> Px, with (Px)_i = x_perm[i]. Without position embeddings a token's
vector is the same wherever it stands, and attention only compares tokens with each other,
so it is permutation-equivariant:

    A(Px) = P A(x) Pᵀ,   that is   A(Px)[i, j] = A(x)[perm[i], perm[j]]

the map of the shuffled text is the original map with rows and columns shuffled alike, and
nothing else changes. BERT adds a position embedding to each token by where it stands, so the
shuffled text gets other vectors and a genuinely different map.

The permutation is applied to the token ids, which are then embedded again: the honest test,
since position embeddings are added by position after the shuffle.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from attnviz.errors import AttnvizError
from attnviz.run_data import UnknownTokens

TOLERANCE = 1e-5  # equivariant means equal within this; float32 rounding is about 1e-7
LAYER = 0  # the layer whose input is the embedding output, where position enters


@dataclass
class PositionSide:
    """One row of the experiment: with or without position embeddings.

    Maps are (H, N, N). permuted is A(Px), with the permuted text's tokens on its axes;
    permuted_back is Pᵀ A(Px) P, on the original tokens' axes, to set beside original.
    """

    positions: bool
    original: np.ndarray
    permuted: np.ndarray
    permuted_back: np.ndarray
    output_difference: float  # max |out(Px) - P out(x)| of the layer's output (N, D)

    @cached_property
    def head_differences(self) -> np.ndarray:
        """(H,) max |A(Px) - P A(x) Pᵀ| of each head (once: the figure, the table and position.json ask for it)."""
        return np.abs(self.permuted_back - self.original).max(axis=(1, 2))

    @property
    def max_difference(self) -> float:
        return float(self.head_differences.max())

    @property
    def equivariant(self) -> bool:
        return self.max_difference <= TOLERANCE


@dataclass
class PositionResult:
    text: str
    model: str
    device: str
    tokens: list[str]
    ids: list[int]
    permutation: list[int]
    head: int  # the head the figure shows
    head_chosen: bool  # True when the user chose it with --head
    without_positions: PositionSide
    with_positions: PositionSide
    notes: list[str]
    shown_tokens: list[str] | None = None  # the tokens as a reader sees them (models/shown.py); None: as made
    fallback_for: str | None = None  # the model asked for, when the bundled one loaded in its place
    unknown: UnknownTokens | None = None  # the text's [UNK] tokens

    @property
    def permuted_tokens(self) -> list[str]:
        return [self.tokens[i] for i in self.permutation]

    @property
    def num_heads(self) -> int:
        return self.with_positions.original.shape[0]


def format_difference(value: float) -> str:
    """ "0.874" for a visible difference, "1.2e-07" for float rounding."""
    return f"{value:.3f}" if value >= 1e-3 else f"{value:.1e}"


def default_permutation(tokens: list[str]) -> list[int]:
    """[CLS] and [SEP] stay in place; the tokens between them are reversed: 0, N-2, ..., 1, N-1."""
    if len(tokens) < 4:
        raise AttnvizError(
            f"the text has {len(tokens) - 2} token between {tokens[0]} and {tokens[-1]}: "
            "there is nothing to reorder; give at least two words"
        )
    return [0, *range(len(tokens) - 2, 0, -1), len(tokens) - 1]


def parse_permutation(spec: str, tokens: list[str]) -> list[int]:
    """ "0,2,1,3" -> [0, 2, 1, 3]: new position i gets the token at old position perm[i]."""
    count = len(tokens)
    expected = f"each of 0 to {count - 1} once (the text has {count} tokens, {tokens[0]} and {tokens[-1]} included)"
    items = [item.strip() for item in spec.split(",")]
    for item in items:
        if not item.isdigit():
            raise AttnvizError(f"--permutation takes token positions such as 0,2,1,3: {item!r} is not a whole number")
    permutation = [int(item) for item in items]
    if sorted(permutation) != list(range(count)):
        missing = sorted(set(range(count)) - set(permutation))
        problem = f"{missing[0]} is missing" if missing else f"it has {len(permutation)} positions"
        raise AttnvizError(f"--permutation must give {expected}; {problem}")
    if permutation == list(range(count)):
        raise AttnvizError("--permutation leaves every token in place: there is nothing to compare; move some")
    return permutation


def permute_encoded(encoded, permutation: list[int]):
    """The same single text with its token ids in the new order: (1, N) tensors, nothing re-tokenized."""
    from attnviz.models.tokens import Encoded

    order = list(permutation)
    return Encoded(
        input_ids=encoded.input_ids[:, order],
        attention_mask=encoded.attention_mask[:, order],
        token_type_ids=encoded.token_type_ids[:, order],
        tokens=[[encoded.tokens[0][i] for i in order]],
        ids=[[encoded.ids[0][i] for i in order]],
        truncations=encoded.truncations,
    )


def position_experiment(
    loaded, text: str, permutation_spec: str | None = None, head: int | None = None, device: str = "cpu"
) -> PositionResult:
    """Run layer 0 (BERT's weights) over the text and its permutation, without and with positions."""
    import torch

    from attnviz.models.tokens import encode, unknown_token_note, unknown_tokens
    from attnviz.layer_inputs import embedding_output
    from attnviz.own_layer import build_layer
    from attnviz.spec import run_spec

    encoded = encode(loaded.tokenizer, [text], loaded.max_positions)
    tokens = encoded.tokens[0]
    permutation = parse_permutation(permutation_spec, tokens) if permutation_spec else default_permutation(tokens)
    if head is not None and not 0 <= head < loaded.num_heads:
        raise AttnvizError(f"--head {head} is out of range: {loaded.name} has heads 0 to {loaded.num_heads - 1}")
    permuted = permute_encoded(encoded, permutation)
    layer = build_layer(loaded, run_spec(loaded, layer=LAYER, device=device))  # BERT's own parameters and heads

    def attend(batch, positions: bool) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            x = embedding_output(loaded, batch, device, positions=positions)  # (1, N, D)
            output, pattern = layer(x)  # (1, N, D), (1, H, N, N)
        return output[0].float().cpu().numpy(), pattern[0].float().cpu().numpy()

    inverse = np.argsort(permutation)  # P^T: old position a sits at new position inverse[a]
    sides = []
    for positions in (False, True):
        output, original = attend(encoded, positions)
        permuted_output, permuted_map = attend(permuted, positions)
        sides.append(
            PositionSide(
                positions=positions,
                original=original,
                permuted=permuted_map,
                permuted_back=permuted_map[:, inverse][:, :, inverse],  # (H, N, N) on the original axes
                output_difference=float(np.abs(permuted_output - output[permutation]).max()),
            )
        )
    without_positions, with_positions = sides
    shown = head if head is not None else int(with_positions.head_differences.argmax())
    notes = [loaded.note, unknown_token_note(loaded.tokenizer, text, encoded.ids[0], loaded.name)]
    return PositionResult(
        text=text,
        model=loaded.name,
        device=device,
        tokens=tokens,
        shown_tokens=encoded.shown[0],
        ids=encoded.ids[0],
        permutation=permutation,
        head=shown,
        head_chosen=head is not None,
        without_positions=without_positions,
        with_positions=with_positions,
        notes=[note for note in notes if note],
        fallback_for=loaded.fallback_for,
        unknown=unknown_tokens(loaded.tokenizer, encoded.ids[0]),
    )
