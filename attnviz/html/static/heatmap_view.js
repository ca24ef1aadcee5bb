// heatmap_view.js: one head's map large, on the PNGs' colour scale, with token labels (every k-th
// when the cells are too small for all), a colour bar with its numbers, and a read-out of the cell
// under the pointer or the keyboard's cursor: "layer 0 · head 7 · query 3:吃 · key 5:酸 · 0.1234",
// read out again from the new map when the layer or head changes.
(() => {
  "use strict";
  const AV = window.AV;
  const MAP_SIDE_PX = 600; // the map's longer side at most (cells are whole pixels: 1 at 512 tokens)
  const MAX_CELL_PX = 36;
  const HINT = "Hover a cell, or Tab to the map and move with the arrow keys, for its weight.";

  let shown = null; // {section, textIndex, canvas, ...} of the section drawn now

  function select(id, label, values, current, patchOf) {
    const element = AV.el("select", { id });
    for (const value of values) element.appendChild(AV.el("option", { value }, `${label} ${value}`));
    element.value = String(current);
    element.addEventListener("change", () => AV.set(patchOf(Number(element.value))));
    return AV.el("label", { class: "control" }, `${label[0].toUpperCase()}${label.slice(1)} `, element);
  }

  async function render(section) {
    const textIndex = AV.state.text;
    const heads = Array.from({ length: AV.data.num_heads }, (_, head) => head);
    section.appendChild(AV.el("h2", {}, "Heatmap view"));
    section.appendChild(
      AV.el(
        "div",
        { class: "controls" },
        select("heatmap-layer", "layer", AV.layersOf(textIndex), AV.state.layer, (layer) => ({ layer })),
        select("heatmap-head", "head", heads, AV.state.head, (head) => ({ head })),
      ),
    );
    const note = AV.el("p", { id: "heatmap-note", class: "note" });
    const readout = AV.el("p", { id: "heatmap-readout", class: "readout", "aria-live": "polite" }, HINT);
    const canvas = AV.el("canvas", { id: "heatmap-canvas", tabindex: 0, role: "img" });
    const cursor = AV.el("div", { class: "heatmap-cursor", hidden: true });
    const keyLabels = AV.el("div", { class: "key-labels", "aria-hidden": "true" });
    const queryLabels = AV.el("div", { class: "query-labels", "aria-hidden": "true" });
    const map = AV.el("div", { class: "heatmap-map" }, AV.el("div", {}), keyLabels, queryLabels, AV.el("div", { class: "heatmap-canvas-box", style: "position:relative" }, canvas, cursor));
    const bar = AV.el("div", { class: "heatmap-bar" });
    section.appendChild(note);
    section.appendChild(readout);
    section.appendChild(AV.el("div", { class: "heatmap-figure" }, map, bar));
    section.appendChild(AV.selectionPanel("heatmap")); // several queries or keys at once (selection.js)
    shown = { section, textIndex, canvas, cursor, keyLabels, queryLabels, bar, note, readout, at: null, pinned: null, data: null };
    wire(shown);
    await draw();
  }

  async function draw() {
    const current = shown;
    const text = AV.data.texts[current.textIndex];
    const request = (current.request || 0) + 1; // a later call (another layer or head) wins
    current.request = request;
    const { layer, head } = AV.state;
    // Until the new map is drawn the read-out would name the old one's weight: it says nothing.
    if (current.data) current.readout.textContent = HINT;
    const data = await AV.headMap(current.textIndex, layer, head);
    if (shown !== current || current.request !== request) return;
    const rows = text.query_tokens.length;
    const cols = text.key_tokens.length;
    const logScale = AV.logScale(cols);
    const cellSize = Math.min(MAX_CELL_PX, Math.max(1, Math.floor(MAP_SIDE_PX / Math.max(rows, cols))));
    AV.drawMap(current.canvas, data.weights, data.offset, rows, cols, { logScale, causal: text.causal, cellSize });
    current.canvas.setAttribute("aria-label", `attention map of layer ${layer}, head ${head}: ${rows} queries × ${cols} keys; arrow keys move over the cells`);
    Object.assign(current, { data, rows, cols, cellSize, layer, head, exact: data.exact, causal: text.causal });
    const step = AV.tokenLabels(current.queryLabels, current.keyLabels, text, cellSize, rows, cols);
    const bar = AV.colourBar(logScale, { height: Math.min(240, Math.max(120, rows * cellSize)), masked: text.causal });
    bar.setAttribute("id", "heatmap-colourbar");
    AV.clear(current.bar).appendChild(bar);
    const notes = [`Layer ${current.layer}, head ${current.head}: rows are queries, columns keys; ${logScale ? `more than 64 keys, so a log colour scale from 0.001 to 1 (smaller weights take its darkest colour)` : "linear colour scale 0 to 1"}.`];
    if (step > 1) notes.push(`Token labels thinned: one label every ${step} tokens (the read-out names every cell).`);
    if (text.causal) notes.push("Grey cells are masked by the causal mask (keys after the query).");
    if (!data.exact) notes.push("This layer's weights are stored as 256 levels of the log colour scale: its read-outs are approximate (≈).");
    const effect = AV.effectText(text, layer, head);
    if (effect) notes.push(`Head ${head}: ${effect}, ${AV.effectNote(text)}`);
    current.note.textContent = notes.join(" ");
    // The cell read out before (pinned, or last under the pointer) is read out again from this map.
    if (current.pinned) point(current, current.pinned.i, current.pinned.j);
    else if (current.at) current.readout.textContent = readoutOf(current, current.at.i, current.at.j);
  }

  function weightAt(current, i, j) {
    return current.data.weights.values[current.data.offset + i * current.cols + j];
  }

  function readoutOf(current, i, j) {
    const text = AV.data.texts[current.textIndex];
    const masked = current.causal && j > i;
    const weight = masked ? "masked by the causal mask" : AV.formatWeight(weightAt(current, i, j), current.exact);
    return `layer ${current.layer} · head ${current.head} · query ${AV.tokenLabel(text.shown_query_tokens, i)} · key ${AV.tokenLabel(text.shown_key_tokens, j)} · ${weight}`;
  }

  // Shows cell (i, j): the cursor's box on the map and the read-out.
  function point(current, i, j) {
    current.at = { i, j };
    const size = current.canvas.getBoundingClientRect().width / current.cols || current.cellSize;
    Object.assign(current.cursor.style, { left: `${j * size}px`, top: `${i * size}px`, width: `${Math.max(2, size)}px`, height: `${Math.max(2, size)}px` });
    current.cursor.hidden = false;
    current.readout.textContent = readoutOf(current, i, j);
  }

  function cellOf(current, event) {
    const box = current.canvas.getBoundingClientRect();
    const j = Math.floor(((event.clientX - box.left) / box.width) * current.cols);
    const i = Math.floor(((event.clientY - box.top) / box.height) * current.rows);
    return i >= 0 && i < current.rows && j >= 0 && j < current.cols ? { i, j } : null;
  }

  function wire(current) {
    const canvas = current.canvas;
    canvas.addEventListener("mousemove", (event) => {
      const cell = current.data && cellOf(current, event);
      if (cell) point(current, cell.i, cell.j);
    });
    canvas.addEventListener("mouseleave", () => {
      if (current.pinned) point(current, current.pinned.i, current.pinned.j);
      else current.cursor.hidden = true;
    });
    canvas.addEventListener("click", (event) => {
      const cell = current.data && cellOf(current, event);
      if (!cell) return;
      current.pinned = cell;
      point(current, cell.i, cell.j);
      // the cell's score split into its terms (why_terms.js): from the report's record, or the server's (explorer.js)
      if (AV.cellChosen) AV.cellChosen(current.section, AV.data.texts[current.textIndex], current.layer, current.head, cell.i, cell.j);
    });
    canvas.addEventListener("focus", () => {
      if (!current.data) return;
      const at = current.pinned || current.at || { i: 0, j: 0 };
      point(current, at.i, at.j);
    });
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1], PageUp: [-10, 0], PageDown: [10, 0] };
    canvas.addEventListener("keydown", (event) => {
      const move = moves[event.key];
      if (!move || !current.data) return;
      event.preventDefault();
      const at = current.at || { i: 0, j: 0 };
      const i = Math.min(current.rows - 1, Math.max(0, at.i + move[0]));
      const j = Math.min(current.cols - 1, Math.max(0, at.j + move[1]));
      current.pinned = { i, j };
      point(current, i, j);
    });
  }

  AV.onChange((state, patch) => {
    if (!shown || !shown.section.isConnected || shown.textIndex !== state.text || "text" in patch) return;
    if (!("layer" in patch || "head" in patch)) return;
    shown.section.querySelector("#heatmap-layer").value = String(state.layer);
    shown.section.querySelector("#heatmap-head").value = String(state.head);
    draw();
  });

  AV.registerView({ id: "heatmap", title: "Heatmap view", render });
})();
