// model_view.js: every layer × head as a small map (BertViz's model view); click or Enter on one
// opens it large in the heatmap view.
(() => {
  "use strict";
  const AV = window.AV;
  const CELL_SIDE_PX = 72; // a small map's side at most; longer texts show each pixel's block maximum

  // Grouped-query attention: the key/value head each head reads (attention.json's kv_head_of_head), and a colour per
  // key/value head, heads.png's (record.py's kv_group_colors); null when every head has its own key/value head.
  function kvGroups(text) {
    const kvHeads = text.num_kv_heads || text.num_heads;
    if (!text.kv_head_of_head || kvHeads >= text.num_heads) return null;
    const colours = AV.data.kv_group_colors || ["#d62728", "#1f77b4", "#ff7f0e"];
    return { of: text.kv_head_of_head, count: kvHeads, colour: (kv) => colours[kv % colours.length] };
  }

  function cellButton(textIndex, layer, head, groups) {
    const canvas = AV.el("canvas", { class: "model-cell", "data-layer": layer, "data-head": head, "aria-hidden": "true" });
    const kv = groups ? ` (key/value head ${groups.of[head]})` : "";
    const effect = AV.effectText(AV.current(), layer, head);
    const button = AV.el(
      "button",
      { type: "button", class: "model-cell-button", "aria-label": `layer ${layer}, head ${head}${kv}${effect ? `, taken out: ${effect}` : ""}: open in the heatmap view`, title: `layer ${layer} · head ${head}${groups ? ` · kv ${groups.of[head]}` : ""}${effect ? ` · ${effect}` : ""}` },
      canvas,
      ...(effect ? [AV.el("span", { class: "model-cell-effect" }, AV.effectText(AV.current(), layer, head, true))] : []),
    );
    if (groups) markGroup(button, head, groups);
    if (layer === AV.state.layer && head === AV.state.head) button.setAttribute("aria-current", "true");
    button.addEventListener("click", () => AV.set({ layer, head, view: "heatmap" }));
    return { button, canvas };
  }

  // A head's label or map in its key/value head's colour (report.css: --kv-colour), set apart from the group before it.
  function markGroup(element, head, groups) {
    const kv = groups.of[head];
    element.dataset.kvHead = kv;
    element.style.setProperty("--kv-colour", groups.colour(kv));
    if (head > 0 && groups.of[head - 1] !== kv) element.style.marginLeft = "10px";
  }

  // The row above the head labels: "kv 0 · heads 0–2" over each group's columns, underlined in its colour.
  function groupLabels(grid, groups, heads) {
    grid.appendChild(AV.el("span", { class: "axis" }, ""));
    for (let kv = 0; kv < groups.count; kv++) {
      const members = [...Array(heads).keys()].filter((head) => groups.of[head] === kv);
      const label = AV.el("span", { class: "axis kv-group", "data-kv-head": kv }, `kv head ${kv}: heads ${members[0]}–${members[members.length - 1]}`);
      Object.assign(label.style, {
        gridColumn: `span ${members.length}`, justifySelf: "stretch", textAlign: "center",
        borderBottom: `3px solid ${groups.colour(kv)}`, marginLeft: kv > 0 ? "10px" : "0",
      });
      grid.appendChild(label);
    }
  }

  // Why a text's record holds the run's layer alone: cross-attention has no other (every layer is self-attention on the
  // text's own tokens); a self-attention run computed that layer only (attnviz.heads, `attnviz serve`'s text box).
  function oneLayer(text) {
    const cross = (text.kv_text !== null && text.kv_text !== undefined) || (text.settings && text.settings.stack === "cross");
    if (cross) return `This cross-attention run holds only layer ${text.layer}: the report has no other layer's maps for it.`;
    return `This run computed layer ${text.layer} alone: the report has no other layer's maps for it (attnviz report, roles and patch hold every layer).`;
  }

  // Lets the browser paint between layers, so a long text's 72 maps do not freeze the page.
  const nextFrame = () => new Promise((resolve) => setTimeout(resolve, 0));

  async function render(section) {
    const textIndex = AV.state.text;
    const text = AV.current();
    const layers = AV.layersOf(textIndex);
    const heads = AV.data.num_heads;
    const rows = text.query_tokens.length;
    const cols = text.key_tokens.length;
    const logScale = AV.logScale(cols);
    section.appendChild(AV.el("h2", {}, "Model view"));
    const notes = [`Every layer × head of this text (${rows} × ${cols} tokens), coloured on the ${logScale ? "log scale 0.001 to 1" : "linear scale 0 to 1"}; click a map (or Tab to it and press Enter) to open it large.`];
    if (!text.layers) notes.push(oneLayer(text));
    if (Math.max(rows, cols) > CELL_SIDE_PX) notes.push(`Each pixel of a small map shows the largest weight of the block of cells it covers.`);
    if (text.layers && text.layers.dtype === "uint8") notes.push("Layers other than the run's are drawn from 256 levels of the log colour scale.");
    if (text.effects) notes.push(`Under each map of layer${text.effects.layers.length > 1 ? "s" : ""} ${text.effects.layers.join(", ")}, ${AV.effectNote(text)}`);
    const groups = kvGroups(text);
    if (groups) notes.push(`Grouped-query attention: the ${heads} heads share ${groups.count} key/value heads; each group's heads stand together under its key/value head, framed in its colour (as in heads.png).`);
    section.appendChild(AV.el("p", { class: "note" }, notes.join(" ")));
    const grid = AV.el("div", { class: "model-grid", style: `grid-template-columns: max-content repeat(${heads}, max-content)` });
    if (groups) groupLabels(grid, groups, heads);
    grid.appendChild(AV.el("span", { class: "axis" }, ""));
    for (let head = 0; head < heads; head++) {
      const label = AV.el("span", { class: "axis head-label" }, `head ${head}`);
      if (groups) markGroup(label, head, groups);
      grid.appendChild(label);
    }
    const cells = [];
    for (const layer of layers) {
      grid.appendChild(AV.el("span", { class: "axis" }, `layer ${layer}`));
      for (let head = 0; head < heads; head++) {
        const cell = cellButton(textIndex, layer, head, groups);
        grid.appendChild(cell.button);
        cells.push({ layer, head, canvas: cell.canvas });
      }
    }
    section.appendChild(AV.el("div", { class: "model-figure" }, grid, AV.colourBar(logScale, { height: 160, masked: text.causal })));
    const cellSize = Math.max(1, Math.floor(CELL_SIDE_PX / Math.max(rows, cols)));
    for (const layer of layers) {
      for (const { head, canvas } of cells.filter((cell) => cell.layer === layer)) {
        const map = await AV.headMap(textIndex, layer, head);
        AV.drawMap(canvas, map.weights, map.offset, rows, cols, { logScale, causal: text.causal, cellSize, maxSide: CELL_SIDE_PX });
      }
      await nextFrame();
    }
  }

  AV.onChange((state, patch) => {
    if (!("layer" in patch || "head" in patch)) return;
    for (const button of document.querySelectorAll("#view-model .model-cell-button")) {
      const canvas = button.firstChild;
      const current = Number(canvas.dataset.layer) === state.layer && Number(canvas.dataset.head) === state.head;
      if (current) button.setAttribute("aria-current", "true");
      else button.removeAttribute("aria-current");
    }
  });

  AV.registerView({ id: "model", title: "Model view", render });
})();
