// why_terms.js: a cell's score split into query part × key part terms, as one table under the Heatmap view's map, for
// the offline report and `attnviz serve`'s page alike. AV.whyTable draws an answer (why.json's cell less its every
// term: layer, head, query, key, score, weight, num_terms, top [[query part, key part, term]], rest: the other terms
// summed). The report's answer comes from its record ("why": the layer's cells split at write time, html/record.py);
// the served page's explorer.js replaces AV.cellChosen to ask POST /api/why instead.
(() => {
  "use strict";
  const AV = window.AV;

  // The panel under the view's map (above the selection's panel), emptied.
  AV.whyPanel = (section) => {
    let panel = section.querySelector("#why-terms");
    if (!panel) {
      panel = AV.el("div", { id: "why-terms", class: "why-terms", "aria-live": "polite" });
      section.querySelector(".heatmap-figure").after(panel);
    }
    return AV.clear(panel);
  };

  AV.whyNote = (section, text) => AV.whyPanel(section).appendChild(AV.el("p", { class: "note", id: "why-note" }, text));

  const share = (term, score) => (score ? `${((100 * term) / score).toFixed(1)}%` : "n/a");

  AV.whyTable = (answer, tokens) => {
    const others = answer.num_terms - answer.top.length;
    // one term where each side is one part (a RoPE decoder's layer 0: the token embeddings alone)
    const sum = answer.num_terms === 1 ? "1 term" : `the sum of ${answer.num_terms.toLocaleString("en")} terms`;
    const shown = others > 0 ? `; the ${answer.top.length} largest, and the rest summed (attnviz why writes them all):` : ":";
    const caption =
      `Why layer ${answer.layer}, head ${answer.head} weighs key ${AV.tokenLabel(tokens, answer.key)} from query ${AV.tokenLabel(tokens, answer.query)}: ` +
      `its score ${answer.score.toFixed(4)} (weight ${answer.weight.toFixed(4)}) is ${sum}, query part × key part${shown}`;
    const table = AV.el("table", { id: "why-table" }, AV.el("caption", {}, caption),
      AV.el("tr", {}, ...["query part", "key part", "term", "share"].map((name) => AV.el("th", {}, name))));  // prettier-ignore
    for (const [queryPart, keyPart, term] of answer.top) {
      table.appendChild(AV.el("tr", {}, AV.el("td", {}, queryPart), AV.el("td", {}, keyPart), AV.el("td", { class: "term" }, term.toFixed(4)), AV.el("td", {}, share(term, answer.score))));
    }
    if (others > 0) {
      const label = `the other ${others.toLocaleString("en")} term${others === 1 ? "" : "s"}`;
      table.appendChild(AV.el("tr", { class: "why-rest" }, AV.el("td", { colspan: 2 }, label), AV.el("td", { class: "term" }, answer.rest.toFixed(4)), AV.el("td", {}, share(answer.rest, answer.score))));
    }
    return table;
  };

  // The report's record: each text's "why" arrays decoded once.
  const decoded = new Map(); // text record -> Promise<{pairs, terms, rest, scores}>
  function arrays(why) {
    if (!decoded.has(why)) {
      decoded.set(why, Promise.all(["pairs", "terms", "rest", "scores"].map((name) => AV.decode(why[name]))).then(([pairs, terms, rest, scores]) => ({ pairs, terms, rest, scores })));
    }
    return decoded.get(why);
  }

  // A cell clicked in the report's heatmap view: its split as the record holds it, or why the record has none.
  AV.cellChosen = async (section, text, layer, head, query, key) => {
    const why = text.why;
    const tokens = text.shown_query_tokens;
    if (!why) return AV.whyNote(section, "This report holds no split of the scores: attnviz why splits any cell.");
    if (why.none) return AV.whyNote(section, `No split of this score here: ${why.none}.`);
    if (layer !== why.layer) return AV.whyNote(section, `The report splits the scores of layer ${why.layer} alone: attnviz why --layer ${layer} splits this one.`);
    if (text.causal && key > query) return AV.whyNote(section, `Key ${key} comes after query ${query}: under the causal mask its weight is 0 and it has no score to split.`);
    const keys = why.cells === "top key" ? why.keys[head] : null;
    if (keys && keys[query] !== key) {
      return AV.whyNote(section, `Past its shorter texts the report splits each query's top key alone: key ${AV.tokenLabel(tokens, keys[query])} of query ${AV.tokenLabel(tokens, query)} (attnviz why splits any cell).`);
    }
    const textIndex = AV.data.texts.indexOf(text);
    const [{ pairs, terms, rest, scores }, map] = await Promise.all([arrays(why), AV.headMap(textIndex, layer, head)]);
    const cells = scores.shape[1];
    // the record's cells row by row: every key of each query, its keys up to itself under a causal mask, or its top key
    const cell = keys ? query : why.cells === "causal" ? (query * (query + 1)) / 2 + key : query * text.key_tokens.length + key;
    const count = terms.shape[2];
    const top = [];
    for (let t = 0; t < count; t++) {
      const at = (head * cells + cell) * count + t;
      top.push([why.query_parts[pairs.values[2 * at]], why.key_parts[pairs.values[2 * at + 1]], terms.values[at]]);
    }
    const weight = map.weights.values[map.offset + query * map.cols + key];
    const answer = { layer, head, query, key, score: scores.at(head, cell), weight, num_terms: why.num_terms, top, rest: rest.at(head, cell) };
    AV.whyPanel(section).appendChild(AV.whyTable(answer, tokens));
  };
})();
