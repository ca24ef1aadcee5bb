// main.js: starts the page: loads its fonts, reads the record, draws the header, the text picker and the views' tabs,
// shows the head view, then marks the body ready (body[data-ready], AV.readyMs).
(() => {
  "use strict";
  const AV = window.AV;
  const rendered = new Map(); // view id -> the text index it was drawn for

  function readRecord() {
    return JSON.parse(document.getElementById("attnviz-data").textContent);
  }

  // header.js draws the header as AV.renderHeader; without it, a minimal one.
  function renderHeader() {
    const header = AV.clear(document.getElementById("report-header"));
    if (typeof AV.renderHeader === "function") {
      AV.renderHeader(header);
      return;
    }
    const text = AV.current();
    header.appendChild(AV.el("h1", { class: "report-title" }, text.title.join(" · ")));
    header.appendChild(AV.el("p", { class: "report-text", lang: "und" }, text.text));
    for (const note of AV.data.notes) header.appendChild(AV.el("p", { class: "note" }, note));
    header.appendChild(AV.el("p", { class: "note" }, AV.data.weights_rounding));
  }

  function buildTextPicker() {
    const texts = AV.data.texts;
    const earlier = document.querySelector(".text-picker");
    if (earlier) earlier.remove();
    if (texts.length < 2) return;
    const select = AV.el("select", { id: "text-select" });
    texts.forEach((text, index) => {
      const label = text.text.length > 80 ? text.text.slice(0, 79) + "…" : text.text;
      select.appendChild(AV.el("option", { value: index }, `${index + 1}: ${label}`));
    });
    select.value = String(AV.state.text);
    select.addEventListener("change", () => AV.set({ text: Number(select.value) }));
    const picker = AV.el("div", { class: "text-picker" }, AV.el("label", { for: "text-select" }, `Text (${texts.length})`), select);
    document.getElementById("report-header").after(picker);
  }

  function tabs() {
    return Array.from(document.querySelectorAll("#views button[role=tab]"));
  }

  function buildNav() {
    const nav = AV.clear(document.getElementById("views"));
    const main = AV.clear(document.getElementById("report-views"));
    for (const view of AV.views.filter((candidate) => !candidate.available || candidate.available())) {
      const button = AV.el(
        "button",
        { type: "button", role: "tab", id: `tab-${view.id}`, "data-view": view.id, "aria-controls": `view-${view.id}`, "aria-selected": "false" },
        view.title,
      );
      button.addEventListener("click", () => AV.set({ view: view.id }));
      nav.appendChild(button);
      main.appendChild(AV.el("section", { id: `view-${view.id}`, class: "view", role: "tabpanel", "aria-labelledby": `tab-${view.id}`, hidden: true }));
    }
    // ArrowLeft/ArrowRight move between the tabs (Home/End to the ends); Enter or Space opens one.
    nav.addEventListener("keydown", (event) => {
      const all = tabs();
      const at = all.indexOf(document.activeElement);
      if (at < 0) return;
      const next = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: all.length - 1 }[event.key];
      if (next === undefined) return;
      event.preventDefault();
      all[(next + all.length) % all.length].focus();
    });
  }

  async function show(id) {
    const view = AV.views.find((candidate) => candidate.id === id);
    if (!view) return;
    for (const button of tabs()) button.setAttribute("aria-selected", String(button.dataset.view === id));
    for (const section of document.querySelectorAll("#report-views > section.view")) section.hidden = section.id !== `view-${id}`;
    const section = document.getElementById(`view-${id}`);
    if (rendered.get(id) === AV.state.text) return;
    rendered.set(id, AV.state.text);
    AV.clear(section);
    try {
      await view.render(section);
    } catch (error) {
      section.appendChild(AV.el("p", { class: "error" }, `This view could not be drawn: ${error.message}`));
      console.error(error);
    }
  }

  AV.onChange((state, patch) => {
    if ("text" in patch) {
      if (!AV.layersOf(state.text).includes(state.layer)) state.layer = AV.current().layer;
      renderHeader();
      rendered.clear();
      show(state.view);
    } else if ("view" in patch) {
      show(state.view);
    }
  });

  // The page's own fonts (html/font.py: the CJK glyphs it carries), loaded before any text is laid
  // out: Chromium keeps the fallback's empty boxes for text it laid out while the font was loading.
  async function loadFonts() {
    try {
      await Promise.all(Array.from(document.fonts, (face) => face.load()));
    } catch (error) {
      console.warn(`attnviz: the page's CJK font did not load (${error.message}); system fonts draw the text`);
    }
  }

  // Shows a report's record: the header, the text picker, the views' tabs and the view chosen. The report calls it once
  // with its embedded record; `attnviz serve`'s page (explorer.js) calls it with each record the server sends.
  AV.start = async (record) => {
    AV.data = record;
    AV.forgetWeights();
    AV.state.text = 0;
    AV.state.layer = record.texts[0].layer;
    if (AV.state.head >= record.num_heads) AV.state.head = 0;
    rendered.clear();
    renderHeader();
    buildTextPicker();
    buildNav();
    if (!AV.views.some((view) => view.id === AV.state.view && (!view.available || view.available()))) AV.state.view = tabs()[0].dataset.view;
    await show(AV.state.view);
  };

  // The embedded data is a report's record, or `attnviz serve`'s setup, which explorer.js (AV.explore) starts from.
  async function boot() {
    await loadFonts();
    const data = readRecord();
    await (data.format === "attnviz-explorer" ? AV.explore(data) : AV.start(data));
    AV.readyMs = performance.now();
    document.body.dataset.ready = "true";
  }

  boot().catch((error) => console.error(error));
})();
