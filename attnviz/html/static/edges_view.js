// edges_view.js: only in a report of `attnviz patch --edges` (html/page.py PATCH_SCRIPTS; the record's "patch"."edges":
// edges.json's object with its largest edges in "top" in place of every edge's scores, analysis/edges.py). The
// circuit: every head a node (layers as rows, layer 0 at the bottom; with grouped-query heads the key/value heads as
// squares below their groups), the read-out on top, the top edges as lines coloured by sign (red raises the answer,
// blue lowers it) and as wide as |score|; hover a line or a row of the table for its numbers, EAP's (or EAP-IG's)
// score beside path patching's where it was checked.
(() => {
  "use strict";
  const AV = window.AV;
  const WIDTH_PX = 640; // the graph's width at most
  const HEIGHT_PX = 760; // and height
  const MARGIN = 44;
  const DASHES = { q: "", k: "6 3", v: "2 3", logits: "" };

  function diverging(value, reach) {
    const t = Math.min(1, Math.abs(value) / reach);
    const fade = Math.round(255 * (1 - t));
    return value >= 0 ? `rgb(${255 - Math.round(t * 152)},${fade},${fade})` : `rgb(${fade},${fade},${255 - Math.round(t * 158)})`;
  }

  const signed = (value) => (value >= 0 ? "+" : "") + value.toFixed(3);

  function numbersOf(edge) {
    const patched = edge.path_patched === null ? "not checked" : signed(edge.path_patched);
    return `${edge.sender} → ${edge.receiver} · score ${signed(edge.score)} · path patched ${patched}`;
  }

  function graph(edges, readout) {
    const { layers, heads, kv_heads: kvHeads } = edges;
    const grouped = kvHeads !== heads;
    const column = Math.max(18, Math.min(64, (WIDTH_PX - 2 * MARGIN) / heads));
    const row = Math.max(12, Math.min(56, (HEIGHT_PX - 2 * MARGIN) / (layers + 1)));
    const x = (head) => MARGIN + (head + 0.5) * column;
    const y = (layer) => MARGIN + (layers - layer) * row; // layer 0 at the bottom, the read-out (layer = layers) on top
    const place = (edge) => {
      if (edge.input === "logits") return [x((heads - 1) / 2), y(layers)];
      if (edge.input === "q" || !grouped) return [x(edge.receiver_head), y(edge.receiver_layer)];
      const group = heads / kvHeads;
      return [x((edge.receiver_head + 0.5) * group - 0.5), y(edge.receiver_layer - 0.3)];
    };
    const width = 2 * MARGIN + heads * column;
    const height = 2 * MARGIN + layers * row;
    const svg = AV.svg("svg", { id: "edges-graph", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
      "aria-label": `the ${edges.top.length} largest edges over ${layers} layers × ${heads} heads` });  // prettier-ignore
    const reach = Math.max(1e-9, ...edges.top.map((edge) => Math.abs(edge.score)));
    for (let layer = 0; layer < layers; layer++) {
      svg.appendChild(AV.svg("text", { x: 4, y: y(layer) + 4, "font-size": 10 }, `L${layer}`));
      for (let head = 0; head < heads; head++) {
        svg.appendChild(AV.svg("circle", { class: "edges-node", cx: x(head), cy: y(layer), r: Math.min(6, row / 3), fill: "#ddd", stroke: "#555", "data-layer": layer, "data-head": head }));
      }
      if (grouped && layer > 0) {
        const group = heads / kvHeads;
        for (let kv = 0; kv < kvHeads; kv++) {
          const side = Math.min(7, row / 3);
          svg.appendChild(AV.svg("rect", { x: x((kv + 0.5) * group - 0.5) - side / 2, y: y(layer - 0.3) - side / 2, width: side, height: side, fill: "#eee", stroke: "#555" }));
        }
      }
    }
    svg.appendChild(AV.svg("text", { x: 4, y: y(layers) + 4, "font-size": 10 }, "logits"));
    svg.appendChild(AV.svg("circle", { cx: x((heads - 1) / 2), cy: y(layers), r: 8, fill: "#ffe9a8", stroke: "#555" }));
    [...edges.top].reverse().forEach((edge) => { // the largest drawn last, on top
      const [x2, y2] = place(edge);
      const line = AV.svg("line", {
        class: "edges-edge", "data-sender": edge.sender, "data-receiver": edge.receiver,
        x1: x(edge.sender_head), y1: y(edge.sender_layer), x2, y2,
        stroke: diverging(edge.score, reach), "stroke-width": 1.5 + 4 * Math.abs(edge.score) / reach, "stroke-dasharray": DASHES[edge.input],
        tabindex: 0, "aria-label": numbersOf(edge),
      });  // prettier-ignore
      const show = () => { readout.textContent = numbersOf(edge); };
      line.addEventListener("mouseenter", show);
      line.addEventListener("focus", show);
      svg.appendChild(line);
    });
    return svg;
  }

  function table(edges, readout) {
    const header = AV.el("tr", {}, ...["sender", "receiver", "score", "path patched"].map((name) => AV.el("th", {}, name)));
    const rows = edges.checked.map((edge) => {
      const shown = { ...edge };
      const tr = AV.el("tr", { class: "edges-row" },
        AV.el("td", {}, edge.sender), AV.el("td", {}, edge.receiver), AV.el("td", { style: "text-align:right" }, signed(edge.score)),
        AV.el("td", { style: "text-align:right" }, signed(edge.path_patched)));  // prettier-ignore
      tr.addEventListener("mouseenter", () => { readout.textContent = numbersOf(shown); });
      return tr;
    });
    const caption = AV.el("caption", { style: "text-align:left;font-weight:600" }, "the top edges checked by path patching");
    return AV.el("table", { id: "edges-table", class: "stats-table" }, caption, AV.el("thead", {}, header), AV.el("tbody", {}, ...rows));
  }

  function render(section) {
    const text = AV.current();
    section.appendChild(AV.el("h2", {}, "Edges view"));
    const edges = text.patch && text.patch.edges;
    if (!edges) {
      section.appendChild(AV.el("p", { class: "note", id: "edges-missing" }, "This text has no edges (attnviz patch --edges)."));
      return;
    }
    const method = edges.method === "eap" ? "EAP" : `EAP-IG (${edges.ig_steps} steps)`;
    section.appendChild(AV.el("p", { class: "note", id: "edges-note" },
      `${method}, the ${edges.top.length} largest edges: solid q, dashed k, dotted v inputs; red raises the answer, blue lowers it. ` +
      `Score: ${edges.definitions.score}. Path patched: ${edges.definitions.path_patched}.`));  // prettier-ignore
    const readout = AV.el("p", { id: "edges-readout", class: "readout", "aria-live": "polite" }, "Hover an edge, or a row of the table, for its numbers.");
    section.appendChild(readout);
    section.appendChild(AV.el("div", { style: "display:flex;flex-wrap:wrap;align-items:flex-start;gap:1.5rem" }, graph(edges, readout), table(edges, readout)));
  }

  AV.registerView({ id: "edges", title: "Edges view", render, available: () => AV.data.texts.some((text) => Boolean(text.patch && text.patch.edges)) });
})();
