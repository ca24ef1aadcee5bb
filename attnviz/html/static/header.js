// header.js: the run's header (AV.renderHeader): the figures' title, the text as characters, the
// model, layer, parameters, heads, what the mask is, truncation and device; the run's notes and
// how the embedded weights were rounded below them. main.js calls it at boot and again, on an
// emptied header, whenever state.text changes.
(() => {
  "use strict";
  const AV = window.AV;

  // "cut from 602 to 512 tokens" for a {from, to} of --truncate; null when the text was not cut.
  function truncationText(truncated) {
    return truncated ? `cut from ${truncated.from} to ${truncated.to} tokens` : null;
  }

  function parametersText(text) {
    const seed = text.settings ? text.settings.seed : null;
    if (text.weights === "random") return seed === null || seed === undefined ? "random" : `random (seed ${seed})`;
    if (text.re_split) return `${text.weights} (the checkpoint's projections, split into ${text.num_heads} heads in place of its ${text.model_heads})`;
    return `${text.weights} (the checkpoint's projections)`;
  }

  // "3 × d = 128, re-split from the trained 12 × d = 32": --heads split the model's own projections another way
  // (attention.json's re_split, model_heads); with grouped-query attention, the key/value heads they share.
  function headsText(text) {
    const kvHeads = text.num_kv_heads || AV.data.num_kv_heads;
    let words = `${text.num_heads} × d = ${text.head_dim}`;
    if (text.re_split) words += `, re-split from the trained ${text.model_heads} × d = ${(text.head_dim * text.num_heads) / text.model_heads}`;
    if (kvHeads && kvHeads < text.num_heads) {
      const groups = text.num_heads / kvHeads;
      words += `, sharing ${kvHeads} key/value ${kvHeads === 1 ? "head" : "heads"} (grouped-query: ${groups} heads each`;
      words += text.re_split ? `; trained: ${text.model_heads / groups} key/value heads)` : ")";
    }
    return words;
  }

  function maskText(text) {
    if (text.kv_text !== null && text.kv_text !== undefined) {
      return "cross-attention: queries from the text, keys and values from the --kv text";
    }
    // causal_note begins with what the mask is ("causal: GPT-2 is a decoder, …", "causal mask over a bidirectional model's …")
    if (text.causal) return text.causal_note || "causal: each token attends to itself and the tokens before it";
    return "self-attention, not causal: every token attends to every token";
  }

  function layerText(text) {
    const stack = text.settings ? text.settings.stack : null;
    const of = AV.data.num_layers ? ` of ${AV.data.num_layers}` : "";
    return stack ? `${text.layer}${of} (the ${stack === "cross" ? "decoder's cross-attention" : stack} stack)` : `${text.layer}${of}`;
  }

  function tokensText(text) {
    const queries = text.query_tokens.length;
    const keys = text.key_tokens.length;
    const counts = text.kv_text !== null && text.kv_text !== undefined ? `${queries} queries, ${keys} keys` : `${queries}`;
    if (!text.query_pieces) return counts;
    // --words: the maps are over words (record.py puts the words in query_tokens, the tokens in query_pieces)
    return `${counts} words of ${text.query_pieces.length} tokens (Clark et al. 2019: attention to a word is the sum over its pieces, from a word the mean)`;
  }

  // [term, value] pairs; a value of null leaves its term out.
  function facts(text) {
    const quantised = text.quantisation ? `, ${text.quantisation.short}` : ""; // SmolLM2's GGUF weights
    const model = `${text.model} (${AV.data.family}, ${AV.data.kind}${quantised})`;
    return [
      ["Model", model],
      ["Weights", text.quantisation ? text.quantisation.detail : null],
      ["Layer", layerText(text)],
      ["Parameters", parametersText(text)],
      ["Heads", headsText(text)],
      ["Attention", maskText(text)],
      [text.query_pieces ? "Words" : "Tokens", tokensText(text)],
      ["Truncation", truncationText(text.truncated) || "none"],
      ["Keys' text truncation", truncationText(text.kv_truncated)],
      ["Device", text.dtype ? `${text.device}, ${text.dtype}` : text.device], // dtype: only when not float32
    ].filter(([, value]) => value !== null && value !== undefined);
  }

  function factList(text) {
    const list = AV.el("dl", { class: "report-facts", id: "report-facts" });
    // structural only: the facts flow in rows of term-value pairs
    Object.assign(list.style, { display: "flex", flexWrap: "wrap", gap: "0.2rem 1.5rem", margin: "0.4rem 0" });
    for (const [term, value] of facts(text)) {
      const pair = AV.el("div", { class: "report-fact", "data-fact": term.toLowerCase() }, AV.el("dt", {}, term), AV.el("dd", {}, value));
      Object.assign(pair.style, { display: "flex", gap: "0.4rem" });
      pair.lastChild.style.margin = "0";
      list.appendChild(pair);
    }
    return list;
  }

  AV.renderHeader = (header) => {
    AV.clear(header);
    const text = AV.current();
    const [first, ...rest] = text.title && text.title.length ? text.title : [`${text.model} · layer ${text.layer}`];
    header.appendChild(AV.el("h1", { class: "report-title" }, first));
    for (const line of rest) {
      if (/^“[^”]*”$/.test(line)) continue; // the quoted text alone: the text is shown whole just below
      header.appendChild(AV.el("p", { class: "report-subtitle" }, line));
    }
    const quoted = AV.el("p", { class: "report-text", lang: "und" }, text.text);
    Object.assign(quoted.style, { maxHeight: "7.5em", overflowY: "auto" }); // a 512-token text scrolls in its box
    header.appendChild(quoted);
    if (text.kv_text !== null && text.kv_text !== undefined) {
      header.appendChild(AV.el("p", { class: "report-text report-kv-text", lang: "und" }, `keys and values from: ${text.kv_text}`));
    }
    header.appendChild(factList(text));
    if (AV.data.notes && AV.data.notes.length) {
      const notes = AV.el("ul", { class: "report-notes" });
      for (const note of AV.data.notes) notes.appendChild(AV.el("li", { class: "note" }, note));
      header.appendChild(notes);
    }
    if (AV.data.weights_rounding) header.appendChild(AV.el("p", { class: "note weights-rounding" }, AV.data.weights_rounding));
  };
})();
