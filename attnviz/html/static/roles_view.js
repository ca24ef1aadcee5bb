// roles_view.js: only in a report of `attnviz roles` (html/page.py ROLES_SCRIPTS; the record's "roles": roles.json's
// object, analysis/roles.py, with each head's main role and its score). Every layer × head coloured by its first
// role above its threshold (the rarer roles first, as roles.png), deeper as its score nears 1; hover or arrow keys
// name the head's roles; a click (or Enter) opens the head: its map with its tokens, where the report holds every
// layer's maps, and every score it has; the legend spells each role's letter. Shown first.
(() => {
  "use strict";
  const AV = window.AV;
  const GRID_PX = 360; // the grid's width at most (heads), its cells square
  const MIN_CELL = 6;
  const MAX_CELL = 28;
  const MAP_PX = 260; // the head's map's side at most
  const NONE = "#eeeeee";

  // The role's colour mixed with white: a third of it at the threshold, all of it at 1 (render/role_figures.role_cells).
  function shade(roles, cell) {
    const [index, score] = cell;
    if (index < 0) return NONE;
    const threshold = roles.thresholds[roles.roles_order[index]].above;
    const depth = 1 / 3 + (2 / 3) * Math.min(1, Math.max(0, (score - threshold) / Math.max(1e-9, 1 - threshold)));
    const hex = roles.colours[index];
    const channel = (at) => Math.round(255 - depth * (255 - parseInt(hex.slice(at, at + 2), 16)));
    return `rgb(${channel(1)},${channel(3)},${channel(5)})`;
  }

  function namesOf(roles, layer, head) {
    const names = roles.roles[layer][head];
    return names.length ? names.join(", ") : "none";
  }

  function scoreRows(roles, layer, head) {
    const rows = [];
    for (const [name, values] of Object.entries(roles.scores)) rows.push([name, values[layer][head], roles.definitions[name].definition]);
    for (const [name, values] of Object.entries(roles.summaries)) rows.push([name, values[layer][head], "layers' summary (summaries.json)"]);
    return rows;
  }

  async function openHead(section, text, roles, layer, head) {
    const old = section.querySelector("#roles-head");
    if (old) old.remove();
    const box = AV.el("div", { id: "roles-head", "data-layer": layer, "data-head": head });
    box.appendChild(AV.el("h3", {}, `layer ${layer} · head ${head} · ${namesOf(roles, layer, head)}`));
    const table = AV.el("table", { class: "roles-scores" }, AV.el("tr", {}, AV.el("th", {}, "score"), AV.el("th", {}, "value"), AV.el("th", {}, "what")));
    for (const [name, value, what] of scoreRows(roles, layer, head)) {
      table.appendChild(AV.el("tr", { "data-score": name }, AV.el("td", {}, name), AV.el("td", {}, value.toFixed(4)), AV.el("td", { class: "note" }, what)));
    }
    const parts = [table];
    if (text.layers) {
      const layers = await AV.decode(text.layers);
      const size = layers.shape[2];
      const offset = (layer * layers.shape[1] + head) * size * layers.shape[3];
      const keys = layers.shape[3];
      const canvas = AV.el("canvas", { class: "roles-map", "data-layer": layer, "data-head": head });
      AV.drawMap(canvas, layers, offset, size, keys, { causal: text.causal, cellSize: Math.max(1, Math.floor(MAP_PX / size)), maxSide: MAP_PX });
      // token labels as the Heatmap view's, at the canvas's own cell size (a map past MAP_PX is drawn in blocks)
      const queryLabels = AV.el("div", { class: "query-labels", "aria-hidden": "true" });
      const keyLabels = AV.el("div", { class: "key-labels", "aria-hidden": "true" });
      const step = AV.tokenLabels(queryLabels, keyLabels, text, canvas.width / keys, size, keys);
      const caption = `its map: rows queries, columns keys${step > 1 ? `; one token label every ${step}` : ""}`;
      const map = AV.el("div", { class: "heatmap-map roles-map-box" }, AV.el("div", {}), keyLabels, queryLabels, canvas);
      parts.unshift(AV.el("figure", { style: "margin:0 1.5rem 0 0" }, AV.el("figcaption", { class: "note" }, caption), map));
    } else {
      parts.push(AV.el("p", { class: "note" }, "This text is long: the report holds no whole map of every layer (the Zoom view has the run's layer)."));
    }
    box.appendChild(AV.el("div", { style: "display:flex;flex-wrap:wrap;align-items:flex-start" }, ...parts));
    section.appendChild(box);
  }

  function legend(roles) {
    // only the roles a head could have here (their scores computed and telling), as roles.png's legend
    const shown = roles.roles_order.map((name, index) => [name, index]).filter(([name]) => roles.labelled.includes(name));
    const items = shown.map(([name, index]) => {
      const threshold = roles.thresholds[name];
      return AV.el("li", { style: `color:${roles.colours[index]}` }, `${roles.letters[index]} = ${name}: ${threshold.score} > ${threshold.above}`);
    });
    return AV.el("ul", { class: "roles-legend note" }, ...items, AV.el("li", {}, "grey: none"));
  }

  function render(section) {
    const text = AV.current();
    const roles = text.roles;
    section.appendChild(AV.el("h2", {}, "Roles view"));
    if (!roles) {
      section.appendChild(AV.el("p", { class: "note", id: "roles-missing" }, "This text's heads were not given roles (attnviz roles)."));
      return;
    }
    // a score not computed ("copying") is left out; a role this text cannot tell ("local role") is not labelled
    const skipped = Object.entries(roles.skipped).map(([name, why]) => ` ${name} ${name.endsWith(" role") ? "not labelled" : "left out"}: ${why}.`).join("");
    section.appendChild(AV.el("p", { class: "note", id: "roles-note" },
      `What each head of ${text.model} is, over these ${roles.ids.length} tokens: each head coloured by its first role above ` +
        `its threshold (the rarer first), deeper as its score nears 1. Click a head for its map and every score.${skipped}`));  // prettier-ignore
    const readout = AV.el("p", { id: "roles-readout", class: "readout", "aria-live": "polite" }, "Hover a cell, or Tab to the grid and move with the arrow keys, for its roles.");
    section.appendChild(readout);
    const cells = roles.main_role.map((row, layer) => row.map((index, head) => [index, roles.main_score[layer][head]]));
    const heads = cells[0].length;
    const svg = AV.layerHeadGrid(cells, {
      cell: Math.max(MIN_CELL, Math.min(MAX_CELL, Math.floor(GRID_PX / heads))),
      colourOf: (cell) => shade(roles, cell),
      readout: (layer, head) => { readout.textContent = `layer ${layer} · head ${head} · ${namesOf(roles, layer, head)}`; },
      choose: (layer, head) => openHead(section, text, roles, layer, head),
      attrs: { class: "roles-grid", "aria-label": `each head's role: ${cells.length} layers × ${heads} heads; arrow keys move, Enter opens a head` },
    });  // prettier-ignore
    section.appendChild(AV.el("div", { style: "display:flex;flex-wrap:wrap;align-items:flex-start" }, svg, legend(roles)));
  }

  AV.registerView({ id: "roles", title: "Roles view", render, available: () => AV.data.texts.some((text) => Boolean(text.roles)) });
  const rolesFirst = (view) => (view.id === "roles" ? 0 : 1);
  AV.views.sort((a, b) => rolesFirst(a) - rolesFirst(b)); // stable: the other views keep their order
  AV.state.view = "roles";
})();
