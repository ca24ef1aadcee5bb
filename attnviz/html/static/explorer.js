// explorer.js: only in `attnviz serve`'s page (html/page.py EXPLORER_SCRIPTS). Its embedded data is the server's setup
// (format "attnviz-explorer": the models loaded, max_tokens, the token); AV.explore draws a text box (and one for the
// keys and values of cross-attention), the model and the layer among those loaded, asks POST /api/heads for the
// report's record of that run ("as": "report") and shows it with the report's own views (main.js's AV.start). A change
// asks again a moment later, on the warm model, and redraws without a reload. "Roles" asks POST /api/roles for the
// text's roles, "Patch" POST /api/patch for the heads that carry an answer (the clean text's run patched into the
// corrupted text's); their records open on the Roles and Patching views. Each answer carries the font of its CJK
// glyphs (html/page.py explorer_font), loaded before it is drawn. The latest request wins: an answer is drawn only
// while no later request was made, and one drawing at a time, so none is overwritten by an earlier one.
(() => {
  "use strict";
  const AV = window.AV;
  const FIRST_TEXT = "The cat sat on the mat because it was warm.";
  const WAIT_MS = 250; // typing: ask once the keys pause
  // A heads answer holds the run's layer alone, no trace and no statistics (the report's assembly of them takes 4 times
  // the run on SmolLM2: too slow at each pause of the keys), so their views leave the tabs; a roles or patch answer
  // holds both, and shows them.
  const HOLDS = {
    trace: (text) => Boolean(text.trace || (text.mistakes && text.mistakes.length)),
    stats: (text) => Boolean(text.statistics || text.rollout),
  };
  for (const view of AV.views) if (HOLDS[view.id]) view.available = () => AV.data.texts.some(HOLDS[view.id]);

  // An answer's font, loaded (not yet the page's): null when its record holds no CJK character.
  async function loadedFont(font) {
    if (!font) return null;
    const face = new FontFace(font.family, `url("${font.url}")`);
    try {
      await face.load();
    } catch (error) {
      console.warn(`attnviz: the answer's CJK font did not load (${error.message}); system fonts draw the text`);
      return null;
    }
    return face;
  }

  AV.explore = async (setup) => {
    let asked = 0; // the latest request's number: an answer to an earlier one is never drawn
    let drawing = Promise.resolve(); // the answer being drawn: the next one waits for it
    let face = null; // the font of the answer shown
    let timer = null;
    const text = AV.el("textarea", { id: "explorer-text", rows: 2, cols: 80, "aria-label": "text", spellcheck: "false" });
    text.value = FIRST_TEXT;
    const kv = AV.el("textarea", { id: "explorer-kv", rows: 1, cols: 80, "aria-label": "keys and values from this text (cross-attention; empty: self-attention)", placeholder: "cross-attention: keys and values from this text (optional)", spellcheck: "false" });
    const model = AV.el("select", { id: "explorer-model" });
    for (const each of setup.models) model.appendChild(AV.el("option", { value: each.name }, `${each.name} (${each.family}, ${each.num_layers} layers × ${each.num_heads} heads)`));
    const layer = AV.el("select", { id: "explorer-layer" });
    const roles = AV.el("button", { type: "button", id: "explorer-roles", title: "every layer × head's roles over the text (attnviz roles)" }, "Roles of this text");
    const corrupt = AV.el("input", { id: "explorer-corrupt", type: "text", size: 36, "aria-label": "corrupted text (as many tokens as the text)", placeholder: "the text with its cue changed, as many tokens", spellcheck: "false" });
    const answer = AV.el("input", { id: "explorer-answer", type: "text", size: 8, "aria-label": "answer token", placeholder: "“ Mary”", spellcheck: "false" });
    const wrong = AV.el("input", { id: "explorer-wrong", type: "text", size: 8, "aria-label": "wrong token", placeholder: "“ John”", spellcheck: "false" });
    const patch = AV.el("button", { type: "button", id: "explorer-patch", title: "each head of the clean text's run patched into the corrupted text's (attnviz patch)" }, "Patch");
    const status = AV.el("p", { id: "explorer-status", class: "note", "aria-live": "polite" });

    const fillLayers = () => {
      const chosen = setup.models.find((each) => each.name === model.value);
      const before = Number(layer.value) || 0;
      AV.clear(layer);
      for (let index = 0; index < chosen.num_layers; index++) layer.appendChild(AV.el("option", { value: index }, `layer ${index}`));
      layer.value = String(Math.min(before, chosen.num_layers - 1));
    };

    // Asks path for body's record and draws it, opening on view (else as the page is); said(record, ms): the status line.
    const ask = async (path, body, view, said) => {
      const number = ++asked;
      status.textContent = "computing…";
      const started = performance.now();
      let record;
      try {
        const response = await fetch(path, {
          method: "POST",
          headers: { "Content-Type": "application/json", Authorization: `Bearer ${setup.token}` },
          body: JSON.stringify(body),
        });
        record = await response.json();
        if (!response.ok) throw new Error(record.error || `the server answered ${response.status}`);
      } catch (error) {
        if (number === asked) status.textContent = `error: ${error.message}`;
        return;
      }
      const draw = async () => {
        if (number !== asked) return; // a later request was made: its answer is the one to draw
        const font = await loadedFont(record.font);
        if (number !== asked) return;
        if (face) document.fonts.delete(face);
        face = font;
        if (face) document.fonts.add(face);
        if (view) AV.state.view = view;
        else if (record.texts[0].zoom) AV.state.view = "zoom"; // a long text's record holds no whole map: its Zoom view
        await AV.start(record);
        const shownLayer = String(record.texts[0].layer); // a roles or patch answer's layer: the picker says which is shown
        if (Array.from(layer.options).some((option) => option.value === shownLayer)) layer.value = shownLayer;
        // Chromium keeps the empty boxes of text it laid out before the face came (the text boxes'), until their font
        // changes once the face is in use: a size a hair off, and back
        if (face) {
          for (const box of [controls, experiments]) {
            box.style.fontSize = "15.01px";
            void box.offsetWidth;
            box.style.fontSize = "";
          }
        }
        if (number !== asked) return; // asked again while drawing: that answer draws next
        status.textContent = said(record, Math.round(performance.now() - started));
        document.body.dataset.shown = String(number);
      };
      drawing = drawing.then(draw, draw);
      await drawing;
    };

    const askHeads = () => {
      const body = { text: text.value, model: model.value, layer: Number(layer.value), as: "report" };
      if (kv.value.trim()) body.kv = kv.value;
      return ask("/api/heads", body, null, (record, ms) => `${record.texts[0].query_tokens.length} tokens, layer ${body.layer}: ${ms} ms`);
    };
    const askRoles = () =>
      ask("/api/roles", { text: text.value, model: model.value }, "roles", (record, ms) => `the roles of ${record.texts[0].query_tokens.length} tokens, every layer × head: ${ms} ms`);
    const askPatch = () =>
      ask("/api/patch", { text: text.value, model: model.value, corrupt: corrupt.value, answer: answer.value, wrong: wrong.value }, "patch",
        (record, ms) => `${record.texts[0].query_tokens.length} tokens patched, every layer × head: ${ms} ms`);  // prettier-ignore

    const askSoon = () => {
      clearTimeout(timer);
      timer = setTimeout(askHeads, WAIT_MS);
    };
    text.addEventListener("input", askSoon);
    kv.addEventListener("input", askSoon);
    model.addEventListener("change", () => {
      fillLayers();
      askHeads();
    });
    layer.addEventListener("change", askHeads);
    roles.addEventListener("click", () => {
      clearTimeout(timer);
      askRoles();
    });
    patch.addEventListener("click", () => {
      clearTimeout(timer);
      askPatch();
    });
    fillLayers();

    // A cell clicked in the heatmap view: POST /api/why splits its score into query part × key part terms, the largest
    // shown under the map by why_terms.js's table (the latest click wins).
    let whyAsked = 0;
    AV.cellChosen = async (section, shownText, layerShown, head, query, key) => {
      const number = ++whyAsked;
      AV.whyNote(section, "splitting the score…");
      let answer;
      try {
        const response = await fetch("/api/why", {
          method: "POST",
          headers: { "Content-Type": "application/json", Authorization: `Bearer ${setup.token}` },
          body: JSON.stringify({ text: shownText.text, model: model.value, layer: layerShown, head, query, key }),
        });
        answer = await response.json();
        if (!response.ok) throw new Error(answer.error || `the server answered ${response.status}`);
      } catch (error) {
        if (number === whyAsked) AV.whyPanel(section).appendChild(AV.el("p", { class: "note", id: "why-error" }, `why: ${error.message}`));
        return;
      }
      if (number !== whyAsked) return;
      AV.whyPanel(section).appendChild(AV.whyTable(answer, shownText.shown_query_tokens));
    };

    const controls = AV.el(
      "div",
      { id: "explorer", class: "controls" },
      AV.el("label", { class: "control" }, "Text ", text),
      AV.el("label", { class: "control" }, "Keys and values ", kv),
      AV.el("label", { class: "control" }, "Model ", model),
      AV.el("label", { class: "control" }, "Layer ", layer),
      roles,
      AV.el("p", { class: "note" }, `At most ${setup.max_tokens.toLocaleString("en")} tokens a text. Roles and Patch run every layer × head of it (seconds to minutes); a token's leading space counts (“ Mary”).`),
    );
    const experiments = AV.el(
      "div",
      { id: "explorer-experiments", class: "controls" },
      AV.el("label", { class: "control" }, "Corrupted text ", corrupt),
      AV.el("label", { class: "control" }, "Answer ", answer),
      AV.el("label", { class: "control" }, "Wrong token ", wrong),
      patch,
    );
    document.getElementById("report-header").before(controls, experiments, status);
    await askHeads();
  };
})();
