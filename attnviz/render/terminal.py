"""Terminal renderers: Rich tables for a run, its tokens, its heads and the files written."""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.columns import Columns
from rich.console import Console
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from attnviz.analysis.statistics import CAUSAL_OVER_BIDIRECTIONAL, HeadSummary, model_causal_words
from attnviz.models.shown import marks_legend
from attnviz.render.titles import counted, quoted, resplit_words, run_kv_heads_words, stack_words
from attnviz.run_data import AttentionRun

MAX_TOKENS_SHOWN = 64
TOKEN_LEGEND = "index token id (index 0 is [CLS])"
MAX_TOP_KEYS_SHOWN = MAX_TOKENS_SHOWN  # queries of one head in the heads table (--head N); attention.json has them all
MAX_TOP_KEYS_PER_HEAD = 16  # queries per head in the table of every head: a sentence whole, a long text's table bounded
RELATIVE_ENTROPY_LEGEND = "rel.: entropy / log(keys the query may see), mean over queries: 1 uniform, 0 one key"
CAUSAL_VISIBLE_KEYS = "causal: query i sees keys 0..i, query 0 left out"


def print_notes(console: Console, notes: list[str], most: int | None = None, where: str = "") -> None:
    """Each note once, in order, as "note: ..."; past the first `most`, one line "… and 3 more notes" (and `where`)."""
    distinct = list(dict.fromkeys(notes))
    shown = distinct if most is None else distinct[:most]
    for note in shown:
        console.print(Text(f"note: {note}", style="yellow"))
    if len(distinct) > len(shown):
        console.print(Text(f"note: {more_notes(len(distinct) - len(shown))}{where}", style="yellow"))


def more_notes(count: int) -> str:
    """ "… and 1 more note", "… and 3 more notes": the one wording for notes left out."""
    return f"… and {counted(count, 'more note')}"


def print_setup(
    console: Console,
    run: AttentionRun,
    source: str,
    device_label: str,
    num_layers: int | None = None,
    num_texts: int | None = None,
    seed: int | None = None,
) -> None:
    """The model, layer, heads, parameters and device of a run; num_layers for runs over every layer.

    seed: the seed of random parameters (--weights random --seed S).
    """
    setup = Table.grid(padding=(0, 2))
    quantised = f", {run.quantisation.short}" if run.quantisation is not None else ""
    setup.add_row("model", Text(run.model).append(f" ({run.family}, {source}{quantised})", style="dim"))
    if run.stack is not None:  # an encoder-decoder's: which of its attentions
        setup.add_row("attention", stack_words(run.stack, quoted(run.kv_text) if run.kv_text else None))
    if num_layers is None:
        setup.add_row("layer", str(run.layer))
    else:
        setup.add_row("layers", f"all {num_layers}, each on its own input from one {run.family} pass")
    kv_heads = run_kv_heads_words(run)
    heads = f"{run.num_heads} × d={run.head_dim}"
    if run.re_split:  # --heads: the trained projections, split another way
        heads += f", re-split from the trained {run.model_heads} × d={run.head_dim * run.num_heads // run.model_heads}"
    setup.add_row("heads", heads + (f", {kv_heads}" if kv_heads else ""))
    parameters = parameters_label(run.weights, seed)
    if run.re_split:
        parameters = parameters.removesuffix(")") + f", split into {run.num_heads} heads in place of its {run.model_heads})"
    setup.add_row("parameters", parameters)
    if run.quantisation is not None:
        setup.add_row("weights", run.quantisation.detail)
    if run.model_causal:
        setup.add_row("mask", f"causal, the model's own: {model_causal_words(run.family, run.stack)}")
    elif run.causal:
        mask = "causal: each query sees itself and the keys before it"
        if num_layers is not None or run.layer > 0:  # the layer's input comes from a bidirectional pass
            mask += f"; a {CAUSAL_OVER_BIDIRECTIONAL}"
        setup.add_row("mask", mask)
    setup.add_row("device", device_label + dtype_words(run))
    if num_texts is not None:
        setup.add_row("texts", f"{num_texts}, statistics averaged over them" if num_texts > 1 else "1")
        if run.words is not None:  # stats --words
            setup.add_row("over", "words: " + WORDS_LEGEND.removeprefix("maps over words: "))
    console.print(setup)


