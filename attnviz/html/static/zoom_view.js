// zoom_view.js: a long text's map (past 512 tokens) that pans and zooms, drawn from the pyramid that
// html/pyramid.py embeds ("zoom"): blocks of 2^level cells, coloured by their maximum (a sharp line never
// vanishes when zoomed out), and the first and last queries' rows at full precision.
//
// Read-outs never give a number that is not the cell's: zoomed in to single cells (a cell SINGLE_CELL_PX
// or more), an exact row's cell reads out its weight (4 decimals); anywhere else the read-out names the
// block drawn, its extent, its maximum and its mean (≈: 256 levels of the log colour scale).
//
// Mouse: drag pans, the wheel zooms about the pointer, hovering reads out. Keyboard (the canvas focused):
// arrows move the cursor a cell (or a block, zoomed out) and pan to keep it in view; Shift+arrows pan a
// quarter of the view; + and - zoom about the cursor; 0 shows the whole map again.
(() => {
  "use strict";
  const AV = window.AV;
  const VIEW_PX = 640;
  const SINGLE_CELL_PX = 4;
  const MAX_CELL_PX = 64;
  const BACKGROUND = [255, 255, 255];
  const HINT = "Drag to pan, the wheel or + and - to zoom; Tab to the map and move with the arrow keys for a read-out.";

  let shown = null; // what the section shows now

  function span(first, last) {
    return first === last ? String(first) : `${first}–${last}`;
  }

  function exactRowsWords(rows) {
    if (!rows.length) return "none";
    const spans = [];
    let start = rows[0];
    rows.forEach((row, at) => {
      if (at + 1 === rows.length || rows[at + 1] !== row + 1) {
        spans.push(span(start, row));
        start = rows[at + 1];
      }
    });
    return spans.join(", ");
  }

  async function render(section) {
    const textIndex = AV.state.text;
    const text = AV.data.texts[textIndex];
    section.appendChild(AV.el("h2", {}, "Zoom view"));
    if (!text.zoom) {
      section.appendChild(AV.el("p", { class: "note" }, "This text is short: the heatmap view shows every cell of its maps."));
      return;
    }
    const head = AV.el("select", { id: "zoom-head" });
    for (let h = 0; h < AV.data.num_heads; h++) head.appendChild(AV.el("option", { value: h }, `head ${h}`));
    head.value = String(AV.state.head);
    head.addEventListener("change", () => AV.set({ head: Number(head.value) }));
    section.appendChild(AV.el("div", { class: "controls" }, AV.el("label", { class: "control" }, "Head ", head)));
    const zoom = text.zoom;
    const finest = zoom.levels[0].block;
    section.appendChild(
      AV.el(
        "p",
        { id: "zoom-note", class: "note" },
        `Layer ${text.layer}: rows are queries, columns keys, on the log colour scale. Each colour is the largest weight of its block ` +
          `(blocks of ${finest === 1 ? "single cells" : `${finest}×${finest} cells`} at the finest zoom, twice as wide at each coarser one). ` +
          `Weights are read out exactly (4 decimals) in the rows embedded at full precision, queries ${exactRowsWords(zoom.exact_rows)}, ` +
          `once zoomed in to single cells; elsewhere the read-out gives the block's maximum and mean.`,
      ),
    );
    const readout = AV.el("p", { id: "zoom-readout", class: "readout", "aria-live": "polite" }, HINT);
    const canvas = AV.el("canvas", { id: "zoom-canvas", tabindex: 0, role: "img", width: VIEW_PX, height: VIEW_PX, style: "cursor:grab;touch-action:none" });
    section.appendChild(readout);
    const bar = AV.colourBar(AV.logScale(text.key_tokens.length), { height: 240, masked: text.causal });
    section.appendChild(AV.el("div", { class: "heatmap-figure" }, canvas, bar));
    const rows = text.query_tokens.length;
    const cols = text.key_tokens.length;
    shown = { section, textIndex, text, zoom, canvas, readout, rows, cols, cache: new Map(), request: 0 };
    shown.exactIndex = new Map(zoom.exact_rows.map((row, at) => [row, at]));
    shown.exact = await AV.decode(zoom.exact); // (H, exact rows, Nk)
    fit(shown);
    shown.cursor = { i: zoom.exact_rows[0] || 0, j: 0 };
    wire(shown);
    await draw(shown);
  }

  function fit(current) {
    current.scale = VIEW_PX / Math.max(current.rows, current.cols);
    current.x0 = 0; // key coordinate at the canvas's left edge
    current.y0 = 0; // query coordinate at its top edge
  }

  // The level drawn at this zoom: the finest whose blocks are at least a pixel (none skipped).
  function levelAt(current) {
    const wanted = Math.ceil(Math.log2(1 / current.scale) - 1e-9);
    const levels = current.zoom.levels;
    return levels.find((entry) => entry.level >= wanted) || levels[levels.length - 1];
  }

  function decodedLevel(current, head, entry) {
    const key = `${head}/${entry.level}`;
    if (!current.cache.has(key)) current.cache.set(key, Promise.all([AV.decode(entry.max[head]), AV.decode(entry.mean[head])]));
    return current.cache.get(key);
  }

  const singleCells = (current) => current.scale >= SINGLE_CELL_PX;

  // The block of the drawn level holding cell (i, j): its first and last query and key.
  function blockOf(current, entry, i, j) {
    const b = entry.block;
    const bi = Math.floor(i / b);
    const bj = Math.floor(j / b);
    return { bi, bj, q0: bi * b, q1: Math.min(current.rows, (bi + 1) * b) - 1, k0: bj * b, k1: Math.min(current.cols, (bj + 1) * b) - 1 };
  }

  async function draw(current) {
    const request = ++current.request; // a later draw wins
    const head = AV.state.head;
    const entry = levelAt(current);
    const [maxima, means] = await decodedLevel(current, head, entry);
    if (shown !== current || current.request !== request) return;
    Object.assign(current, { entry, maxima, means, head });
    const { rows, cols, scale, x0, y0, text } = current;
    const logScale = AV.logScale(cols);
    const causal = text.causal;
    const exactRows = current.exact.shape[1];
    const context = current.canvas.getContext("2d");
    const image = context.createImageData(VIEW_PX, VIEW_PX);
    const pixels = image.data;
    const b = entry.block;
    for (let py = 0; py < VIEW_PX; py++) {
      const i = Math.floor(y0 + (py + 0.5) / scale);
      const exactAt = scale >= 1 ? current.exactIndex.get(i) : undefined; // an exact row, each cell a pixel or more
      for (let px = 0; px < VIEW_PX; px++) {
        const j = Math.floor(x0 + (px + 0.5) / scale);
        let colour = BACKGROUND;
        if (i >= 0 && i < rows && j >= 0 && j < cols) {
          if (exactAt !== undefined) {
            colour = causal && j > i ? null : AV.colour(current.exact.values[(head * exactRows + exactAt) * cols + j], logScale);
          } else {
            const bi = Math.floor(i / b);
            const bj = Math.floor(j / b);
            const masked = causal && bj * b > Math.min(rows, (bi + 1) * b) - 1; // every cell of the block a future key
            colour = masked ? null : AV.colour(maxima.values[bi * entry.columns + bj], logScale);
          }
        }
        const p = 4 * (py * VIEW_PX + px);
        const [red, green, blue] = colour || [0xd0, 0xd0, 0xd0];
        pixels[p] = red;
        pixels[p + 1] = green;
        pixels[p + 2] = blue;
        pixels[p + 3] = 255;
      }
    }
    context.putImageData(image, 0, 0);
    drawCursor(current, context);
    Object.assign(current.canvas.dataset, { level: String(entry.level), scale: String(scale), x0: String(x0), y0: String(y0) });
    current.canvas.setAttribute("aria-label", `attention map of layer ${text.layer}, head ${head}: ${rows} queries × ${cols} keys, zoomable`);
    current.readout.textContent = readoutOf(current);
  }

  function drawCursor(current, context) {
    const { i, j } = current.cursor;
    const cell = singleCells(current) ? { q0: i, q1: i, k0: j, k1: j } : blockOf(current, current.entry, i, j);
    const x = (cell.k0 - current.x0) * current.scale;
    const y = (cell.q0 - current.y0) * current.scale;
    const width = Math.max(2, (cell.k1 - cell.k0 + 1) * current.scale);
    const height = Math.max(2, (cell.q1 - cell.q0 + 1) * current.scale);
    context.strokeStyle = "#ff2d55";
    context.lineWidth = 2;
    context.strokeRect(x - 1, y - 1, width + 2, height + 2);
  }

  function readoutOf(current) {
    const { i, j } = current.cursor;
    const text = current.text;
    const where = `head ${current.head}`;
    const query = AV.tokenLabel(text.shown_query_tokens, i);
    const key = AV.tokenLabel(text.shown_key_tokens, j);
    const exactAt = current.exactIndex.get(i);
    if (singleCells(current) && exactAt !== undefined) {
      const weight = text.causal && j > i ? "masked by the causal mask" : current.exact.values[(current.head * current.exact.shape[1] + exactAt) * current.cols + j].toFixed(4);
      return `${where} · query ${query} · key ${key} · ${weight}`;
    }
    const entry = current.entry;
    const block = blockOf(current, entry, i, j);
    if (text.causal && block.k0 > block.q1) return `${where} · query ${query} · key ${key} · masked by the causal mask`;
    const at = block.bi * entry.columns + block.bj;
    const max = AV.formatWeight(current.maxima.values[at], false);
    const mean = AV.formatWeight(current.means.values[at], false);
    if (entry.block === 1) {
      return `${where} · query ${query} · key ${key} · ${max} (stored as 256 levels of the log scale; exact rows: queries ${exactRowsWords(current.zoom.exact_rows)})`;
    }
    return (
      `${where} · block of queries ${span(block.q0, block.q1)} × keys ${span(block.k0, block.k1)} (${entry.block}×${entry.block} cells) · ` +
      `max ${max} · mean ${mean}`
    );
  }

  // Zoom by factor about a point of the canvas (pixels), within the whole map and MAX_CELL_PX a cell.
  function zoomAbout(current, factor, px, py) {
    const smallest = VIEW_PX / Math.max(current.rows, current.cols);
    const scale = Math.min(MAX_CELL_PX, Math.max(smallest, current.scale * factor));
    const x = current.x0 + px / current.scale;
    const y = current.y0 + py / current.scale;
    current.scale = scale;
    current.x0 = x - px / scale;
    current.y0 = y - py / scale;
    clampView(current);
  }

  function clampView(current) {
    const seen = VIEW_PX / current.scale; // cells across the view
    current.x0 = Math.min(Math.max(0, current.x0), Math.max(0, current.cols - seen));
    current.y0 = Math.min(Math.max(0, current.y0), Math.max(0, current.rows - seen));
  }

  // Pan so that the cursor's cell is in view.
  function follow(current) {
    const seen = VIEW_PX / current.scale;
    const { i, j } = current.cursor;
    if (j < current.x0 || j + 1 > current.x0 + seen) current.x0 = j + 0.5 - seen / 2;
    if (i < current.y0 || i + 1 > current.y0 + seen) current.y0 = i + 0.5 - seen / 2;
    clampView(current);
  }

  function cellAt(current, event) {
    const box = current.canvas.getBoundingClientRect();
    const px = ((event.clientX - box.left) / box.width) * VIEW_PX;
    const py = ((event.clientY - box.top) / box.height) * VIEW_PX;
    return { px, py, i: Math.floor(current.y0 + py / current.scale), j: Math.floor(current.x0 + px / current.scale) };
  }

  function wire(current) {
    const canvas = current.canvas;
    let drag = null;
    canvas.addEventListener("mousedown", (event) => {
      drag = { x: event.clientX, y: event.clientY, x0: current.x0, y0: current.y0 };
      canvas.style.cursor = "grabbing";
    });
    window.addEventListener("mouseup", () => {
      drag = null;
      canvas.style.cursor = "grab";
    });
    canvas.addEventListener("mousemove", (event) => {
      const box = canvas.getBoundingClientRect();
      if (drag) {
        const perPixel = VIEW_PX / box.width / current.scale;
        current.x0 = drag.x0 - (event.clientX - drag.x) * perPixel;
        current.y0 = drag.y0 - (event.clientY - drag.y) * perPixel;
        clampView(current);
        draw(current);
        return;
      }
      const at = cellAt(current, event);
      if (at.i < 0 || at.i >= current.rows || at.j < 0 || at.j >= current.cols) return;
      current.cursor = { i: at.i, j: at.j };
      draw(current);
    });
    canvas.addEventListener(
      "wheel",
      (event) => {
        event.preventDefault();
        const at = cellAt(current, event);
        zoomAbout(current, event.deltaY < 0 ? 1.25 : 0.8, at.px, at.py);
        draw(current);
      },
      { passive: false },
    );
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    canvas.addEventListener("keydown", (event) => {
      const move = moves[event.key];
      const cursorPx = () => [(current.cursor.j + 0.5 - current.x0) * current.scale, (current.cursor.i + 0.5 - current.y0) * current.scale];
      if (move && event.shiftKey) {
        const quarter = VIEW_PX / current.scale / 4;
        current.x0 += move[1] * quarter;
        current.y0 += move[0] * quarter;
        clampView(current);
      } else if (move) {
        const step = singleCells(current) ? 1 : current.entry.block;
        const i = Math.min(current.rows - 1, Math.max(0, current.cursor.i + move[0] * step));
        const j = Math.min(current.cols - 1, Math.max(0, current.cursor.j + move[1] * step));
        current.cursor = { i, j };
        follow(current);
      } else if (event.key === "+" || event.key === "=") {
        zoomAbout(current, 2, ...cursorPx());
        follow(current);
      } else if (event.key === "-") {
        zoomAbout(current, 0.5, ...cursorPx());
      } else if (event.key === "0") {
        fit(current);
      } else {
        return;
      }
      event.preventDefault();
      draw(current);
    });
  }

  AV.onChange((state, patch) => {
    if (!shown || !shown.section.isConnected || shown.textIndex !== state.text || "text" in patch) return;
    if (!("head" in patch)) return;
    shown.section.querySelector("#zoom-head").value = String(state.head);
    draw(shown);
  });

  // Only a report with a long text has the view (a short report's tabs are as they were).
  AV.registerView({ id: "zoom", title: "Zoom view", render, available: () => AV.data.texts.some((text) => Boolean(text.zoom)) });
})();
