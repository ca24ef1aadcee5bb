// summaries_view.js: every head of every layer summarised over a long text (the record's "summaries": summaries.json's
// object, analysis/head_summaries.py), one layers × heads grid per summary, and the sink fraction of each layer beside
// the sink's grid. Only in a report of a long text (html/page.py LONG_SCRIPTS).
//
// Read-outs: hovering a cell, or the arrow keys on a focused grid, give its layer, head and value (4 decimals), and
// for the sink the layer's sink fraction; colours are viridis, 0 to 1 for shares and relative entropy, 0 to the
// grid's largest for the distance (in tokens).
(() => {
  "use strict";
  const AV = window.AV;
  const GRID_PX = 288; // a grid's width at most (heads), its cells square
  const MIN_CELL = 4;
  const MAX_CELL = 18;

  function cellSize(summaries) {
    return Math.max(MIN_CELL, Math.min(MAX_CELL, Math.floor(GRID_PX / summaries.num_heads)));
  }

  function topKeysWords(summaries, layer, head) {
    const keys = (summaries.top_keys[layer] || [])[head] || [];
    return keys.map((entry) => `${entry.key}:${entry.token} ${entry.share.toFixed(4)}`).join(", ");
  }

  // What a cell reads out: name, layer, head (or the layer's sink fraction), value.
  function readoutOf(summaries, name, layer, head) {
    if (name === "sink_fraction") {
      const fraction = summaries.sink_fraction[layer];
      const over = summaries.summaries.sink[layer].filter((share) => share > summaries.sink_threshold).length;
      return `sink fraction · layer ${layer} · ${fraction.toFixed(4)} (${over} of ${summaries.num_heads} heads' sink share over ${summaries.sink_threshold})`;
    }
    const what = summaries.definitions[name].name;
    const value = summaries.summaries[name][layer][head];
    const unit = name === "distance" ? " tokens" : "";
    return `${what} · layer ${layer} · head ${head} · ${value.toFixed(4)}${unit} · most-attended keys: ${topKeysWords(summaries, layer, head)}`;
  }

  // One grid: rows are layers, columns heads (or the one column of the sink fraction); values[layer][column].
  function grid(summaries, name, values, columns, readout) {
    const layers = summaries.num_layers;
    const top = name === "sink_fraction" ? 1 : Math.max(1e-12, ...values.flat());
    const scale = name === "distance" ? top : 1;
    const what = name === "sink_fraction" ? "sink fraction" : summaries.definitions[name].name;
    const svg = AV.layerHeadGrid(values, {
      cell: cellSize(summaries),
      colourOf: (value) => AV.colourCss(value / scale, false),
      readout: (layer, head) => { readout.textContent = readoutOf(summaries, name, layer, head); },
      attrs: {
        class: "summaries-grid",
        "data-summary": name,
        "aria-label": `${what}: ${layers} layers × ${columns === 1 ? "the layer" : `${columns} heads`}; arrow keys move over the cells`,
      },
    });  // prettier-ignore
    const caption = name === "distance" ? `${what} (0 to ${top.toFixed(1)} tokens)` : what;
    return AV.el("figure", { class: "summaries-figure", style: "margin:0.5rem 1.5rem 1rem 0" }, AV.el("figcaption", { style: "font-weight:600" }, caption), svg);
  }

  function render(section) {
    const text = AV.current();
    section.appendChild(AV.el("h2", {}, "Summaries"));
    const summaries = text.summaries;
    if (!summaries) {
      const why = text.zoom
        ? "This report holds no summaries of every layer for this text (cross-attention has one layer only)."
        : "This text is short: the model view and the statistics show every layer's maps.";
      section.appendChild(AV.el("p", { class: "note", id: "summaries-missing" }, why));
      return;
    }
    section.appendChild(
      AV.el(
        "p",
        { class: "note", id: "summaries-note" },
        `Every head of every layer over the text's ${summaries.num_tokens} tokens, computed a block of queries at a time (no whole map held); ` +
          `rows are layers, columns heads; the local band's w = ${summaries.window}. Sink fraction of the whole model: ${summaries.model_sink_fraction.toFixed(4)} of its heads ` +
          `have a sink share over ε = ${summaries.sink_threshold} (${summaries.definitions.sink_fraction.paper}).`,
      ),
    );
    const readout = AV.el("p", { id: "summaries-readout", class: "readout", "aria-live": "polite" }, "Hover a cell, or Tab to a grid and move with the arrow keys, for its value.");
    section.appendChild(readout);
    const figures = AV.el("div", { class: "summaries-grids", style: "display:flex;flex-wrap:wrap;align-items:flex-start" });
    for (const name of Object.keys(summaries.summaries)) {
      figures.appendChild(grid(summaries, name, summaries.summaries[name], summaries.num_heads, readout));
      if (name === "sink") figures.appendChild(grid(summaries, "sink_fraction", summaries.sink_fraction.map((fraction) => [fraction]), 1, readout));
    }
    section.appendChild(figures);
    const definitions = AV.el("dl", { class: "note", id: "summaries-definitions" });
    for (const [name, entry] of Object.entries(summaries.definitions)) {
      definitions.appendChild(AV.el("dt", { style: "font-weight:600" }, entry.name));
      definitions.appendChild(AV.el("dd", {}, entry.definition));
    }
    section.appendChild(definitions);
    section.appendChild(AV.colourBar(false, { height: 120 }));
  }

  AV.registerView({ id: "summaries", title: "Summaries", render, available: () => AV.data.texts.some((text) => Boolean(text.summaries)) });
})();
