// patch_view.js: only in a report of `attnviz patch` (html/page.py PATCH_SCRIPTS; the record's "patch": patch.json's
// object, analysis/patching.py, with the corrupted text's every layer's maps). Which heads carry the answer: every
// layer × head's patching score and its direct logit attribution as two grids on scales centred on 0 (red above,
// blue below; hover or arrow keys: the cell's numbers); a click (or Enter) on a cell shows that head's maps on the
// clean and the corrupted text side by side with its scores. Shown first, on the most affecting head.
(() => {
  "use strict";
  const AV = window.AV;
  const GRID_PX = 300; // a grid's width at most (heads), its cells square
  const MIN_CELL = 6;
  const MAX_CELL = 28;
  const MAP_PX = 260; // a map's side at most

  // A value on a scale centred on 0: white at 0, red up to +reach, blue down to -reach (matplotlib's RdBu_r's ends).
  function diverging(value, reach) {
    const t = Math.min(1, Math.abs(value) / reach);
    const fade = Math.round(255 * (1 - t));
    return value >= 0 ? `rgb(${255 - Math.round(t * 152)},${fade},${fade})` : `rgb(${fade},${fade},${255 - Math.round(t * 158)})`;
  }

  const signed = (value) => (value >= 0 ? "+" : "") + value.toFixed(3);

  function numbersOf(patch, layer, head) {
    const parts = [`layer ${layer} · head ${head} · score ${signed(patch.scores.output[layer][head])}`];
    for (const name of ["q", "k", "v", "pattern"]) if (patch.scores[name]) parts.push(`${name} ${signed(patch.scores[name][layer][head])}`);
    if (patch.scores.direct) parts.push(`direct ${signed(patch.scores.direct[layer][head])} logits`);
    return parts.join(" · ");
  }

  function grid(values, caption, id, readout, choose, start) {
    const heads = values[0].length;
    const reach = Math.max(1e-9, ...values.flat().map(Math.abs));
    const svg = AV.layerHeadGrid(values, {
      cell: Math.max(MIN_CELL, Math.min(MAX_CELL, Math.floor(GRID_PX / heads))),
      colourOf: (value) => diverging(value, reach),
      readout,
      start,
      choose,
      attrs: { class: "patch-grid", id, "aria-label": `${caption}: ${values.length} layers × ${heads} heads; arrow keys move, Enter shows the head's maps` },
    });  // prettier-ignore
    const title = `${caption} (± ${reach.toFixed(3)})`;
    return AV.el("figure", { class: "patch-figure", style: "margin:0.5rem 1.5rem 1rem 0" }, AV.el("figcaption", { style: "font-weight:600" }, title), svg);
  }

  async function maps(textIndex, text, patch, corrupt, layer, head) {
    const size = text.query_tokens.length;
    const cellSize = Math.max(1, Math.floor(MAP_PX / size));
    const clean = await AV.headMap(textIndex, layer, head);
    const heads = corrupt.shape[1];
    const sides = [
      ["clean", `clean: ${text.text}`, clean ? clean.weights : null, clean ? clean.offset : 0],
      ["corrupt", `corrupted: ${patch.corrupt}`, corrupt, (layer * heads + head) * size * size],
    ];
    const figures = sides.map(([side, title, weights, offset]) => {
      const canvas = AV.el("canvas", { class: "patch-map", "data-layer": layer, "data-head": head, "data-side": side });
      if (weights) AV.drawMap(canvas, weights, offset, size, size, { logScale: false, causal: text.causal, cellSize, maxSide: MAP_PX });
      return AV.el("figure", { style: "margin:0 1rem 0 0" }, AV.el("figcaption", { class: "note" }, title), canvas);
    });
    const heading = AV.el("h3", { class: "patch-head" }, numbersOf(patch, layer, head));
    return AV.el("div", { class: "patch-pair", "data-layer": layer, "data-head": head }, heading, AV.el("div", { style: "display:flex;flex-wrap:wrap;align-items:flex-start" }, ...figures));
  }

  async function render(section) {
    const textIndex = AV.state.text;
    const text = AV.current();
    const patch = text.patch;
    section.appendChild(AV.el("h2", {}, "Patching view"));
    if (!patch) {
      section.appendChild(AV.el("p", { class: "note", id: "patch-missing" }, "This text has no patching run (attnviz patch)."));
      return;
    }
    const changed = patch.shown_tokens.map((token, index) => [index, token, patch.shown_corrupt_tokens[index]]).filter(([, a, b]) => a !== b);
    const where = changed.map(([index, a, b]) => `token ${index} ${a} → ${b}`).join(", ");
    section.appendChild(
      AV.el("p", { class: "note", id: "patch-note" },
        "Each head's part from the clean run patched into the corrupted run. " +
        `m = logit(${JSON.stringify(patch.answer)}) − logit(${JSON.stringify(patch.wrong)}) at position ${patch.position}: ` +
          `${patch.metric.clean.toFixed(3)} clean, ${patch.metric.corrupt.toFixed(3)} corrupted (the corrupted text: ${where}). ` +
          `Score: ${patch.definitions.scores}. Direct: ${patch.definitions.direct}.`),
    );  // prettier-ignore
    const readout = AV.el("p", { id: "patch-readout", class: "readout", "aria-live": "polite" }, "Hover a cell, or Tab to a grid and move with the arrow keys, for its numbers; click it (or Enter) for its maps.");
    section.appendChild(readout);
    const corrupt = await AV.decode(patch.corrupt_layers);
    const shown = AV.el("div", { id: "patch-maps" });
    const choose = async (layer, head) => {
      const pair = await maps(textIndex, text, patch, corrupt, layer, head);
      shown.replaceChildren(pair);
    };
    const show = (layer, head) => { readout.textContent = numbersOf(patch, layer, head); };
    const order = patch.scores.output.flatMap((row, layer) => row.map((value, head) => [Math.abs(value), layer, head]));
    order.sort((a, b) => b[0] - a[0]);
    const start = [order[0][1], order[0][2]];
    const grids = [grid(patch.scores.output, "clean output patched into the corrupted run: normalised score", "patch-output", show, choose, start)];
    if (patch.scores.direct) grids.push(grid(patch.scores.direct, "direct logit attribution (logit units)", "patch-direct", show, choose, start));
    section.appendChild(AV.el("div", { style: "display:flex;flex-wrap:wrap;align-items:flex-start" }, ...grids));
    section.appendChild(shown);
    await choose(...start);
  }

  AV.registerView({ id: "patch", title: "Patching view", render, available: () => AV.data.texts.some((text) => Boolean(text.patch)) });
  const patchFirst = (view) => (view.id === "patch" ? 0 : 1);
  AV.views.sort((a, b) => patchFirst(a) - patchFirst(b)); // stable: the other views keep their order
  AV.state.view = "patch";
})();