def dtype_words(run: AttentionRun) -> str:
    """", bfloat16" after the device when the run computed in half precision (--dtype); nothing for float32."""
    return f", {run.dtype}" if run.dtype != "float32" else ""


def parameters_label(weights: str, seed: int | None = None) -> str:
    """What --weights chose: the layer's parameters (W_q, W_k, W_v, W_o), not the attention weights."""
    if weights == "random":
        return "random" + (f", seed {seed}" if seed is not None else "")
    return f"{weights} (the model's own W_q, W_k, W_v, W_o)"


WORDS_LEGEND = "maps over words: attention to a word is the sum over its tokens, from a word the mean (Clark et al. 2019)"


def token_cells(tokens: list[str], ids: list[int]) -> Columns:
    """'0 [CLS] 101' per token, laid out in columns that never split a token; long texts cut."""
    return _shown_cells([
        Text.assemble((f"{index} ", "dim"), (token, "bold"), (f" {token_id}", "dim"))
        for index, (token, token_id) in enumerate(zip(tokens, ids))
    ])


def _shown_cells(cells: list[Text]) -> Columns:
    """The first MAX_TOKENS_SHOWN cells in columns, and how many more there are."""
    more = [Text(f"… {len(cells) - MAX_TOKENS_SHOWN} more", style="dim")] if len(cells) > MAX_TOKENS_SHOWN else []
    return Columns(cells[:MAX_TOKENS_SHOWN] + more, padding=(0, 2))


def token_legend(run: AttentionRun) -> str:
    """What the token cells hold, and what index 0 is where the family says: BERT's [CLS], a decoder stack's start token."""
    if run.family == "BERT":
        return TOKEN_LEGEND
    if run.stack in ("decoder", "cross"):  # the decoder reads the text shifted right, after its start token
        return f"index token id (index 0, {run.shown_tokens[0][0]}, is the decoder's start token)"
    return "index token id"


def print_tokens(console: Console, run: AttentionRun) -> None:
    """The tokens with their index and id; with --words, each word with the tokens it merges (word_cells)."""
    cross = run.kv_text or run.stack == "cross"  # cross-attention: the keys are another text's or the encoder's tokens
    words = run.words
    noun, legend = ("words", f"index word = its tokens; {WORDS_LEGEND}") if words else ("tokens", token_legend(run))
    (query_tokens, key_tokens), (query_pieces, key_pieces) = run.shown_tokens, run.shown_tokenizer_tokens
    marks = marks_legend([*query_pieces, *key_pieces])  # "␣ a space; 我¹/₂ part 1 of a character split over 2 tokens"
    legend += f"; {marks}" if marks else ""
    console.print(Text.assemble((f"query {noun}" if cross else noun, "bold underline"), (f"  {legend}", "dim")))
    if words:
        console.print(word_cells(words.query_plain_words, query_pieces, words.query_word))  # the pieces say what the model saw
    else:
        console.print(token_cells(query_tokens, run.query_ids))
    if cross:
        console.print(Text(f"key/value {noun}", style="bold underline"))
        console.print(word_cells(words.key_plain_words, key_pieces, words.key_word) if words else token_cells(key_tokens, run.key_ids))


def word_cells(labels: list[str], tokens: list[str], token_words: list[int]) -> Columns:
    """'4 酸菜鱼 = 酸 [UNK] 鱼' per word (a word that is its one token: '1 我'), in columns; long texts cut."""
    pieces: list[list[str]] = [[] for _ in labels]
    for token, word in zip(tokens, token_words):
        pieces[word].append(token)
    return _shown_cells([
        Text.assemble((f"{index} ", "dim"), (label, "bold"), (f" = {' '.join(parts)}" if parts != [label] else "", "dim"))
        for index, (label, parts) in enumerate(zip(labels, pieces))
    ])


def indexed(index: int, token: str) -> str:
    """ "3:the": a token with its index, so that a repeated token is never ambiguous (0 is [CLS])."""
    return f"{index}:{token}"


