// stats_view.js: the per-head statistics of every layer (stats.json's "heads" for this text),
// sortable by any column, and the attention rollout map with its token labels and a read-out:
// "token 3:吃 · input token 5:酸 · 0.1234". Cross-attention has neither: the view says why.
(() => {
  "use strict";
  const AV = window.AV;
  const MAP_SIDE_PX = 480;
  const MAX_CELL_PX = 36;
  const LABEL_PX = 14; // labels closer than this are thinned to every k-th

  // The columns in stats.csv's order; kind "share" columns are n/a where the tokens lack their token. A number's
  // definition and paper come with the record (statistics.definitions: analysis/head_numbers.py), not from here.
  const COLUMNS = [
    { key: "layer", title: "layer", kind: "index" },
    { key: "head", title: "head", kind: "index" },
    { key: "label", title: "label", kind: "label", about: "the head's clear pattern: its largest share among previous, next, same, [CLS] and [SEP] when at least the share threshold, else broad when its relative entropy is at least the broad threshold" },
    { key: "entropy", title: "entropy" },
    { key: "relative_entropy", title: "relative entropy" },
    { key: "mean_max", title: "mean max" },
    { key: "cls", title: "[CLS]", kind: "share", token: "[CLS]" },
    { key: "sep", title: "[SEP]", kind: "share", token: "[SEP]" },
    { key: "punctuation", title: "punctuation" },
    { key: "same", title: "same" },
    { key: "previous", title: "previous" },
    { key: "next", title: "next" },
    { key: "distance", title: "distance" },
  ];

  // ---- the table ----

  // The share columns whose token this text's tokens hold none of (key_kinds_note says so): "n/a".
  function absentKinds(text, statistics) {
    if (!statistics.key_kinds_note) return new Set();
    return new Set(COLUMNS.filter((column) => column.kind === "share" && !text.key_tokens.includes(column.token)).map((column) => column.key));
  }

  function cellText(row, column, absent) {
    const value = row[column.key];
    if (column.kind === "index") return String(value);
    if (column.kind === "label") return value === null || value === undefined ? "·" : value;
    if (absent.has(column.key)) return "n/a";
    return value.toFixed(3);
  }

  function compare(column, a, b) {
    const x = a[column.key];
    const y = b[column.key];
    if (column.kind === "label") {
      if (x === y) return 0;
      if (x === null || x === undefined) return 1; // unlabelled heads last
      if (y === null || y === undefined) return -1;
      return x < y ? -1 : 1;
    }
    return x - y;
  }

  function sortedRows(rows, column, direction) {
    const order = direction === "ascending" ? 1 : -1;
    // ties keep layer, head order
    return rows
      .map((row, index) => [row, index])
      .sort(([a, i], [b, j]) => order * compare(column, a, b) || i - j)
      .map(([row]) => row);
  }

  function statsTable(text, statistics) {
    const absent = absentKinds(text, statistics);
    const rows = statistics.heads;
    const table = AV.el("table", { id: "stats-table", class: "stats-table" });
    const caption = AV.el("caption", {}, `Every head of every layer on this text: ${rows.length} rows. Sort by a column with its heading's button.`);
    caption.style.textAlign = "left";
    table.appendChild(caption);
    table.style.fontVariantNumeric = "tabular-nums";
    const headRow = AV.el("tr");
    const body = AV.el("tbody");
    const sort = { key: "layer", direction: "ascending" }; // the rows come in layer, head order

    function fill() {
      const column = COLUMNS.find((candidate) => candidate.key === sort.key);
      const order = sort.key === "layer" && sort.direction === "ascending" ? rows : sortedRows(rows, column, sort.direction);
      AV.clear(body);
      for (const row of order) {
        const cells = COLUMNS.map((c) => {
          const cell = AV.el(c.key === "layer" || c.key === "head" ? "th" : "td", { "data-key": c.key, scope: c.key === "layer" ? "row" : null }, cellText(row, c, absent));
          Object.assign(cell.style, { padding: "0.05rem 0.5rem", textAlign: c.kind === "label" ? "left" : "right" });
          return cell;
        });
        body.appendChild(AV.el("tr", { "data-layer": row.layer, "data-head": row.head, "data-label": row.label || "" }, cells));
      }
      for (const th of headRow.children) th.setAttribute("aria-sort", th.dataset.key === sort.key ? sort.direction : "none");
    }

    for (const column of COLUMNS) {
      const defined = (statistics.definitions || {})[column.key];
      const about = column.about || (defined ? `${defined.definition} (${defined.paper})` : null);
      const button = AV.el("button", { type: "button", class: "small sort-button", title: about }, column.title);
      const th = AV.el("th", { scope: "col", "data-key": column.key, "aria-sort": "none" }, button);
      button.addEventListener("click", () => {
        // a new column sorts the way it is read first (indices and labels up, numbers largest first); again: reversed
        if (sort.key === column.key) sort.direction = sort.direction === "ascending" ? "descending" : "ascending";
        else Object.assign(sort, { key: column.key, direction: column.kind === "index" || column.kind === "label" ? "ascending" : "descending" });
        fill();
      });
      headRow.appendChild(th);
    }
    table.appendChild(AV.el("thead", {}, headRow));
    table.appendChild(body);
    fill();
    return table;
  }

  function statsNotes(statistics) {
    const notes = [];
    const thresholds = statistics.thresholds || {};
    if (thresholds.share !== undefined) {
      notes.push(
        `A share is the mean over queries of the total weight on keys of a kind. Label: the largest of the previous, next, same, [CLS] and [SEP] shares when it is at least ${thresholds.share}, ` +
          `else broad when the relative entropy is at least ${thresholds.broad_relative_entropy}; · none. Numbers to 3 decimals (stats.csv has them whole).`,
      );
    }
    if (statistics.key_kinds_note) notes.push(`n/a: ${statistics.key_kinds_note}.`);
    if (statistics.causal_note) notes.push(statistics.causal_note);
    return notes.map((note) => AV.el("p", { class: "note stats-note" }, note));
  }

  // ---- the rollout map ----

  function labels(container, tokens, along, cellSize) {
    const step = Math.max(1, Math.ceil(LABEL_PX / cellSize));
    container.style[along === "top" ? "height" : "width"] = `${tokens.length * cellSize}px`;
    for (let index = 0; index < tokens.length; index += step) {
      const centre = index * cellSize + cellSize / 2 + (along === "top" ? -LABEL_PX / 2 : LABEL_PX / 2);
      container.appendChild(AV.el("span", { style: `${along}:${centre}px`, title: AV.tokenLabel(tokens, index) }, tokens[index]));
    }
    return step;
  }

  async function rollout(section, text, textIndex) {
    section.appendChild(AV.el("h3", {}, "Attention rollout"));
    section.appendChild(
      AV.el("p", { class: "note" },
        "Rollout (Abnar & Zuidema 2020) follows the residual stream through the layers: per layer, average the heads, add the identity, " +
        "renormalise the rows, A'ₗ = (mean_h Aₗ,h + I) / 2; then R = A'_{L-1} ⋯ A'_0. Row i is how much token i after the last layer draws on each input token (columns)."),
    ); // prettier-ignore
    const weights = await AV.weights(textIndex, "rollout");
    if (!weights) return;
    const tokens = text.shown_query_tokens;
    const n = tokens.length;
    const logScale = AV.logScale(n);
    const cellSize = Math.min(MAX_CELL_PX, Math.max(1, Math.floor(MAP_SIDE_PX / n)));
    const canvas = AV.el("canvas", { id: "rollout-canvas", tabindex: 0, role: "img", "aria-label": `attention rollout: ${n} tokens × ${n} input tokens; arrow keys move over the cells` });
    AV.drawMap(canvas, weights, 0, n, n, { logScale, causal: text.causal, cellSize });
    const cursor = AV.el("div", { class: "heatmap-cursor", hidden: true });
    const keyLabels = AV.el("div", { class: "key-labels", "aria-hidden": "true" });
    const queryLabels = AV.el("div", { class: "query-labels", "aria-hidden": "true" });
    const step = labels(queryLabels, tokens, "top", cellSize);
    labels(keyLabels, tokens, "left", cellSize);
    const map = AV.el("div", { class: "heatmap-map rollout-map" }, AV.el("div", {}), keyLabels, queryLabels, AV.el("div", { style: "position:relative" }, canvas, cursor));
    const bar = AV.colourBar(logScale, { height: Math.min(240, Math.max(120, n * cellSize)), masked: text.causal });
    bar.setAttribute("id", "rollout-colourbar");
    const readout = AV.el("p", { id: "rollout-readout", class: "readout", "aria-live": "polite" }, "Hover a cell, or Tab to the map and move with the arrow keys, for its value.");
    const notes = [logScale ? "More than 64 tokens: a log colour scale from 0.001 to 1." : "Linear colour scale 0 to 1."];
    if (step > 1) notes.push(`Token labels thinned: one label every ${step} tokens (the read-out names every cell).`);
    if (text.causal) notes.push("Grey cells are masked by the causal mask.");
    section.appendChild(AV.el("p", { class: "note", id: "rollout-note" }, notes.join(" ")));
    section.appendChild(readout);
    const figure = AV.el("div", { class: "heatmap-figure rollout-figure" }, map, AV.el("div", { class: "heatmap-bar" }, bar));
    section.appendChild(figure);
    wireMap({ canvas, cursor, readout, weights, tokens, n, causal: text.causal });
  }

  function wireMap(map) {
    const { canvas, cursor, readout, weights, tokens, n, causal } = map;
    let at = null;
    let pinned = null;
    const point = (i, j) => {
      at = { i, j };
      const size = canvas.getBoundingClientRect().width / n;
      Object.assign(cursor.style, { left: `${j * size}px`, top: `${i * size}px`, width: `${Math.max(2, size)}px`, height: `${Math.max(2, size)}px` });
      cursor.hidden = false;
      const value = causal && j > i ? "masked by the causal mask" : AV.formatWeight(weights.values[i * n + j], weights.exact);
      readout.textContent = `token ${AV.tokenLabel(tokens, i)} · input token ${AV.tokenLabel(tokens, j)} · ${value}`;
    };
    const cellOf = (event) => {
      const box = canvas.getBoundingClientRect();
      const j = Math.floor(((event.clientX - box.left) / box.width) * n);
      const i = Math.floor(((event.clientY - box.top) / box.height) * n);
      return i >= 0 && i < n && j >= 0 && j < n ? { i, j } : null;
    };
    canvas.addEventListener("mousemove", (event) => {
      const cell = cellOf(event);
      if (cell) point(cell.i, cell.j);
    });
    canvas.addEventListener("mouseleave", () => {
      if (pinned) point(pinned.i, pinned.j);
      else cursor.hidden = true;
    });
    canvas.addEventListener("click", (event) => {
      const cell = cellOf(event);
      if (cell) point((pinned = cell).i, cell.j);
    });
    canvas.addEventListener("focus", () => {
      const cell = pinned || at || { i: 0, j: 0 };
      point(cell.i, cell.j);
    });
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1], PageUp: [-10, 0], PageDown: [10, 0] };
    canvas.addEventListener("keydown", (event) => {
      const move = moves[event.key];
      if (!move) return;
      event.preventDefault();
      const from = at || { i: 0, j: 0 };
      pinned = { i: Math.min(n - 1, Math.max(0, from.i + move[0])), j: Math.min(n - 1, Math.max(0, from.j + move[1])) };
      point(pinned.i, pinned.j);
    });
  }

  // ---- the view ----

  function why(text) {
    if (text.kv_text !== null && text.kv_text !== undefined) {
      return `No per-head statistics and no rollout for cross-attention: both run every layer as self-attention on the text's own tokens, and here the keys and values come from another text (“${text.kv_text}”), at layer ${text.layer} only.`;
    }
    return "This report holds no per-head statistics and no rollout for this text.";
  }

  async function render(section) {
    const textIndex = AV.state.text;
    const text = AV.current();
    section.appendChild(AV.el("h2", {}, "Statistics"));
    if (!text.statistics && !text.rollout) {
      section.appendChild(AV.el("p", { class: "note", id: "stats-missing" }, why(text)));
      return;
    }
    if (text.statistics) {
      for (const note of statsNotes(text.statistics)) section.appendChild(note);
      const wrapper = AV.el("div", { class: "stats-table-box" }, statsTable(text, text.statistics));
      wrapper.style.overflowX = "auto";
      section.appendChild(wrapper);
    } else {
      section.appendChild(AV.el("p", { class: "note", id: "stats-missing" }, "This report holds no per-head statistics for this text."));
    }
    if (text.rollout) await rollout(section, text, textIndex);
    else section.appendChild(AV.el("p", { class: "note", id: "rollout-missing" }, "This report holds no rollout for this text."));
  }

  AV.registerView({ id: "stats", title: "Statistics", render });
})();
