// long_text.js: only in a report of a long text (html/page.py LONG_SCRIPTS). Past 512 tokens a text's record holds no
// whole map ("attention" and "layers" null, no rollout, statistics or trace: html/record.py), so the Zoom view opens
// first with the Summaries view beside it, and each view that draws whole maps leaves the tabs when no text has what
// it draws (the header's note says why); in a report that also has short texts, it says so in one line for a long one.
(() => {
  "use strict";
  const AV = window.AV;
  const FIRST = ["zoom", "summaries"];
  // view id -> whether a text's record holds what the view draws
  const NEEDS = {
    head: (text) => Boolean(text.attention),
    heatmap: (text) => Boolean(text.attention),
    model: (text) => Boolean(text.layers),
    stats: (text) => Boolean(text.statistics || text.rollout),
    trace: (text) => Boolean(text.trace || (text.mistakes && text.mistakes.length)),
  };
  const REASON = "This text is long: the report holds no whole map of it, which this view draws; the Zoom view shows its map and the Summaries view every head of every layer.";

  for (const view of AV.views) {
    const has = NEEDS[view.id];
    if (!has) continue;
    const render = view.render;
    view.available = () => AV.data.texts.some((text) => !text.zoom || has(text)); // a short text's view is as it was
    view.render = (section) => {
      const text = AV.current();
      if (!text.zoom || has(text)) return render(section);
      section.appendChild(AV.el("h2", {}, view.title));
      section.appendChild(AV.el("p", { class: "note", id: `${view.id}-long` }, REASON));
      return undefined;
    };
  }
  const rank = (view) => (FIRST.includes(view.id) ? FIRST.indexOf(view.id) : FIRST.length);
  AV.views.sort((a, b) => rank(a) - rank(b)); // stable: the other views keep their order
  AV.state.view = FIRST[0];
})();