def top_keys_text(summary: HeadSummary, run: AttentionRun, most: int = MAX_TOP_KEYS_PER_HEAD) -> Text:
    """ "0:[CLS]→0:[CLS] 1:the→3:cat …": each query (the first `most`) and the key it attends to most, by index."""
    pairs = [
        f"{indexed(query, run.shown_tokens[0][query])}→{indexed(key, run.shown_tokens[1][key])}"
        for query, key in enumerate(summary.top_keys[:most])
    ]
    more = len(summary.top_keys) - most
    if more > 0:
        pairs.append(f"… {more} more")  # the caption says where they are
    return Text("  ".join(pairs))  # wraps between pairs, never inside one


def effect_columns(effects) -> list[str]:
    """The effect columns' names (analysis/effect.py's EFFECTS' short names): "KL", "Δloss"; "cos", "pooled"."""
    from attnviz.analysis.effect import EFFECTS

    return [EFFECTS[name][0] for name in effects.names] if effects is not None else []


def effect_cells(effects, layer: int, head: int) -> list[str]:
    """A head's effect columns (effect_columns), 4 decimals each: the heads table's and the notebook's."""
    return [f"{effects.values[name][layer, head]:.4f}" for name in effects.names]


def effects_legend(effects) -> str:
    """What the effect columns are, short (analysis/effect.py and attention.json define them in full)."""
    from attnviz.analysis.effect import EFFECTS, TAKEN_OUT

    what = [f"{EFFECTS[name][0]}: {EFFECTS[name][1]}" for name in effects.names]
    if effects.loss is not None:
        what[-1] += f" (with every head {effects.loss:.4f})"
    if effects.pooling is not None:
        what[-1] += f" ({effects.pooling} pooling, the model's own)"
    return (
        f"{', '.join(effect_columns(effects))}: the head taken out (its output {TAKEN_OUT[effects.ablation]}) and the "
        f"model run again; {'; '.join(what)}"
    )


def heads_table(run: AttentionRun, summaries: list[HeadSummary], most: int = MAX_TOP_KEYS_PER_HEAD, effects=None) -> Table:
    """A row per head of summaries (every head, or --head's one): entropy, rel., mean max, with effects
    (analysis.effect.HeadEffects, --effect) each head's KL and loss change, then the first `most` queries' top keys."""
    title = "heads" if len(summaries) == run.num_heads else f"{counted(len(summaries), 'head')} of {run.num_heads}"
    if run.re_split:
        title += f" ({resplit_words(run)})"
    table = Table(title=title, title_justify="left")
    for name in ("head", "entropy", "rel.", "mean max", *effect_columns(effects)):
        table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    if run.head_roles is not None:  # attnviz.roles' labels (HeadsResult.with_roles)
        table.add_column("roles")
    noun = "word" if run.words is not None else "token"  # --words: the rows and columns are words
    table.add_column(f"query → the key it attends to most (index:{noun})", overflow="fold")
    for summary in summaries:
        measured = effect_cells(effects, run.layer, summary.head) if effects is not None else []
        table.add_row(
            str(summary.head),
            f"{summary.entropy:.2f}",
            f"{summary.relative_entropy:.2f}",
            f"{summary.mean_max:.2f}",
            *measured,
            *([", ".join(run.head_roles[summary.head]) or "none"] if run.head_roles is not None else []),
            top_keys_text(summary, run, most),
        )
    relative = RELATIVE_ENTROPY_LEGEND + (f" ({CAUSAL_VISIBLE_KEYS})" if run.causal else "")
    table.caption = f"entropy: of each row in nats, mean over queries; {relative}; mean max: the mean of the row maxima"
    if effects is not None:
        table.caption += "\n" + effects_legend(effects)
    if len(run.query_tokens) > most:
        shown = f"queries 0 to {most - 1} of {len(run.query_tokens)}{' words' if run.words is not None else ''} shown"
        table.caption += f"\n{shown}; attention.json has every query of every head"
    table.caption_justify = "left"
    return table


def print_files(console: Console, folder: Path, files: list[Path]) -> None:
    """The run folder and the files written into it; on a quiet console (--quiet), the folder's path alone."""
    if console.quiet:
        print(folder, file=console.file)  # for scripts: open "$(attnviz heads TEXT -q)/heads.png"
        return
    console.print(Text("files written", style="bold underline"))
    console.print(Text(f"{folder}/"))
    for line in indented_lines([path.name for path in files], console.width):
        console.print(Text(line), soft_wrap=True)


