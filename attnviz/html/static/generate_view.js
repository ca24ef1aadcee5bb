// generate_view.js: only in a report of `attnviz generate` (html/page.py GENERATE_SCRIPTS; the record's "generation":
// html/record.py generation_of). The prompt and its continuation one generated token at a time: at step s the
// generated token s is outlined, the tokens after it are not written yet, and the tokens are coloured by one row
// of the chosen layer and head (or the mean over the heads), as the Rows select says (analysis/generation.py's
// ROWS): "chosen", the row that chose token s, that of the token before it (underlined), over the tokens before
// token s; or "read", token s's own row, over the tokens before it and itself. Both are rows of the record's
// query_rows (L, H, n + 1, T), those of the positions P - 1 .. P + n - 1: token s's chosen row is row s, its read
// row s + 1. A step's read-out: its token, whose row it is, its sink share (the weight on the first token), its
// share on the token before the row's query, its entropy, its mean distance back (tokens, weighted) and the token
// it attends to most: the summaries of every head (analysis/head_summaries.py) for one row.
// Shown first.
(() => {
  "use strict";
  const AV = window.AV;

  function select(id, label, options, current, onChange) {
    const element = AV.el("select", { id });
    for (const [value, text] of options) element.appendChild(AV.el("option", { value }, text));
    element.value = String(current);
    element.addEventListener("change", () => onChange(element.value));
    return AV.el("label", { class: "control" }, `${label} `, element);
  }

  async function render(section) {
    const text = AV.current();
    const generation = text.generation;
    section.appendChild(AV.el("h2", {}, "Generation"));
    if (!generation) {
      section.appendChild(AV.el("p", { class: "note", id: "generation-missing" }, "This text was not continued by the model."));
      return;
    }
    const rows = await AV.decode(generation.query_rows); // (L, H, n + 1, T): the rows of positions P - 1 .. P + n - 1
    const [layers, heads, queries, total] = rows.shape;
    const steps = queries - 1;
    const prompt = generation.prompt_length;
    const logScale = AV.logScale(total);
    const shown = { step: steps - 1, layer: Math.min(AV.state.layer, layers - 1), head: "mean", rows: generation.rows_are };
    const how = generation.sample ? `sampled from the next-token distribution (seed ${generation.seed})` : "greedy (the most likely next token each time)";
    section.appendChild(
      AV.el("p", { class: "note", id: "generation-note" },
        `The model continued the prompt by ${steps} tokens, ${how}, with its key/value cache; attnviz's own layers read each new token as it came. ` +
          `At each step the new token is outlined and the tokens are coloured by one row (${logScale ? "log scale 0.001 to 1" : "linear scale 0 to 1"}): ` +
          `chosen, ${generation.rows_words.chosen} (its query underlined); read, ${generation.rows_words.read}. The tokens after it are not yet written.`),
    );  // prettier-ignore
    const slider = AV.el("input", { type: "range", id: "generation-step", min: 1, max: steps, value: steps, "aria-label": "generated token" });
    const previous = AV.el("button", { type: "button", class: "small", id: "generation-previous" }, "◀");
    const next = AV.el("button", { type: "button", class: "small", id: "generation-next" }, "▶");
    const layerOptions = Array.from({ length: layers }, (_, layer) => [layer, `layer ${layer}`]);
    const headOptions = [["mean", "mean of the heads"], ...Array.from({ length: heads }, (_, head) => [head, `head ${head}`])];
    const rowOptions = [["chosen", "the row that chose it"], ["read", "its own row"]];
    section.appendChild(
      AV.el("div", { class: "controls" },
        AV.el("label", { class: "control" }, "Step ", previous, slider, next),
        select("generation-layer", "Layer", layerOptions, shown.layer, (value) => { shown.layer = Number(value); draw(); }),
        select("generation-head", "Head", headOptions, shown.head, (value) => { shown.head = value === "mean" ? "mean" : Number(value); draw(); }),
        select("generation-rows", "Rows", rowOptions, shown.rows, (value) => { shown.rows = value; draw(); }),
      ),
    );  // prettier-ignore
    const readout = AV.el("p", { id: "generation-readout", class: "readout", "aria-live": "polite" });
    const tokens = AV.el("div", { id: "generation-tokens", class: "generation-tokens", style: "line-height:2;font-size:1.05rem" });
    section.appendChild(readout);
    section.appendChild(tokens);
    section.appendChild(AV.colourBar(logScale, { height: 120 }));

    // the query of generated token `step`'s row: the token before it (chosen) or itself (read)
    const queryOf = (step) => prompt + step - (shown.rows === "chosen" ? 1 : 0);

    // generated token `step`'s row in the layer, as shown.rows says: one head's, or the heads' mean; (query + 1) weights
    function row(step) {
      const width = queryOf(step) + 1;
      const index = queryOf(step) - prompt + 1; // in query_rows
      const at = (head, key) => rows.values[((shown.layer * heads + head) * queries + index) * total + key];
      return Array.from({ length: width }, (_, key) =>
        shown.head === "mean" ? Array.from({ length: heads }, (_, head) => at(head, key)).reduce((a, b) => a + b, 0) / heads : at(shown.head, key),
      );
    }

    function draw() {
      const step = shown.step;
      const weights = row(step);
      const query = queryOf(step);
      AV.clear(tokens);
      for (let position = 0; position <= prompt + step; position++) {
        const inRow = position <= query; // the chosen token itself is not in the row that chose it
        const [red, green, blue] = inRow ? AV.colour(weights[position], logScale) : [255, 255, 255];
        const dark = 0.299 * red + 0.587 * green + 0.114 * blue < 140;
        const weight = inRow ? ` · weight ${AV.formatWeight(weights[position], rows.exact)}` : " · chosen by this row";
        const token = AV.el("span", {
          class: position < prompt ? "generation-token prompt" : "generation-token generated",
          "data-index": position,
          title: `${AV.tokenLabel(generation.tokens, position)}${weight}`,
          style: `background:rgb(${red},${green},${blue});color:${dark ? "#fff" : "#000"};padding:1px 3px;margin:1px;border-radius:3px;` +
            (position === prompt + step ? "outline:3px solid #ff2d55;" : "") + (position >= prompt ? "font-weight:600;" : "") +
            (position === query && shown.rows === "chosen" ? "text-decoration:underline 2px;" : ""),
        }, generation.tokens[position]);  // prettier-ignore
        tokens.appendChild(token);
      }
      const entropy = -weights.reduce((sum, w) => sum + (w > 0 ? w * Math.log(w) : 0), 0);
      const distance = weights.reduce((sum, w, key) => sum + w * (query - key), 0); // tokens back, weighted
      const most = weights.indexOf(Math.max(...weights));
      const who = shown.head === "mean" ? "mean of the heads" : `head ${shown.head}`;
      const whose = shown.rows === "chosen" ? `chosen by the row of ${AV.tokenLabel(generation.tokens, query)}` : "its own row";
      readout.textContent =
        `step ${step + 1} of ${steps}: ${AV.tokenLabel(generation.tokens, prompt + step)} (id ${generation.ids[prompt + step]}) · ${whose} · layer ${shown.layer} · ${who} · ` +
        `sink ${AV.formatWeight(weights[0], rows.exact)} · previous token ${AV.formatWeight(query > 0 ? weights[query - 1] : 0, rows.exact)} · entropy ${entropy.toFixed(4)} nats · ` +
        `mean distance ${distance.toFixed(2)} tokens · most attended ${AV.tokenLabel(generation.tokens, most)} ${AV.formatWeight(weights[most], rows.exact)}`;
      slider.value = String(step + 1);
    }

    const go = (step) => {
      shown.step = Math.min(steps - 1, Math.max(0, step));
      draw();
    };
    slider.addEventListener("input", () => go(Number(slider.value) - 1));
    previous.addEventListener("click", () => go(shown.step - 1));
    next.addEventListener("click", () => go(shown.step + 1));
    draw();
  }

  AV.registerView({ id: "generation", title: "Generation", render, available: () => AV.data.texts.some((text) => Boolean(text.generation)) });
  const first = (view) => (view.id === "generation" ? 0 : 1);
  AV.views.sort((a, b) => first(a) - first(b)); // stable: the other views keep their order
  AV.state.view = "generation";
})();
