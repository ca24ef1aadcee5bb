// core.js: the report's shared namespace, window.AV (docs/formats.md, "report.html"): the record, the state and its
// listeners, decoding of the ENCODED weight arrays, DOM helpers that never parse markup, the colour
// scale of the PNGs (matplotlib's viridis, linear or log), map drawing, and the views' registry.
(() => {
  "use strict";

  const SVG_NS = "http://www.w3.org/2000/svg";
  const MAX_LINEAR_SCALE_KEYS = 64; // render/scales.py: more keys -> log scale
  const LOG_SCALE_MIN = 0.001;
  const LOG_LEVELS = 255; // uint8 codes 1..255 on the log scale (html/encoding.py)

  // matplotlib's viridis, 256 entries as rrggbb (colormaps["viridis"](i, bytes=True); the data is CC0).
  const VIRIDIS_HEX =
    "44015444025544035745055845065a45085b46095c460b5e460c5f460e61470f62471163471265471466471567471669" +
    "47186a48196b481a6c481c6e481d6f481e70482071482172482273482374472575472676472777472878472a79472b7a" +
    "472c7b462d7c462f7c46307d46317e45327f45347f453580453681443781443982433a83433b83433c84423d84423e85" +
    "4240854141864142864043874044873f45873f47883e48883e49893d4a893d4b893d4c893c4d8a3c4e8a3b508a3b518a" +
    "3a528b3a538b39548b39558b38568b38578c37588c37598c365a8c365b8c355c8c355d8c345e8d345f8d33608d33618d" +
    "32628d32638d31648d31658d31668d30678d30688d2f698d2f6a8d2e6b8e2e6c8e2e6d8e2d6e8e2d6f8e2c708e2c718e" +
    "2c728e2b738e2b748e2a758e2a768e2a778e29788e29798e287a8e287a8e287b8e277c8e277d8e277e8e267f8e26808e" +
    "26818e25828e25838d24848d24858d24868d23878d23888d23898d22898d228a8d228b8d218c8d218d8c218e8c208f8c" +
    "20908c20918c1f928c1f938b1f948b1f958b1f968b1e978a1e988a1e998a1e998a1e9a891e9b891e9c891e9d881e9e88" +
    "1e9f881ea0871fa1871fa2861fa38620a48520a58521a68521a78422a78423a88323a98224aa8225ab8126ac8127ad80" +
    "28ae7f29af7f2ab07e2bb17d2cb17d2eb27c2fb37b30b47a32b57a33b67935b77836b87738b97639b9763bba753dbb74" +
    "3ebc7340bd7242be7144be7045bf6f47c06e49c16d4bc26c4dc26b4fc36951c46853c56755c66657c66559c7645bc862" +
    "5ec96160c96062ca5f64cb5d67cc5c69cc5b6bcd596dce5870ce5672cf5574d05477d05279d1517cd24f7ed24e81d34c" +
    "83d34b86d44988d5478bd5468dd64490d64392d74195d73f97d83e9ad83c9dd93a9fd938a2da37a5da35a7db33aadb32" +
    "addc30afdc2eb2dd2cb5dd2bb7dd29bade27bdde26bfdf24c2df22c5df21c7e01fcae01ecde01dcfe11cd2e11bd4e11a" +
    "d7e219dae218dce218dfe318e1e318e4e318e7e419e9e419ece41aeee51bf1e51cf3e51ef6e61ff8e621fae622fde724";

  const VIRIDIS = Uint8Array.from(VIRIDIS_HEX.match(/../g), (pair) => parseInt(pair, 16)); // 256 × rgb

  const AV = {
    data: null,
    state: { text: 0, layer: 0, head: 0, heads: null, view: "head" },
    views: [],
    readyMs: null,
    MASKED: "#d0d0d0",
  };
  const MASKED_RGB = [0xd0, 0xd0, 0xd0];
  const listeners = [];

  AV.onChange = (fn) => {
    listeners.push(fn);
  };

  AV.set = (patch) => {
    Object.assign(AV.state, patch);
    for (const fn of listeners) fn(AV.state, patch);
  };

  AV.current = () => AV.data.texts[AV.state.text];

  AV.registerView = (view) => {
    AV.views.push(view);
  };

  // ---- DOM: attributes through setAttribute, text through text nodes: never markup ----

  function build(element, attrs, children) {
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      element.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      element.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return element;
  }

  AV.el = (tag, attrs, ...children) => build(document.createElement(tag), attrs, children);
  AV.svg = (tag, attrs, ...children) => build(document.createElementNS(SVG_NS, tag), attrs, children);

  AV.clear = (node) => {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  };

  // ---- numbers and labels ----

  AV.formatWeight = (w, exact = true) => {
    if (exact) return w.toFixed(4);
    return w > 0 ? "≈ " + w.toFixed(4) : "< 0.001";
  };

  AV.tokenLabel = (tokens, i) => `${i}:${tokens[i]}`;

  // A map's query labels down the left and key labels (vertical) along the top, into the two boxes of a
  // .heatmap-map (report.css), every step-th when the cells are smaller than a label's line; returns the step.
  const LABEL_PX = 14; // a label's line: labels closer than this are thinned to every k-th
  AV.tokenLabels = (queryBox, keyBox, text, cellSize, rows, cols) => {
    const step = Math.max(1, Math.ceil(LABEL_PX / cellSize));
    const place = (container, tokens, along, length) => {
      AV.clear(container);
      container.style[along === "top" ? "height" : "width"] = `${length}px`;
      for (let index = 0; index < tokens.length; index += step) {
        // a query label's top edge; a key label's left edge before its turn about that corner (report.css)
        const centre = index * cellSize + cellSize / 2 + (along === "top" ? -LABEL_PX / 2 : LABEL_PX / 2);
        container.appendChild(AV.el("span", { style: `${along}:${centre}px`, title: AV.tokenLabel(tokens, index) }, tokens[index]));
      }
    };
    place(queryBox, text.shown_query_tokens, "top", rows * cellSize);
    place(keyBox, text.shown_key_tokens, "left", cols * cellSize);
    return step;
  };

  // A head's effect when taken out (the record's "effects", --effect), as heads.png's titles say it: every name,
  // "KL 0.012 · Δloss +0.004", or short the first, "KL 0.012"; decimals that show the layer's largest value to 2
  // significant digits (render/titles.py's effect_decimals). null when the report did not measure that layer.
  AV.effectText = (text, layer, head, short = false) => {
    const effects = text.effects;
    const row = effects ? effects.layers.indexOf(layer) : -1;
    if (row < 0) return null;
    const names = Object.keys(effects.short_names);
    const said = names.map((name) => {
      const values = effects[name][row];
      const largest = Math.max(...values.map(Math.abs));
      const decimals = largest > 0 ? Math.min(5, Math.max(3, 1 - Math.floor(Math.log10(largest)))) : 3;
      const value = values[head];
      return `${effects.short_names[name]} ${name === "loss" && value >= 0 ? "+" : ""}${value.toFixed(decimals)}`;
    });
    return short ? said[0] : said.join(" · ");
  };

  // What the effect beside a head is, for a view's note: "its effect (--effect, zero ablation): each head taken out, ...".
  AV.effectNote = (text) =>
    text.effects
      ? `its effect (--effect, ${text.effects.ablation} ablation): each head taken out, ${text.effects.ablation_definition}, and the model run again; ` +
        Object.entries(text.effects.short_names).map(([name, short]) => `${short}: ${text.effects.definitions[name]}`).join("; ") + "."
      : null;

  // ---- decoding ENCODED arrays: base64 -> zlib ("deflate") -> little-endian codes -> Float32Array ----

  function base64Bytes(text) {
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  }

  async function inflate(bytes) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer();
  }

  function littleEndianUint16(buffer) {
    const view = new DataView(buffer);
    const codes = new Uint16Array(buffer.byteLength / 2);
    for (let i = 0; i < codes.length; i++) codes[i] = view.getUint16(2 * i, true);
    return codes;
  }

  const IS_LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

  function valuesOf(encoded, buffer) {
    if (encoded.dtype === "float32") {
      // values as they are (why's terms, the neuron view's vectors): no scale
      if (IS_LITTLE_ENDIAN) return new Float32Array(buffer);
      const view = new DataView(buffer);
      return Float32Array.from({ length: buffer.byteLength / 4 }, (_, i) => view.getFloat32(4 * i, true));
    }
    if (encoded.unit !== undefined && (encoded.dtype === "uint16" || encoded.dtype === "uint8")) {
      // codes in units: the weights' uint16 in 1e-4, indices (why's pairs) in uint16 or uint8
      const codes = encoded.dtype === "uint8" ? new Uint8Array(buffer) : IS_LITTLE_ENDIAN ? new Uint16Array(buffer) : littleEndianUint16(buffer);
      const values = new Float32Array(codes.length);
      const unit = encoded.unit;
      for (let i = 0; i < codes.length; i++) values[i] = codes[i] * unit;
      return values;
    }
    if (encoded.dtype === "uint8") {
      // code 0: below log_min (0 here, read out as "< 0.001"); c >= 1: 10 ** (decades * (c - 1) / 254 - decades)
      const decades = -Math.log10(encoded.log_min);
      const level = new Float32Array(256);
      for (let c = 1; c < 256; c++) level[c] = 10 ** ((decades * (c - 1)) / (LOG_LEVELS - 1) - decades);
      const codes = new Uint8Array(buffer);
      const values = new Float32Array(codes.length);
      for (let i = 0; i < codes.length; i++) values[i] = level[codes[i]];
      return values;
    }
    throw new Error(`attnviz: unknown weights dtype ${encoded.dtype}`);
  }

  function stridesOf(shape) {
    const strides = new Array(shape.length);
    let step = 1;
    for (let axis = shape.length - 1; axis >= 0; axis--) {
      strides[axis] = step;
      step *= shape[axis];
    }
    return strides;
  }

  AV.decode = async (encoded) => {
    const values = valuesOf(encoded, await inflate(base64Bytes(encoded.data)));
    const expected = encoded.shape.reduce((a, b) => a * b, 1);
    if (values.length !== expected) throw new Error(`attnviz: ${values.length} weights decoded, shape needs ${expected}`);
    const strides = stridesOf(encoded.shape);
    return {
      shape: encoded.shape.slice(),
      values,
      exact: encoded.dtype === "uint16",
      at: (...indices) => values[indices.reduce((flat, index, axis) => flat + index * strides[axis], 0)],
    };
  };

  const decoded = new Map(); // "text/name" -> Promise<Weights|null>

  AV.weights = (textIndex, name) => {
    const key = `${textIndex}/${name}`;
    if (!decoded.has(key)) {
      const encoded = AV.data.texts[textIndex][name];
      decoded.set(key, encoded ? AV.decode(encoded) : Promise.resolve(null));
    }
    return decoded.get(key);
  };

  AV.forgetWeights = () => decoded.clear(); // a new record (AV.start): its texts' weights are its own

  // Only the shown text's weights stay decoded: a file of many long texts would otherwise hold
  // every text's layers (75 MB of Float32Array for a 512-token text).
  AV.onChange((state, patch) => {
    if (!("text" in patch)) return;
    for (const key of decoded.keys()) if (!key.startsWith(`${state.text}/`)) decoded.delete(key);
  });

  // One head's map of one layer: the run's layer from "attention" (exact), any other from "layers".
  // Resolves {weights, offset, rows, cols, exact} or null when the report does not hold that layer.
  AV.headMap = async (textIndex, layer, head) => {
    const text = AV.data.texts[textIndex];
    const rows = text.query_tokens.length;
    const cols = text.key_tokens.length;
    const fromRun = layer === text.layer;
    const weights = await AV.weights(textIndex, fromRun ? "attention" : "layers");
    if (!weights) return null;
    const offset = ((fromRun ? 0 : layer * weights.shape[1]) + head) * rows * cols;
    return { weights, offset, rows, cols, exact: weights.exact };
  };

  // The layers a text's views can show: every layer when "layers" is there, else the run's alone.
  AV.layersOf = (textIndex) => {
    const text = AV.data.texts[textIndex];
    if (!text.layers) return [text.layer];
    return Array.from({ length: text.layers.shape[0] }, (_, layer) => layer);
  };

  // ---- the colour scale of the PNGs (render/scales.py) ----

  AV.logScale = (numKeys) => numKeys > MAX_LINEAR_SCALE_KEYS;

  // matplotlib's Colormap: index floor(x * 256), clipped to 0..255; the log scale's x = log10(w / 0.001) / 3.
  function colourIndex(w, logScale) {
    let x;
    if (logScale) x = w > LOG_SCALE_MIN ? Math.log10(w / LOG_SCALE_MIN) / -Math.log10(LOG_SCALE_MIN) : 0;
    else x = w;
    const index = Math.floor(x * 256);
    return index < 0 ? 0 : index > 255 ? 255 : index;
  }

  AV.colour = (w, logScale) => {
    const i = 3 * colourIndex(w, logScale);
    return [VIRIDIS[i], VIRIDIS[i + 1], VIRIDIS[i + 2]];
  };

  AV.colourCss = (w, logScale) => `rgb(${AV.colour(w, logScale).join(",")})`;

  // Draws rows × cols weights (row-major, from values[offset]) into canvas, one colour per cell, no
  // blending. cellSize: pixels per cell (integer >= 1). maxSide: when the map has more cells than that
  // along a side, each pixel shows the largest weight of its block (render/scales.py's block_maximum),
  // so a one-hot row stays its brightest colour. causal: cells above the diagonal are masked (grey).
  // Returns the block size (1: every cell has its own pixels).
  AV.drawMap = (canvas, weights, offset, rows, cols, options = {}) => {
    const values = weights.values || weights;
    const logScale = options.logScale !== undefined ? options.logScale : AV.logScale(cols);
    const causal = Boolean(options.causal);
    const maxSide = options.maxSide || Infinity;
    const block = Math.max(1, Math.ceil(rows / maxSide), Math.ceil(cols / maxSide));
    const cellSize = block > 1 ? 1 : Math.max(1, Math.floor(options.cellSize || 1));
    const shownRows = Math.ceil(rows / block);
    const shownCols = Math.ceil(cols / block);
    canvas.width = shownCols * cellSize;
    canvas.height = shownRows * cellSize;
    const context = canvas.getContext("2d");
    const image = context.createImageData(canvas.width, canvas.height);
    const pixels = image.data;
    for (let r = 0; r < shownRows; r++) {
      for (let c = 0; c < shownCols; c++) {
        let best = -1; // the block's largest unmasked weight; -1: every cell masked
        for (let i = r * block; i < Math.min(rows, (r + 1) * block); i++) {
          const rowStart = offset + i * cols;
          const last = Math.min(cols, (c + 1) * block);
          for (let j = c * block; j < last; j++) {
            if (causal && j > i) break;
            const w = values[rowStart + j];
            if (w > best) best = w;
          }
        }
        let red, green, blue;
        if (best < 0) [red, green, blue] = MASKED_RGB;
        else {
          const k = 3 * colourIndex(best, logScale);
          red = VIRIDIS[k];
          green = VIRIDIS[k + 1];
          blue = VIRIDIS[k + 2];
        }
        for (let y = r * cellSize; y < (r + 1) * cellSize; y++) {
          let p = 4 * (y * canvas.width + c * cellSize);
          for (let x = 0; x < cellSize; x++, p += 4) {
            pixels[p] = red;
            pixels[p + 1] = green;
            pixels[p + 2] = blue;
            pixels[p + 3] = 255;
          }
        }
      }
    }
    context.putImageData(image, 0, 0);
    canvas.dataset.block = String(block);
    return block;
  };

  // A layers × columns grid (summaries_view.js, diff_view.js): values[layer][column] as square SVG cells of side
  // options.cell, coloured by options.colourOf(value); head numbers above when there are several columns, layer labels
  // beside. Hovering a cell, or the arrow keys on the focused grid, outline it and call options.readout(layer, column);
  // the keys start from options.start ([layer, column]). Clicking a cell, or Enter on the outlined one, calls
  // options.choose(layer, column) when given (patch_view.js, roles_view.js: the head opened). options.attrs: the svg's
  // own attributes (class, aria-label...).
  const GRID_LABEL_PX = 64; // "layer 99" at 12px (about 7px a character) and its gap, never clipped
  const GRID_TOP_PX = 18;
  AV.layerHeadGrid = (values, options) => {
    const { cell, colourOf, readout } = options;
    const layers = values.length;
    const columns = values[0].length;
    const svg = AV.svg("svg", { width: GRID_LABEL_PX + columns * cell + 2, height: GRID_TOP_PX + layers * cell + 2, tabindex: 0, role: "img", ...options.attrs });
    if (columns > 1) {
      const every = Math.ceil(columns / Math.max(1, Math.floor((columns * cell) / 22)));
      for (let column = 0; column < columns; column += every) {
        svg.appendChild(AV.svg("text", { x: GRID_LABEL_PX + (column + 0.5) * cell, y: GRID_TOP_PX - 5, "text-anchor": "middle", class: "colour-bar-label" }, String(column)));
      }
    }
    for (let layer = 0; layer < layers; layer += Math.ceil(14 / cell)) {
      svg.appendChild(AV.svg("text", { x: GRID_LABEL_PX - 4, y: GRID_TOP_PX + (layer + 0.5) * cell + 4, "text-anchor": "end", class: "colour-bar-label" }, `layer ${layer}`));
    }
    for (let layer = 0; layer < layers; layer++) {
      for (let column = 0; column < columns; column++) {
        const fill = colourOf(values[layer][column]);
        svg.appendChild(AV.svg("rect", { x: GRID_LABEL_PX + column * cell, y: GRID_TOP_PX + layer * cell, width: cell, height: cell, fill, "data-layer": layer, "data-head": column }));
      }
    }
    const cursor = AV.svg("rect", { width: cell, height: cell, fill: "none", stroke: "#ff2d55", "stroke-width": 2, visibility: "hidden", "pointer-events": "none" });
    svg.appendChild(cursor);
    let [atLayer, atColumn] = options.start || [0, 0];
    const point = (layer, column) => {
      [atLayer, atColumn] = [layer, column];
      cursor.setAttribute("x", GRID_LABEL_PX + column * cell);
      cursor.setAttribute("y", GRID_TOP_PX + layer * cell);
      cursor.setAttribute("visibility", "visible");
      readout(layer, column);
    };
    svg.addEventListener("mouseover", (event) => {
      const target = event.target;
      if (target.dataset && target.dataset.layer !== undefined) point(Number(target.dataset.layer), Number(target.dataset.head));
    });
    svg.addEventListener("focus", () => point(atLayer, atColumn));
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    svg.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && options.choose) options.choose(atLayer, atColumn);
      const move = moves[event.key];
      if (!move) return;
      event.preventDefault();
      point(Math.min(layers - 1, Math.max(0, atLayer + move[0])), Math.min(columns - 1, Math.max(0, atColumn + move[1])));
    });
    if (options.choose) {
      svg.addEventListener("click", (event) => {
        const target = event.target;
        if (target.dataset && target.dataset.layer !== undefined) options.choose(Number(target.dataset.layer), Number(target.dataset.head));
      });
    }
    return svg;
  };

  // A vertical colour bar with its numbers: linear 0, 0.25, …, 1 or log 0.001, 0.01, 0.1, 1
  // (options.masked adds the grey of causal-masked cells).
  AV.colourBar = (logScale, options = {}) => {
    const height = options.height || 240;
    const barWidth = 16;
    const top = 8;
    const strips = 128;
    const ticks = logScale ? [0.001, 0.01, 0.1, 1] : [0, 0.25, 0.5, 0.75, 1];
    const position = (w) => (logScale ? Math.log10(w / LOG_SCALE_MIN) / -Math.log10(LOG_SCALE_MIN) : w);
    const extra = options.masked ? 34 : 0;
    const bar = AV.svg("svg", {
      class: "colour-bar",
      width: 86,
      height: height + 2 * top + extra,
      role: "img",
      "aria-label": logScale ? "colour scale: log, 0.001 to 1" : "colour scale: linear, 0 to 1",
    });
    for (let s = 0; s < strips; s++) {
      const x = (s + 0.5) / strips;
      const w = logScale ? LOG_SCALE_MIN * 10 ** (x * -Math.log10(LOG_SCALE_MIN)) : x;
      const y = top + height * (1 - (s + 1) / strips);
      bar.appendChild(AV.svg("rect", { x: 0, y: y.toFixed(2), width: barWidth, height: (height / strips + 0.5).toFixed(2), fill: AV.colourCss(w, logScale) }));
    }
    bar.appendChild(AV.svg("rect", { x: 0, y: top, width: barWidth, height, fill: "none", class: "colour-bar-frame" }));
    for (const tick of ticks) {
      const y = top + height * (1 - position(tick));
      bar.appendChild(AV.svg("line", { x1: barWidth, x2: barWidth + 4, y1: y, y2: y, class: "colour-bar-tick" }));
      bar.appendChild(AV.svg("text", { x: barWidth + 7, y: y + 4, class: "colour-bar-label" }, String(tick)));
    }
    if (options.masked) {
      const y = top + height + 16;
      bar.appendChild(AV.svg("rect", { x: 0, y, width: barWidth, height: 12, fill: AV.MASKED, class: "colour-bar-frame" }));
      bar.appendChild(AV.svg("text", { x: barWidth + 7, y: y + 10, class: "colour-bar-label" }, "masked"));
    }
    return bar;
  };

  // One distinct colour per head: Tableau 10 and two more, then hues spaced by the golden angle.
  const HEAD_COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#8c564b"];
  AV.headColour = (head) => HEAD_COLOURS[head] || `hsl(${Math.round((head * 137.508) % 360)}, 62%, 52%)`;

  window.AV = AV;
})();