def indented_lines(words: list[str], width: int, indent: str = "  ", gap: str = "  ") -> list[str]:
    """words filled into lines of at most `width` terminal cells, each line indented (a word longer stays whole)."""
    lines = [indent]
    for word in words:
        if lines[-1] != indent and cell_len(lines[-1] + gap + word) > width:
            lines.append(indent)
        lines[-1] += (gap if lines[-1] != indent else "") + word
    return lines


def models_table(models, default: str, fallback: str | None, install_fallback: str = "") -> Table:
    """One row per model: where it comes from, whether it loads offline, its family and sizes; the default marked.

    An encoder-decoder's layers and heads read encoder / decoder. fallback: what runs instead of
    the default offline, before its download (None: not installed, install_fallback says how).
    """
    # No column borders, so that eight columns leave the names room on an 80-column terminal.
    table = Table(
        title="models you can use now", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True
    )
    numbers = ("layers", "heads", "KV heads", "hidden", "vocab")
    table.add_column("name", overflow="fold")  # what --model takes: folded onto more lines, never cut short
    for column in ("source", "family", *numbers):
        table.add_column(column, justify="right" if column in numbers else "left")
    for info in models:
        # No encoder-decoder family groups its key/value heads: the decoder's equal its heads.
        table.add_row(
            Text(info.name).append("\n(default)" if info.name == default else "", style="bold"),
            info.source if info.offline else Text(info.source, style="yellow"),
            info.family,
            _per_stack(info.num_layers, info.decoder_layers),
            _per_stack(info.num_heads, info.decoder_heads),
            _per_stack(info.num_kv_heads, info.decoder_heads),
            str(info.hidden_size),
            str(info.vocab_size),
        )
    table.caption = (
        "(default): used without --model. Bundled and hub cache models load offline; "
        + ("" if any(info.name == default and info.offline for info in models) else
           "hub: not downloaded yet, attnviz downloads it on first use when online, offline "
           + (f"the bundled {fallback} runs instead (English vocabulary). " if fallback else
              f"it fails: the offline fallback is not installed ({install_fallback}). "))
        + "Use one with --model NAME; any hub id downloads when online, any local folder of a supported family works. "
        "KV heads fewer than heads: query heads share key/value heads (grouped-query attention). "
        "encoder-decoders: encoder / decoder"
    )  # fmt: skip
    table.caption_justify = "left"
    return table


def _per_stack(encoder: int, decoder: int | None) -> str:
    """'12', or an encoder-decoder's '12 / 6'."""
    return str(encoder) if decoder is None else f"{encoder} / {decoder}"


# ---- `attnviz compare`, `heads --file` and `attnviz position` ------------------------------------


def print_compare_setup(
    console: Console, run: AttentionRun, source: str, device_label: str, weights: list[str], seed: int | None = None
) -> None:
    setup = Table.grid(padding=(0, 2))
    setup.add_row("model", Text(run.model).append(f" ({source})", style="dim"))
    setup.add_row("layer", f"{run.layer}: the same W_q, W_k, W_v for every head count")
    setup.add_row("parameters", "; ".join(parameters_label(each, seed) for each in weights))
    setup.add_row("device", device_label + dtype_words(run))
    console.print(setup)


def compare_table(splits) -> Table:
    """One row per (weights, head count): how spread out its heads are; the re-split note under it."""
    from attnviz.analysis.compare import resplit_note

    table = Table(title="one projection, split into heads", title_justify="left")
    table.add_column("parameters")
    for name in ("heads", "d", "rel.", "min", "max", "mean max"):
        table.add_column(name, justify="right", no_wrap=True)
    for index, split in enumerate(splits):
        last_of_its_weights = index + 1 < len(splits) and splits[index + 1].weights != split.weights
        table.add_row(
            split.weights,
            str(split.num_heads),
            str(split.run.head_dim),
            f"{split.mean_relative_entropy:.2f}",
            f"{split.most_focused.relative_entropy:.2f}",
            f"{split.broadest.relative_entropy:.2f}",
            f"{split.mean_max:.2f}",
            end_section=last_of_its_weights,
        )
    table.caption = (
        "rel. = row entropy / log(keys), mean over heads, and its min and max over heads: "
        "1 is uniform, 0 all on one key; mean max = mean of row maxima, averaged over heads"
    )
    note = resplit_note(splits)
    if note is not None:
        table.caption += "\n" + " ".join(note.split())
    table.caption_justify = "left"
    return table


