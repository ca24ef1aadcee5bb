// head_view.js: the tokens in two columns (queries, keys) and a line from each query to each key,
// one colour per head, its opacity the weight (BertViz's head view). Hover or focus a token to keep
// only its lines; click a line for its exact weight.
//
// Which lines: every query-key pair of every chosen head that the mask lets through (under a causal mask, a
// query's keys up to itself) while the text has at most ALL_PAIRS_TOKENS
// tokens a side; beyond, only weights >= LONG_TEXT_MIN_WEIGHT (the page says how many it left out).
// Heads chosen at first: all of them while that is at most DEFAULT_LINE_BUDGET lines, else head 0.
(() => {
  "use strict";
  const AV = window.AV;
  const ALL_PAIRS_TOKENS = 64;
  const LONG_TEXT_MIN_WEIGHT = 0.01;
  const DEFAULT_LINE_BUDGET = 20000;
  const ROW_PX = 22; // each token's row; line ends sit at its middle
  const LINES_WIDTH_PX = 240;
  const STRONGEST_SHOWN = 3; // keys (or queries) a focused token's read-out lists per head
  const SVG_NS = "http://www.w3.org/2000/svg";
  const HINT = "Hover or focus a token to keep only its lines; click a line for its weight.";

  let drawn = null; // what the section shows now: {section, textIndex, lines, queries, keys, ...}

  function isLong(text) {
    return Math.max(text.query_tokens.length, text.key_tokens.length) > ALL_PAIRS_TOKENS;
  }

  function defaultHeads(text) {
    const cols = text.key_tokens.length;
    let pairs = 0; // the query-key pairs the mask lets through, each a line when every weight is drawn
    for (let i = 0; i < text.query_tokens.length; i++) pairs += text.causal ? Math.min(cols, i + 1) : cols;
    const heads = AV.data.num_heads;
    return isLong(text) || heads * pairs > DEFAULT_LINE_BUDGET ? new Set([0]) : new Set(Array.from({ length: heads }, (_, h) => h));
  }

  // The heads ticked: state.heads once the reader has chosen, else this text's default.
  function chosenHeads() {
    return Array.from(AV.state.heads || defaultHeads(AV.current())).sort((a, b) => a - b);
  }

  function layerSelect(textIndex) {
    const select = AV.el("select", { id: "head-layer" });
    for (const layer of AV.layersOf(textIndex)) select.appendChild(AV.el("option", { value: layer }, `layer ${layer}`));
    select.value = String(AV.state.layer);
    select.addEventListener("change", () => AV.set({ layer: Number(select.value) }));
    return AV.el("label", { class: "control" }, "Layer ", select);
  }

  // --effect: each head's toggle says what taking it out does, for the layer shown ("KL 0.012"; in full on hover).
  function labelEffects(section) {
    for (const span of section.querySelectorAll(".head-effect")) {
      const head = Number(span.dataset.head);
      const effect = AV.effectText(AV.current(), AV.state.layer, head);
      span.textContent = effect ? ` ${AV.effectText(AV.current(), AV.state.layer, head, true)}` : "";
      span.parentElement.title = effect ? `head ${head} taken out: ${effect}` : "";
    }
  }

  function headToggles() {
    const chosen = new Set(chosenHeads());
    const box = AV.el("fieldset", { class: "head-toggles" }, AV.el("legend", {}, "Heads"));
    for (let head = 0; head < AV.data.num_heads; head++) {
      const input = AV.el("input", { type: "checkbox", class: "head-toggle", "data-head": head, id: `head-toggle-${head}` });
      input.checked = chosen.has(head);
      input.addEventListener("change", () => {
        const heads = new Set(chosenHeads());
        if (input.checked) heads.add(head);
        else heads.delete(head);
        AV.set({ heads });
      });
      const swatch = AV.el("span", { class: "swatch", style: `background:${AV.headColour(head)}`, "aria-hidden": "true" });
      const effect = AV.el("span", { class: "head-effect", "data-head": head });
      box.appendChild(AV.el("label", { class: "head-toggle-label", for: `head-toggle-${head}` }, input, swatch, String(head), effect));
    }
    const all = AV.el("button", { type: "button", class: "small", id: "head-all" }, "all");
    const none = AV.el("button", { type: "button", class: "small", id: "head-none" }, "none");
    all.addEventListener("click", () => AV.set({ heads: new Set(Array.from({ length: AV.data.num_heads }, (_, h) => h)) }));
    none.addEventListener("click", () => AV.set({ heads: new Set() }));
    box.appendChild(all);
    box.appendChild(none);
    return box;
  }

  function tokenColumn(tokens, side) {
    const column = AV.el("div", { class: `token-column ${side}`, role: "list", "aria-label": side === "query" ? "queries" : "keys" });
    tokens.forEach((token, index) => {
      column.appendChild(
        AV.el("div", { class: "token", role: "listitem", tabindex: 0, "data-side": side, "data-index": index, title: AV.tokenLabel(tokens, index) }, token),
      );
    });
    return column;
  }

  async function render(section) {
    const textIndex = AV.state.text;
    const text = AV.current();
    const rows = Math.max(text.query_tokens.length, text.key_tokens.length);
    const lines = document.createElementNS(SVG_NS, "svg");
    lines.setAttribute("id", "head-lines");
    lines.setAttribute("width", LINES_WIDTH_PX);
    lines.setAttribute("height", rows * ROW_PX);
    lines.setAttribute("aria-hidden", "true");
    const readout = AV.el("p", { id: "head-readout", class: "readout", "aria-live": "polite" }, HINT);
    const note = AV.el("p", { id: "head-note", class: "note" });
    const columns = AV.el(
      "div",
      { class: "head-columns", style: `--row:${ROW_PX}px` },
      AV.el("div", { class: "column-title" }, "queries"),
      AV.el("div", {}),
      AV.el("div", { class: "column-title" }, text.kv_text === null ? "keys" : "keys (--kv text)"),
      tokenColumn(text.shown_query_tokens, "query"),
      lines,
      tokenColumn(text.shown_key_tokens, "key"),
    );
    section.appendChild(AV.el("h2", {}, "Head view"));
    section.appendChild(AV.el("div", { class: "controls" }, layerSelect(textIndex), headToggles()));
    labelEffects(section);
    section.appendChild(note);
    section.appendChild(readout);
    section.appendChild(columns);
    section.appendChild(AV.selectionPanel("head")); // several queries or keys at once (selection.js)
    drawn = { section, textIndex, svg: lines, readout, note, columns, pinned: null, readFrom: null };
    wireTokens(columns);
    lines.addEventListener("click", (event) => {
      const line = event.target.closest("line");
      if (line) readOut({ head: Number(line.dataset.head), query: Number(line.dataset.query), key: Number(line.dataset.key) });
    });
    await drawLines();
  }

  // The lines of the chosen heads at state.layer, written in one go (parallel arrays for isolating).
  async function drawLines() {
    const current = drawn;
    const text = AV.data.texts[current.textIndex];
    const heads = chosenHeads();
    const layer = AV.state.layer;
    const request = (current.request || 0) + 1; // a later call (another layer, more heads) wins
    current.request = request;
    // Until the new lines are drawn the read-out would name the old ones' weights: it says nothing.
    if (current.elements) current.readout.textContent = HINT;
    const maps = await Promise.all(heads.map((head) => AV.headMap(current.textIndex, layer, head)));
    if (drawn !== current || current.request !== request) return;
    const rows = text.query_tokens.length;
    const cols = text.key_tokens.length;
    // float32 holds 0.01 as 0.0099999998: compare a hair lower, so a weight of 0.0100 is drawn
    const minWeight = isLong(text) ? LONG_TEXT_MIN_WEIGHT * (1 - 1e-6) : -1;
    const fragment = document.createDocumentFragment();
    const queries = [];
    const keys = [];
    const elements = [];
    let leftOut = 0;
    // Only the keys a query can see: the causal mask hides those after it, and a line there would be a weight of 0.
    const seen = (i) => (text.causal ? Math.min(cols, i + 1) : cols);
    heads.forEach((head, n) => {
      const map = maps[n];
      const colour = AV.headColour(head);
      for (let i = 0; i < rows; i++) {
        const y1 = String(i * ROW_PX + ROW_PX / 2);
        for (let j = 0; j < seen(i); j++) {
          const w = map.weights.values[map.offset + i * cols + j];
          if (w < minWeight) {
            leftOut++;
            continue;
          }
          const line = document.createElementNS(SVG_NS, "line");
          line.setAttribute("x1", "0");
          line.setAttribute("y1", y1);
          line.setAttribute("x2", String(LINES_WIDTH_PX));
          line.setAttribute("y2", String(j * ROW_PX + ROW_PX / 2));
          line.setAttribute("stroke", colour);
          line.setAttribute("stroke-opacity", w.toFixed(4));
          line.setAttribute("data-head", head);
          line.setAttribute("data-query", i);
          line.setAttribute("data-key", j);
          fragment.appendChild(line);
          elements.push(line);
          queries.push(i);
          keys.push(j);
        }
      }
    });
    AV.clear(current.svg).appendChild(fragment);
    const byHead = new Map(heads.map((head, n) => [head, maps[n]]));
    Object.assign(current, { elements, queries, keys, heads, layer, maps: byHead, exact: maps.every((map) => map.exact) });
    describe(current, text, heads, leftOut);
    if (current.pinned) isolate(current.pinned.side, current.pinned.index);
    // What was read out before (a token, or a line of a head still chosen) is read out again from these maps.
    const from = current.readFrom;
    if (from && (from.side !== undefined || heads.includes(from.head))) readOut(from);
    else current.readFrom = null;
  }

  function describe(current, text, heads, leftOut) {
    const cols = text.key_tokens.length;
    let pairs = 0; // the query-key pairs the mask lets through, each a line when every weight is drawn
    for (let i = 0; i < text.query_tokens.length; i++) pairs += text.causal ? Math.min(cols, i + 1) : cols;
    const parts = [];
    if (heads.length === 0) parts.push("No head chosen: tick a head to draw its lines.");
    else parts.push(`${current.elements.length.toLocaleString("en")} lines: ${heads.length === 1 ? "head" : "heads"} ${heads.join(", ")} of layer ${current.layer}, line opacity = weight.`);
    if (leftOut > 0) {
      parts.push(
        `This text has more than ${ALL_PAIRS_TOKENS} tokens, so only weights ≥ ${LONG_TEXT_MIN_WEIGHT} are drawn: ` +
          `${leftOut.toLocaleString("en")} of ${(pairs * heads.length).toLocaleString("en")} query-key pairs are left out (the heatmap view shows every weight).`,
      );
    }
    if (AV.data.num_heads > 1 && defaultHeads(text).size === 1 && heads.length === 1 && heads[0] === 0) {
      parts.push("Only head 0 is shown at first (every head's lines of a text this long would be too many to draw at once): tick more heads above.");
    }
    if (!current.exact) parts.push("This layer's weights are stored as 256 levels of the log colour scale: opacities and read-outs are approximate (≈).");
    if (AV.effectText(text, current.layer, 0)) parts.push(`Beside each head, ${AV.effectNote(text)}`);
    current.note.textContent = parts.join(" ");
  }

  function wireTokens(columns) {
    const tokenOf = (event) => event.target.closest && event.target.closest(".token");
    const enter = (event) => {
      const token = tokenOf(event);
      if (token) focusToken(token);
    };
    const leave = (event) => {
      const token = tokenOf(event);
      if (!token || (drawn && drawn.pinned)) return;
      token.classList.remove("active");
      restore();
    };
    columns.addEventListener("mouseover", enter);
    columns.addEventListener("focusin", enter);
    columns.addEventListener("mouseout", leave);
    columns.addEventListener("focusout", leave);
    // Click or Enter/Space pins a token's lines (again: unpins).
    const pin = (token) => {
      const current = drawn;
      const side = token.dataset.side;
      const index = Number(token.dataset.index);
      const same = current.pinned && current.pinned.side === side && current.pinned.index === index;
      for (const other of columns.querySelectorAll(".token.pinned")) other.classList.remove("pinned");
      current.pinned = same ? null : { side, index };
      if (same) restore();
      else {
        token.classList.add("pinned");
        focusToken(token, true);
      }
    };
    columns.addEventListener("click", (event) => {
      const token = tokenOf(event);
      if (token) pin(token);
    });
    columns.addEventListener("keydown", (event) => {
      const token = tokenOf(event);
      if (!token) return;
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        pin(token);
      } else if (event.key === "ArrowDown" || event.key === "ArrowUp") {
        event.preventDefault();
        const sibling = event.key === "ArrowDown" ? token.nextElementSibling : token.previousElementSibling;
        if (sibling) sibling.focus();
      }
    });
  }

  function focusToken(token, force = false) {
    const current = drawn;
    if (!current || (current.pinned && !force)) return;
    for (const other of current.columns.querySelectorAll(".token.active")) other.classList.remove("active");
    token.classList.add("active");
    const side = token.dataset.side;
    const index = Number(token.dataset.index);
    isolate(side, index);
    readOut({ side, index });
  }

  // The read-out of a token ({side, index}) or of a line ({head, query, key}), remembered so that
  // drawLines reads it out again for another layer or other heads.
  function readOut(what) {
    drawn.readFrom = what;
    drawn.readout.textContent = what.side !== undefined ? tokenReadout(what.side, what.index) : lineReadout(what.head, what.query, what.key);
  }

  // Every line whose data-query (or data-key) is not index gets class "hidden"; the tokens across
  // are shaded by their strongest weight with index over the chosen heads (also where no line is drawn).
  function isolate(side, index) {
    const current = drawn;
    const ends = side === "query" ? current.queries : current.keys;
    for (let n = 0; n < current.elements.length; n++) current.elements[n].classList.toggle("hidden", ends[n] !== index);
    const across = side === "query" ? "key" : "query";
    for (const token of current.columns.querySelectorAll(`.token[data-side="${across}"]`)) {
      const other = Number(token.dataset.index);
      let strongest = 0;
      for (const head of current.heads) strongest = Math.max(strongest, side === "query" ? weightOf(head, index, other) : weightOf(head, other, index));
      token.style.setProperty("--weight", strongest.toFixed(4));
      token.classList.add("shaded");
    }
  }

  function restore() {
    const current = drawn;
    if (!current || !current.elements) return;
    for (const line of current.elements) line.classList.remove("hidden");
    for (const token of current.columns.querySelectorAll(".token.shaded")) token.classList.remove("shaded");
  }

  function weightOf(head, i, j) {
    const current = drawn;
    const text = AV.data.texts[current.textIndex];
    const map = current.maps && current.maps.get(head);
    return map ? map.weights.values[map.offset + i * text.key_tokens.length + j] : NaN;
  }

  function lineReadout(head, i, j) {
    const text = AV.data.texts[drawn.textIndex];
    const w = weightOf(head, i, j);
    return `layer ${drawn.layer} · head ${head} · ${AV.tokenLabel(text.shown_query_tokens, i)} → ${AV.tokenLabel(text.shown_key_tokens, j)} ${AV.formatWeight(w, drawn.exact)}`;
  }

  // A token's strongest lines, per chosen head (the keyboard's way to the weights of its lines).
  function tokenReadout(side, index) {
    const current = drawn;
    const text = AV.data.texts[current.textIndex];
    const own = side === "query" ? text.shown_query_tokens : text.shown_key_tokens;
    const other = side === "query" ? text.shown_key_tokens : text.shown_query_tokens;
    const arrow = side === "query" ? "→" : "←";
    const parts = [];
    for (const head of current.heads.slice(0, 4)) {
      const ranked = other
        .map((_, n) => [n, side === "query" ? weightOf(head, index, n) : weightOf(head, n, index)])
        .sort((a, b) => b[1] - a[1])
        .slice(0, STRONGEST_SHOWN)
        .map(([n, w]) => `${AV.tokenLabel(other, n)} ${AV.formatWeight(w, current.exact)}`);
      parts.push(`head ${head}: ${ranked.join(", ")}`);
    }
    const more = current.heads.length > 4 ? ` (and ${current.heads.length - 4} more heads)` : "";
    return `layer ${current.layer} · ${AV.tokenLabel(own, index)} ${arrow} strongest: ${parts.join(" · ")}${more}`;
  }

  AV.onChange((state, patch) => {
    if (!drawn || !drawn.section.isConnected || drawn.textIndex !== state.text || "text" in patch) return;
    if ("layer" in patch) {
      const select = drawn.section.querySelector("#head-layer");
      if (select) select.value = String(state.layer);
      labelEffects(drawn.section);
    }
    if ("heads" in patch) {
      const chosen = new Set(chosenHeads());
      for (const input of drawn.section.querySelectorAll("input.head-toggle")) input.checked = chosen.has(Number(input.dataset.head));
    }
    if ("layer" in patch || "heads" in patch) drawLines();
  });

  AV.registerView({ id: "head", title: "Head view", render });
})();
