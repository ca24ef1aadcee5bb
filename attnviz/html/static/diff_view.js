// diff_view.js: only in a report of `attnviz diff` (html/page.py DIFF_SCRIPTS; the record's "diff": diff.json's
// object, analysis/diff.py). Two checkpoints over one text: the Jensen-Shannon distance of every layer × head's two
// maps as a grid (hover or arrow keys: the cell's JS distance and Clark et al.'s divergence), then the most changed
// heads' two maps side by side with their difference (red: more weight on the other side, blue: less). Shown first.
(() => {
  "use strict";
  const AV = window.AV;
  const GRID_PX = 360; // the grid's width at most (heads), its cells square
  const MIN_CELL = 6;
  const MAX_CELL = 28;
  const MAP_PX = 220; // a map's side at most

  function readoutOf(diff, layer, head) {
    return `layer ${layer} · head ${head} · JS ${diff.js[layer][head].toFixed(4)} · Clark ${diff.clark[layer][head].toFixed(4)} bits`;
  }

  function grid(diff, readout) {
    const layers = diff.js.length;
    const heads = diff.js[0].length;
    const top = Math.max(1e-12, ...diff.js.flat());
    const svg = AV.layerHeadGrid(diff.js, {
      cell: Math.max(MIN_CELL, Math.min(MAX_CELL, Math.floor(GRID_PX / heads))),
      colourOf: (value) => AV.colourCss(value / top, false),
      readout: (layer, head) => { readout.textContent = readoutOf(diff, layer, head); },
      start: [diff.most_changed[0].layer, diff.most_changed[0].head],
      attrs: { class: "diff-grid", "aria-label": `Jensen-Shannon distance of each head's two maps: ${layers} layers × ${heads} heads; arrow keys move over the cells` },
    });  // prettier-ignore
    const caption = `Jensen-Shannon distance, rows layers, columns heads (0 to ${top.toFixed(3)})`;
    return AV.el("figure", { class: "diff-figure", style: "margin:0.5rem 1.5rem 1rem 0" }, AV.el("figcaption", { style: "font-weight:600" }, caption), svg);
  }

  // other − model on a scale centred on 0: white at 0, red up to +reach, blue down to −reach (matplotlib's RdBu_r's ends).
  function drawChange(canvas, change, size, cellSize, reach) {
    canvas.width = canvas.height = size * cellSize;
    const context = canvas.getContext("2d");
    for (let i = 0; i < size; i++) {
      for (let j = 0; j < size; j++) {
        const t = Math.min(1, Math.abs(change[i * size + j]) / reach);
        const fade = Math.round(255 * (1 - t));
        context.fillStyle = change[i * size + j] >= 0 ? `rgb(${255 - Math.round(t * 152)},${fade},${fade})` : `rgb(${fade},${fade},${255 - Math.round(t * 158)})`;
        context.fillRect(j * cellSize, i * cellSize, cellSize, cellSize);
      }
    }
  }

  async function pair(text, diff, entry) {
    const [ours, theirs] = await Promise.all([AV.decode(entry.model), AV.decode(entry.against)]);
    const size = ours.shape[0];
    const cellSize = Math.max(1, Math.floor(MAP_PX / size));
    const change = ours.values.map((value, index) => theirs.values[index] - value);
    const reach = Math.max(1e-9, ...change.map(Math.abs));
    const titles = [text.model, diff.against === "random" ? "random" : diff.against, `difference (± ${reach.toFixed(4)})`];
    const figures = [];
    for (const [index, title] of titles.entries()) {
      const canvas = AV.el("canvas", { class: "diff-map", "data-layer": entry.layer, "data-head": entry.head, "data-side": ["model", "against", "change"][index] });
      if (index < 2) AV.drawMap(canvas, index === 0 ? ours : theirs, 0, size, size, { logScale: false, causal: text.causal, cellSize, maxSide: MAP_PX });
      else drawChange(canvas, change, size, Math.min(cellSize, Math.max(1, Math.floor(MAP_PX / size))), reach);
      figures.push(AV.el("figure", { style: "margin:0 1rem 0 0" }, AV.el("figcaption", { class: "note" }, title), canvas));
    }
    const js = diff.js[entry.layer][entry.head];
    const heading = AV.el("h3", { class: "diff-head" }, `layer ${entry.layer} · head ${entry.head} · JS ${js.toFixed(4)} · Clark ${diff.clark[entry.layer][entry.head].toFixed(4)} bits`);
    return AV.el("div", { class: "diff-pair" }, heading, AV.el("div", { style: "display:flex;flex-wrap:wrap;align-items:flex-start" }, ...figures));
  }

  async function render(section) {
    const text = AV.current();
    const diff = text.diff;
    section.appendChild(AV.el("h2", {}, "Diff view"));
    if (!diff) {
      section.appendChild(AV.el("p", { class: "note", id: "diff-missing" }, "This text was not compared with another checkpoint."));
      return;
    }
    const most = diff.most_changed.map((entry) => `layer ${entry.layer} head ${entry.head}`).join(", ");
    section.appendChild(
      AV.el("p", { class: "note", id: "diff-note" },
        `${text.model} ${diff.against_words}, every layer × head over the same ${text.query_tokens.length} tokens. ` +
          `JS: ${diff.definitions.js}. Clark: ${diff.definitions.clark} (${diff.paper}). Most changed: ${most}.`),
    );  // prettier-ignore
    const readout = AV.el("p", { id: "diff-readout", class: "readout", "aria-live": "polite" }, "Hover a cell, or Tab to the grid and move with the arrow keys, for its distances.");
    section.appendChild(readout);
    section.appendChild(grid(diff, readout));
    if (!diff.maps.length) {
      section.appendChild(AV.el("p", { class: "note" }, "The text is too long for the most changed heads' maps to be kept: diff.json has every distance."));
      return;
    }
    for (const entry of diff.maps) section.appendChild(await pair(text, diff, entry));
  }

  AV.registerView({ id: "diff", title: "Diff view", render, available: () => AV.data.texts.some((text) => Boolean(text.diff)) });
  const diffFirst = (view) => (view.id === "diff" ? 0 : 1);
  AV.views.sort((a, b) => diffFirst(a) - diffFirst(b)); // stable: the other views keep their order
  AV.state.view = "diff";
})();
