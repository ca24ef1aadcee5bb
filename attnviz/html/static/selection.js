// selection.js: several tokens at once, in the head and heatmap views (AV.selectionPanel). Choose several queries and
// see, for one head of the layer shown, their attention to each key summed and averaged (how much the group reads each
// key); choose several keys and see each query's attention to them, summed and averaged (how much each query reads
// the group). From the map the views draw (AV.headMap): exact to 4 decimals for the run's layer, ≈ otherwise.
(() => {
  "use strict";
  const AV = window.AV;
  const LIST_ROWS = 6;
  const BAR_PX = 120;

  function tokenList(id, tokens) {
    const select = AV.el("select", { id, multiple: true, size: Math.min(LIST_ROWS, tokens.length) });
    tokens.forEach((token, index) => select.appendChild(AV.el("option", { value: index }, AV.tokenLabel(tokens, index))));
    return select;
  }

  const chosen = (select) => Array.from(select.selectedOptions, (option) => Number(option.value));

  // rows: [[label, sum]], each with its mean (sum / count) and a bar of the sum (at most count: every weight is ≤ 1).
  function sumsTable(id, caption, heading, rows, count, exact) {
    const table = AV.el("table", { id, class: "selection-sums" }, AV.el("caption", {}, caption));
    table.appendChild(AV.el("tr", {}, AV.el("th", {}, heading), AV.el("th", {}, "sum"), AV.el("th", {}, "mean"), AV.el("th", {}, "")));
    rows.forEach(([label, sum], index) => {
      const bar = AV.el("div", { class: "selection-bar", style: `width:${Math.round((BAR_PX * sum) / count)}px;background:${AV.colourCss(sum / count, false)}` });
      table.appendChild(
        AV.el("tr", { "data-index": index },
          AV.el("td", {}, label),
          AV.el("td", { class: "sum" }, AV.formatWeight(sum, exact)),
          AV.el("td", { class: "mean" }, AV.formatWeight(sum / count, exact)),
          AV.el("td", {}, bar)),
      );
    });
    return table;
  }

  // The panel for the view whose ids start with prefix ("head", "heatmap"): its lists, its head, its tables.
  AV.selectionPanel = (prefix) => {
    const textIndex = AV.state.text;
    const text = AV.current();
    const queries = tokenList(`${prefix}-sel-queries`, text.shown_query_tokens);
    const keys = tokenList(`${prefix}-sel-keys`, text.shown_key_tokens);
    const head = AV.el("select", { id: `${prefix}-sel-head` });
    for (let h = 0; h < AV.data.num_heads; h++) head.appendChild(AV.el("option", { value: h }, `head ${h}`));
    head.value = String(AV.state.head);
    const out = AV.el("div", { id: `${prefix}-selection`, class: "selection-out", "aria-live": "polite" });
    const panel = AV.el(
      "details",
      { class: "selection-panel", open: true },
      AV.el("summary", {}, "Several tokens at once: sums and means"),
      AV.el("p", { class: "note" }, "Choose several queries (or keys) with Ctrl or Shift: their attention summed and averaged, for the head chosen."),
      AV.el("div", { class: "controls" },
        AV.el("label", { class: "control" }, "Queries ", queries),
        AV.el("label", { class: "control" }, "Keys ", keys),
        AV.el("label", { class: "control" }, "Head ", head)),
      out,
    );

    let asked = 0;
    const update = async () => {
      const number = ++asked;
      const { layer } = AV.state;
      const h = Number(head.value);
      const map = await AV.headMap(textIndex, layer, h);
      if (number !== asked) return;
      AV.clear(out);
      if (!map) return;
      const at = (i, j) => map.weights.values[map.offset + i * map.cols + j];
      const rowsChosen = chosen(queries);
      const colsChosen = chosen(keys);
      const names = (tokens, indices) => indices.map((index) => AV.tokenLabel(tokens, index)).join(", ");
      if (rowsChosen.length) {
        const rows = text.shown_key_tokens.map((_, j) => [AV.tokenLabel(text.shown_key_tokens, j), rowsChosen.reduce((sum, i) => sum + at(i, j), 0)]);
        out.appendChild(sumsTable(`${prefix}-query-sums`, `Layer ${layer}, head ${h}: the attention of ${rowsChosen.length} queries (${names(text.shown_query_tokens, rowsChosen)}) to each key`, "key", rows, rowsChosen.length, map.exact));
      }
      if (colsChosen.length) {
        const rows = text.shown_query_tokens.map((_, i) => [AV.tokenLabel(text.shown_query_tokens, i), colsChosen.reduce((sum, j) => sum + at(i, j), 0)]);
        out.appendChild(sumsTable(`${prefix}-key-sums`, `Layer ${layer}, head ${h}: each query's attention to ${colsChosen.length} keys (${names(text.shown_key_tokens, colsChosen)})`, "query", rows, colsChosen.length, map.exact));
      }
    };
    queries.addEventListener("change", update);
    keys.addEventListener("change", update);
    head.addEventListener("change", () => AV.set({ head: Number(head.value) }));
    AV.onChange((state, patch) => {
      if (!panel.isConnected || !("layer" in patch || "head" in patch)) return;
      head.value = String(state.head);
      update();
    });
    return panel;
  };
})();
