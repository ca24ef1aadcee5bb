// neuron_view.js: BertViz's neuron view (Vig 2019) for every head of the run's layer. For the query and the key chosen,
// each head's query vector q and key vector k (after RoPE; heads that share a key/value head show its k), their
// elementwise product q × k, and its sum q · k, the head's score before the scale, with scale × q · k and the weight
// the map holds. From the record's "vectors" (html/record.py: texts of at most 64 tokens); hover a cell for its numbers.
(() => {
  "use strict";
  const AV = window.AV;
  const CELL_PX = 7;
  const ROW_PX = 12;
  const LABEL_PX = 46;
  const HINT = "Hover a cell for its q, k and product.";

  // Blue for negative, red for positive, white at 0; |value| / largest of its strip sets the strength.
  function cellColour(value, largest) {
    const t = largest > 0 ? Math.min(1, Math.abs(value) / largest) : 0;
    const [r, g, b] = value >= 0 ? [214, 39, 40] : [31, 119, 180];
    const mix = (c) => Math.round(255 + (c - 255) * t);
    return `rgb(${mix(r)},${mix(g)},${mix(b)})`;
  }

  function tokenSelect(id, label, tokens, current) {
    const select = AV.el("select", { id });
    tokens.forEach((token, index) => select.appendChild(AV.el("option", { value: index }, AV.tokenLabel(tokens, index))));
    select.value = String(current);
    return [select, AV.el("label", { class: "control" }, `${label} `, select)];
  }

  // One head's three strips (q, k, q × k) as SVG rects, each cell with its channel in data-channel.
  function strips(head, q, k, readout) {
    const product = q.map((value, c) => value * k[c]);
    const rows = [["q", q], ["k", k], ["q × k", product]];
    const svg = AV.svg("svg", { class: "neuron-strips", width: LABEL_PX + q.length * CELL_PX, height: rows.length * ROW_PX, "data-head": head, role: "img", "aria-label": `head ${head}: q, k and their product` });
    rows.forEach(([name, values], row) => {
      const largest = Math.max(...values.map(Math.abs));
      svg.appendChild(AV.svg("text", { x: 0, y: row * ROW_PX + ROW_PX - 2, class: "colour-bar-label" }, name));
      values.forEach((value, c) => {
        svg.appendChild(AV.svg("rect", { x: LABEL_PX + c * CELL_PX, y: row * ROW_PX, width: CELL_PX - 1, height: ROW_PX - 2, fill: cellColour(value, largest), "data-channel": c }));
      });
    });
    svg.addEventListener("mouseover", (event) => {
      const channel = event.target.dataset && event.target.dataset.channel;
      if (channel === undefined) return;
      const c = Number(channel);
      readout.textContent = `head ${head} · channel ${c}: q ${q[c].toFixed(4)} × k ${k[c].toFixed(4)} = ${product[c].toFixed(4)}`;
    });
    return [svg, product.reduce((sum, value) => sum + value, 0)];
  }

  async function render(section) {
    const textIndex = AV.state.text;
    const text = AV.current();
    section.appendChild(AV.el("h2", {}, "Neuron view"));
    const vectors = text.vectors;
    if (!vectors) {
      section.appendChild(AV.el("p", { class: "note", id: "neuron-none" }, "This text's record holds no query and key vectors (texts of at most 64 tokens over tokens have them)."));
      return;
    }
    const [querySelect, queryControl] = tokenSelect("neuron-query", "Query", text.shown_query_tokens, 0);
    const [keySelect, keyControl] = tokenSelect("neuron-key", "Key", text.shown_key_tokens, 0);
    section.appendChild(AV.el("div", { class: "controls" }, queryControl, keyControl));
    const biasNote = vectors.position_bias ? " This model adds a position bias to the scaled scores: the weight is not softmax(scale × q · k) alone." : "";
    section.appendChild(
      AV.el("p", { class: "note", id: "neuron-note" },
        `Layer ${text.layer}, every head: q of the query and k of the key after RoPE, their elementwise product, and its sum q · k, the head's score ` +
        `before the scale (× ${vectors.scale.toPrecision(6)}); the weight is the softmax of the scaled scores over the keys.` +
        (vectors.group_size > 1 ? ` ${vectors.group_size} query heads share each key/value head, and its k.` : "") + biasNote),
    );
    const readout = AV.el("p", { id: "neuron-readout", class: "readout", "aria-live": "polite" }, HINT);
    section.appendChild(readout);
    const body = AV.el("div", { id: "neuron-heads" });
    section.appendChild(body);
    const [map, q, k] = await Promise.all([AV.headMap(textIndex, text.layer, 0), AV.decode(vectors.q), AV.decode(vectors.k)]);
    // head h's vector at a position: (H, N, d) row-major, as plain numbers (their products in double precision)
    const vectorOf = (encoded, head, position) => {
      const size = encoded.shape[2];
      const start = (head * encoded.shape[1] + position) * size;
      return Array.from(encoded.values.subarray(start, start + size));
    };

    const draw = () => {
      const i = Number(querySelect.value);
      const j = Number(keySelect.value);
      AV.clear(body);
      for (let head = 0; head < q.shape[0]; head++) {
        const kvHead = Math.floor(head / vectors.group_size);
        const [svg, sum] = strips(head, vectorOf(q, head, i), vectorOf(k, kvHead, j), readout);
        const weight = map ? map.weights.values[map.offset + (head * map.rows + i) * map.cols + j] : null;
        const masked = text.causal && j > i;
        body.appendChild(
          AV.el("div", { class: "neuron-head", "data-head": head },
            AV.el("p", { class: "neuron-numbers" },
              AV.el("span", { style: `color:${AV.headColour(head)}` }, `head ${head}`),
              vectors.group_size > 1 ? ` (key/value head ${kvHead})` : "",
              " · q · k = ", AV.el("span", { class: "neuron-sum", "data-head": head }, sum.toFixed(4)),
              " · × scale = ", AV.el("span", { class: "neuron-scaled", "data-head": head }, (sum * vectors.scale).toFixed(4)),
              " · weight ", AV.el("span", { class: "neuron-weight", "data-head": head }, masked ? "masked" : weight === null ? "–" : AV.formatWeight(weight, map.exact))),
            svg),
        );
      }
      readout.textContent = HINT;
    };
    querySelect.addEventListener("change", draw);
    keySelect.addEventListener("change", draw);
    draw();
  }

  AV.registerView({ id: "neuron", title: "Neuron view", render, available: () => AV.data.texts.some((text) => Boolean(text.vectors)) });
})();