def batch_table(rows: list[dict], causal: bool = False, max_rows: int = 40) -> Table:
    """The summary of `heads --file`: one row per text (the first max_rows), full list in summary.csv."""
    table = Table(title=counted(len(rows), "text"), title_justify="left")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("line", justify="right", no_wrap=True)
    table.add_column("tokens", justify="right", no_wrap=True)
    words = bool(rows) and rows[0].get("words") is not None  # --words: summary_row counts them
    if words:
        table.add_column("words", justify="right", no_wrap=True)
    table.add_column("focused head", justify="right", no_wrap=True)
    table.add_column("rel.", justify="right", no_wrap=True)
    table.add_column("text", overflow="fold")  # wrapped, never cut: the text is how a row is found
    for row in rows[:max_rows]:
        table.add_row(
            str(row["index"]),
            str(row["line"]),
            str(row["tokens"]),
            *([str(row["words"])] if words else []),
            f"{row['most_focused_head']} ({row['most_focused_relative_entropy']:.2f})",
            f"{row['mean_relative_entropy']:.2f}",
            Text(row["text"]),
        )
    if len(rows) > max_rows:
        table.add_row("…", "", "", "", "", Text(f"{len(rows) - max_rows} more in summary.csv", style="dim"))
    table.caption = (
        "#: the number of the text's folder; focused head: the head with the lowest rel. (in brackets); "
        f"rel.: the mean over heads of each head's {RELATIVE_ENTROPY_LEGEND.removeprefix('rel.: ')}"
        + (f" ({CAUSAL_VISIBLE_KEYS})" if causal else "")
    )
    table.caption_justify = "left"
    return table


def print_position(console: Console, result, source: str, device_label: str) -> None:
    """Setup, both token orders, and the equivariance numbers of `attnviz position`."""
    from attnviz.analysis.position import TOLERANCE, format_difference

    setup = Table.grid(padding=(0, 2))
    setup.add_row("model", Text(result.model).append(f" ({source})", style="dim"))
    setup.add_row("layer", "0, BERT's weights, on the embedding output")
    setup.add_row("heads", str(result.num_heads))
    setup.add_row("device", device_label)
    console.print(setup)
    console.print(Text.assemble(("tokens", "bold underline"), (f"  {TOKEN_LEGEND}", "dim")))
    console.print(token_cells(result.tokens, result.ids))
    console.print(Text("permuted (Px): new position, token, its old position", style="bold underline"))
    cells = [
        Text.assemble((f"{new} ", "dim"), (result.tokens[old], "bold"), (f" ←{old}", "dim"))
        for new, old in enumerate(result.permutation[:MAX_TOKENS_SHOWN])
    ]
    console.print(Columns(cells, padding=(0, 2)))

    table = Table(title="does permuting the tokens just permute the map?", title_justify="left")
    table.add_column("position embeddings")
    table.add_column("max |A(Px) − P A(x) Pᵀ|", justify="right")
    table.add_column("output", justify="right")
    table.add_column("equivariant", justify="center")
    for label, side in (("without", result.without_positions), ("with BERT's", result.with_positions)):
        table.add_row(
            label,
            format_difference(side.max_difference),
            format_difference(side.output_difference),
            Text("yes", style="green") if side.equivariant else Text("no", style="red"),
        )
    table.caption = (
        f"over all heads; output = max |out(Px) − P out(x)| of the layer's output; "
        f"equivariant = within {TOLERANCE:g}. Without positions attention sees a bag of tokens: "
        "moving a token moves its row and column and changes nothing else. Position embeddings "
        "make the order matter."
    )
    table.caption_justify = "left"
    console.print(table)
