// explorer.js: only in `attnviz serve`'s page (html/page.py EXPLORER_SCRIPTS). Its embedded data is the server's setup
// (format "attnviz-explorer": the models loaded, max_tokens, the token); AV.explore draws a text box (and one for the
// keys and values of cross-attention), the model and the layer among those loaded, asks POST /api/heads for the
// report's record of that run ("as": "report") and shows it with the report's own views (main.js's AV.start). A change
// asks again a moment later, on the warm model, and redraws without a reload; a later request's answer wins.
(() => {
  "use strict";
  const AV = window.AV;
  const FIRST_TEXT = "The cat sat on the mat because it was warm.";
  const WAIT_MS = 250; // typing: ask once the keys pause

  AV.explore = async (setup) => {
    let asked = 0; // the latest request's number: an earlier answer that comes later is dropped
    let timer = null;
    const text = AV.el("textarea", { id: "explorer-text", rows: 3, cols: 80, "aria-label": "text", spellcheck: "false" });
    text.value = FIRST_TEXT;
    const kv = AV.el("textarea", { id: "explorer-kv", rows: 2, cols: 80, "aria-label": "keys and values from this text (cross-attention; empty: self-attention)", placeholder: "cross-attention: keys and values from this text (optional)", spellcheck: "false" });
    const model = AV.el("select", { id: "explorer-model" });
    for (const each of setup.models) model.appendChild(AV.el("option", { value: each.name }, `${each.name} (${each.family}, ${each.num_layers} layers × ${each.num_heads} heads)`));
    const layer = AV.el("select", { id: "explorer-layer" });
    const status = AV.el("p", { id: "explorer-status", class: "note", "aria-live": "polite" });

    const fillLayers = () => {
      const chosen = setup.models.find((each) => each.name === model.value);
      const before = Number(layer.value) || 0;
      AV.clear(layer);
      for (let index = 0; index < chosen.num_layers; index++) layer.appendChild(AV.el("option", { value: index }, `layer ${index}`));
      layer.value = String(Math.min(before, chosen.num_layers - 1));
    };

    const ask = async () => {
      const number = ++asked;
      const request = { text: text.value, model: model.value, layer: Number(layer.value), as: "report" };
      if (kv.value.trim()) request.kv = kv.value;
      status.textContent = "computing…";
      const started = performance.now();
      let answer;
      try {
        const response = await fetch("/api/heads", {
          method: "POST",
          headers: { "Content-Type": "application/json", Authorization: `Bearer ${setup.token}` },
          body: JSON.stringify(request),
        });
        answer = await response.json();
        if (!response.ok) throw new Error(answer.error || `the server answered ${response.status}`);
      } catch (error) {
        if (number === asked) status.textContent = `error: ${error.message}`;
        return;
      }
      if (number !== asked) return;
      if (answer.texts[0].zoom) AV.state.view = "zoom"; // a long text's record holds no whole map: its Zoom view
      await AV.start(answer);
      status.textContent = `${answer.texts[0].query_tokens.length} tokens, layer ${request.layer}: ${Math.round(performance.now() - started)} ms`;
      document.body.dataset.shown = String(number);
    };

    const askSoon = () => {
      clearTimeout(timer);
      timer = setTimeout(ask, WAIT_MS);
    };
    text.addEventListener("input", askSoon);
    kv.addEventListener("input", askSoon);
    model.addEventListener("change", () => {
      fillLayers();
      ask();
    });
    layer.addEventListener("change", ask);
    fillLayers();

    const controls = AV.el(
      "div",
      { id: "explorer", class: "controls" },
      AV.el("label", { class: "control" }, "Text ", text),
      AV.el("label", { class: "control" }, "Keys and values ", kv),
      AV.el("label", { class: "control" }, "Model ", model),
      AV.el("label", { class: "control" }, "Layer ", layer),
      AV.el("p", { class: "note" }, `At most ${setup.max_tokens.toLocaleString("en")} tokens a text.`),
      status,
    );
    document.getElementById("report-header").before(controls);
    await ask();
  };
})();
