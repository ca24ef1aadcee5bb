// trace_view.js: the shape trace (trace.json) of each layout, one step at a time: every tensor a box
// of its named axes and sizes (inputs → output), the step's code, einops pattern, stride, contiguity
// and memory; a step the tutorial lacks marked "+", a --mistake run's wrong step marked ✗ beside the
// right layout's step of the same role; then the checks, the head slices and the axes' legend.
(() => {
  "use strict";
  const AV = window.AV;
  const ADDED_MARK = "+"; // tracing/recorder.py
  const MISTAKE_MARK = "✗";
  const WRONG_COLOUR = "#d62728"; // the wrong step's edge, and the right layout's step's beside it
  const RIGHT_COLOUR = "#2ca02c";
  const LAYER_NAME = "MultiHeadAttention"; // tracing/checks.py: attnviz's own layer in the checks

  // render/trace_render.py's AXIS_WORDS: the legend's words for each axis name
  const AXIS_WORDS = {
    B: "batch", N: "tokens", Nq: "query tokens", Nk: "key tokens", H: "heads", H_kv: "key/value heads",
    G: "query heads per key/value head", d: "head size (D / H)", "d/2": "RoPE's pairs of features", D: "model size", 1: "broadcast axis",
  }; // prettier-ignore
  const AXIS_ORDER = ["B", "N", "Nq", "Nk", "H", "H_kv", "G", "d", "d/2", "D", "1"];

  // ---- words and numbers, as the terminal and trace.md write them ----

  const shapeText = (shape) => `(${shape.join(", ")}${shape.length === 1 ? "," : ""})`;
  const memoryWord = (step) => step.memory || "input";
  const yesNo = (flag) => (flag ? "yes" : "no");
  const checkName = (name) => (name === LAYER_NAME ? "attnviz's layer (attention/layer.py)" : name);

  // Python's f"{value:.1e}" ("2.1e-07"), and "0" for 0: render/trace_render.py's difference_text.
  function differenceText(value) {
    if (value === 0) return "0";
    return value.toExponential(1).replace(/e([+-])(\d)$/, "e$10$2");
  }

  // Python's f"{value:.3g}" for the sizes of scores (2.8, 41.6, 0.123).
  const threeDigits = (value) => String(Number(value.toPrecision(3)));

  // ---- the layouts: each of trace.layouts, then each mistake run's mistaken layout ----

  function layoutChoices(text) {
    const choices = [];
    if (text.trace) {
      text.trace.layouts.forEach((layout) => choices.push({ name: layout.layout, layout, run: text.trace, right: null }));
    }
    for (const run of text.mistakes || []) {
      const mistaken = run.layouts.find((layout) => layout.mistake);
      const right = run.layouts.find((layout) => !layout.mistake) || null;
      if (mistaken) choices.push({ name: `${mistaken.layout} with mistake ${mistaken.mistake}`, layout: mistaken, run, right });
    }
    return choices;
  }

  // "axes: B = 1 batch, N = 8 tokens, …": the axes this layout's steps use, with their sizes.
  function axisLegend(layout) {
    const sizes = new Map();
    let products = false;
    for (const step of layout.steps) {
      step.output_axes.forEach((name, axis) => {
        if (name in AXIS_WORDS) {
          if (!sizes.has(name)) sizes.set(name, step.output_shape[axis]);
        } else products = true;
      });
    }
    const words = { ...AXIS_WORDS };
    if (layout.layout === "single-head") words.d = "head size (D / H: all of D with one head)";
    if (sizes.has("D") && sizes.has("H") && (sizes.get("d") || 0) * sizes.get("H") !== sizes.get("D")) words.d = "head size (the model's, not D / H)";
    const names = Array.from(sizes.keys()).sort((a, b) => AXIS_ORDER.indexOf(a) - AXIS_ORDER.indexOf(b));
    const parts = names.map((name) => (name === "1" ? `1 ${words[name]}` : `${name} = ${sizes.get(name)} ${words[name]}`));
    let legend = `axes: ${parts.join(", ")}${products ? "; B*H, 3D ...: axes multiplied into one" : ""}. Memory: view shares its input's, new is a copy.`;
    if (layout.steps.some((step) => !step.in_tutorial)) legend += ` ${ADDED_MARK}: a step the tutorial does not have.`;
    return legend;
  }

  // ---- a tensor as a box: its role above, one cell per axis (name over size), the shape below ----

  const AXIS_CELL_MIN_PX = 34;
  const CHAR_PX = 8; // about one character of the 12-13 px labels
  const BOX_PAD = 6;

  function tensorBox(role, shape, axes, kind) {
    const widths = axes.map((name, axis) => Math.max(AXIS_CELL_MIN_PX, CHAR_PX * Math.max(String(name).length, String(shape[axis]).length) + 10));
    const cellsWidth = widths.reduce((sum, width) => sum + width, 0);
    const label = role || "";
    const width = Math.max(cellsWidth + 2 * BOX_PAD, CHAR_PX * Math.max(label.length, shapeText(shape).length) + 2 * BOX_PAD, 60);
    const height = 92;
    const box = AV.svg("svg", {
      class: `trace-tensor trace-${kind}`,
      width,
      height,
      viewBox: `0 0 ${width} ${height}`,
      role: "img",
      "aria-label": `${kind} ${label}: shape ${shapeText(shape)}, axes ${axes.join(" ")}`,
      "data-role": label,
      "data-kind": kind,
      "data-shape": shape.join(","),
      "data-axes": axes.join(","),
    });
    box.style.color = "inherit";
    box.style.overflow = "visible";
    const frame = { x: 0.5, y: 18.5, width: width - 1, height: 54, rx: 5, fill: "currentColor", "fill-opacity": 0.04, stroke: "currentColor", "stroke-width": kind === "output" ? 2 : 1 };
    box.appendChild(AV.svg("text", { x: width / 2, y: 13, "text-anchor": "middle", fill: "currentColor", "font-size": 13, "font-weight": kind === "output" ? 700 : 400 }, label));
    box.appendChild(AV.svg("rect", frame));
    let x = (width - cellsWidth) / 2;
    axes.forEach((name, axis) => {
      const cell = AV.svg("g", { class: "trace-axis", "data-axis": name, "data-size": shape[axis] });
      cell.appendChild(AV.svg("rect", { x: x + 2, y: 24, width: widths[axis] - 4, height: 42, rx: 3, fill: "#4e79a7", "fill-opacity": 0.18, stroke: "#4e79a7", "stroke-opacity": 0.6 }));
      cell.appendChild(AV.svg("text", { x: x + widths[axis] / 2, y: 41, "text-anchor": "middle", fill: "currentColor", "font-size": 13, "font-weight": 700 }, String(name)));
      cell.appendChild(AV.svg("text", { x: x + widths[axis] / 2, y: 59, "text-anchor": "middle", fill: "currentColor", "font-size": 13 }, String(shape[axis])));
      box.appendChild(cell);
      x += widths[axis];
    });
    box.appendChild(AV.svg("text", { x: width / 2, y: 88, "text-anchor": "middle", fill: "currentColor", "font-size": 12, "fill-opacity": 0.75 }, shapeText(shape)));
    return box;
  }

  // inputs → output, in a row that wraps
  function flow(step) {
    const row = AV.el("div", { class: "trace-flow" });
    Object.assign(row.style, { display: "flex", flexWrap: "wrap", alignItems: "center", gap: "0.5rem 0.75rem", margin: "0.5rem 0" });
    if (step.input_shapes.length) {
      const inputs = AV.el("div", { class: "trace-inputs" });
      Object.assign(inputs.style, { display: "flex", flexWrap: "wrap", gap: "0.5rem" });
      step.input_shapes.forEach((shape, i) => inputs.appendChild(tensorBox(step.inputs[i] || `input ${i}`, shape, step.input_axes[i] || [], "input")));
      row.appendChild(inputs);
      row.appendChild(AV.el("span", { class: "trace-arrow", "aria-hidden": "true", style: "font-size:1.6rem" }, "→"));
    } else {
      row.appendChild(AV.el("span", { class: "trace-given note" }, "given to the layer:"));
    }
    row.appendChild(tensorBox(step.role, step.output_shape, step.output_axes, "output"));
    return row;
  }

  function codeOrDash(text) {
    return text ? AV.el("code", {}, text) : "—";
  }

  // The step's facts as a definition list: code, pattern, stride, contiguous, memory, dtype, tutorial, note.
  function stepFacts(step) {
    const list = AV.el("dl", { class: "trace-facts" });
    Object.assign(list.style, { display: "grid", gridTemplateColumns: "max-content 1fr", gap: "0.15rem 0.8rem", margin: "0.4rem 0" });
    const tutorial = step.in_tutorial ? "yes" : `no (${ADDED_MARK}): ${step.note || "a step the tutorial does not have"}`;
    const rows = [
      ["operation", codeOrDash(step.operation), "operation"],
      ["pattern", codeOrDash(step.pattern), "pattern"],
      ["stride", shapeText(step.stride), "stride"],
      ["contiguous", yesNo(step.contiguous), "contiguous"],
      ["memory", memoryWord(step), "memory"],
      ["dtype", step.dtype, "dtype"],
      ["in tutorial", tutorial, "in-tutorial"],
    ];
    if (step.note && step.in_tutorial) rows.push(["note", step.note, "note"]);
    for (const [term, value, key] of rows) {
      list.appendChild(AV.el("dt", {}, term));
      const dd = AV.el("dd", { "data-fact": key }, value);
      dd.style.margin = "0";
      list.appendChild(dd);
    }
    return list;
  }

  function marks(step) {
    return (step.mistake ? `${MISTAKE_MARK} ` : "") + (step.in_tutorial ? "" : `${ADDED_MARK} `);
  }

  // Steps are numbered from 0, as in trace.json, trace.md and the terminal.
  function stepCard(step, heading) {
    const card = AV.el("div", { class: `trace-step${step.mistake ? " mistake" : ""}${step.in_tutorial ? "" : " added"}`, "data-index": step.index, "data-role": step.role });
    card.appendChild(AV.el("h3", {}, heading || `Step ${step.index}: ${marks(step)}${step.role}`));
    card.appendChild(flow(step));
    card.appendChild(stepFacts(step));
    return card;
  }

  // The right layout's step for a wrong one: the same role (the mistaken run skips the right one's
  // view steps, so the same index would be another tensor).
  function rightStepFor(choice, step) {
    if (!choice.right) return null;
    return choice.right.steps.find((candidate) => candidate.role === step.role) || choice.right.steps[step.index] || null;
  }

  function drawCurrent(current) {
    const { choice, step: at } = current;
    const steps = choice.layout.steps;
    const step = steps[at];
    const box = AV.clear(current.box);
    box.classList.toggle("mistake", Boolean(step.mistake));
    const card = stepCard(step);
    if (step.mistake) {
      Object.assign(card.style, { borderLeft: `4px solid ${WRONG_COLOUR}`, paddingLeft: "0.6rem" });
      card.insertBefore(AV.el("p", { class: "error trace-mistake-mark" }, `${MISTAKE_MARK} the wrong step of --mistake ${choice.layout.mistake}: the wrong computation, made on purpose`), card.children[1]);
    }
    box.appendChild(card);
    const right = step.mistake ? rightStepFor(choice, step) : null;
    if (right) {
      const against = stepCard(right, `Right (${choice.right.layout}), its step ${right.index}: ${marks(right)}${right.role}`);
      against.classList.add("trace-right-step");
      Object.assign(against.style, { borderLeft: `4px solid ${RIGHT_COLOUR}`, paddingLeft: "0.6rem", marginTop: "1rem" });
      box.appendChild(against);
      const same = right.output_shape.join(",") === step.output_shape.join(",");
      box.appendChild(
        AV.el("p", { class: "note trace-compare" },
          `Shapes: wrong ${shapeText(step.output_shape)} ${step.output_axes.join(" ")}, right ${shapeText(right.output_shape)} ${right.output_axes.join(" ")}` +
          (same ? ": the same shape, other numbers in it (a shape check cannot catch this mistake)." : ".")),
      ); // prettier-ignore
    }
    current.counter.textContent = `step ${at} of 0–${steps.length - 1}`;
    current.prev.disabled = at === 0;
    current.next.disabled = at === steps.length - 1;
    for (const item of current.list.children) {
      const here = Number(item.dataset.index) === at;
      if (here) item.setAttribute("aria-current", "step");
      else item.removeAttribute("aria-current");
      item.style.fontWeight = here ? "700" : "";
    }
  }

  function go(current, index) {
    const last = current.choice.layout.steps.length - 1;
    current.step = Math.min(last, Math.max(0, index));
    drawCurrent(current);
  }

  function stepList(current) {
    const list = AV.el("ol", { id: "trace-steps", start: 0, class: "trace-steps" });
    for (const step of current.choice.layout.steps) {
      const button = AV.el("button", { type: "button", class: "small" }, `${marks(step)}${step.role} ${shapeText(step.output_shape)} ${step.output_axes.join(" ")}`);
      button.addEventListener("click", () => go(current, step.index));
      const item = AV.el("li", { "data-index": step.index, "data-role": step.role, "data-output-shape": step.output_shape.join(","), class: step.mistake ? "mistake" : null, value: step.index }, button);
      if (step.mistake) item.appendChild(AV.el("span", { class: "error" }, ` ${MISTAKE_MARK} wrong`));
      list.appendChild(item);
    }
    return list;
  }

  // ---- the tables: checks against the reference, head slices, the mistake's distance ----

  function table(id, caption, header, rows) {
    const element = AV.el("table", { id, class: "trace-table" });
    element.style.margin = "0.8rem 0";
    const title = AV.el("caption", {}, caption);
    title.style.textAlign = "left";
    element.appendChild(title);
    const padded = (cell) => Object.assign(cell.style, { padding: "0.1rem 0.6rem", textAlign: "left" }) && cell;
    element.appendChild(AV.el("thead", {}, AV.el("tr", {}, header.map((name) => padded(AV.el("th", { scope: "col" }, name))))));
    const body = AV.el("tbody");
    for (const row of rows) body.appendChild(AV.el("tr", {}, row.map((cell) => padded(AV.el("td", {}, cell)))));
    element.appendChild(body);
    return element;
  }

  function checksTable(run) {
    const caption =
      `Checks: the largest absolute difference of the attention weights and of the output from the reference ` +
      `(torch's own code, not attnviz's); they agree when both are at most ${differenceText(run.tolerance).replace(".0e", "e")}`;
    const rows = run.checks.map((check) => [checkName(check.layout), check.reference, differenceText(check.weights_max_abs_diff), differenceText(check.output_max_abs_diff), yesNo(check.agree)]);
    return table("trace-checks", caption, ["layout", "compared with", "weights", "output", "agree"], rows);
  }

  function headSlicesTable(run) {
    const slices = run.head_slices;
    const grouped = slices.some((head) => head.kv_head !== head.head);
    const d = slices.length ? slices[0].columns[1] - slices[0].columns[0] + 1 : 0;
    const caption =
      slices.length === 1
        ? `The one head's slice: it uses all ${d} columns of W_q, W_k, W_v; its scores and z recomputed from that slice alone, against the layer's`
        : `Head slices: head h of the ${slices.length} uses columns h*${d} .. (h+1)*${d}-1 of W_q${grouped ? " (and its key/value head's of W_k, W_v)" : ", W_k, W_v"}; its scores and z recomputed from those slices alone, against the layer's`;
    const header = ["head", grouped ? "W_q columns" : "columns", ...(grouped ? ["kv head", "W_k, W_v columns"] : []), "max abs diff, scores", "max abs scores", "max abs diff, z", "agree"];
    const rows = slices.map((head) => [
      String(head.head),
      `${head.columns[0]}–${head.columns[1]}`,
      ...(grouped ? [String(head.kv_head), `${head.kv_columns[0]}–${head.kv_columns[1]}`] : []),
      differenceText(head.scores_max_abs_diff),
      threeDigits(head.scores_max_abs),
      differenceText(head.z_max_abs_diff),
      yesNo(head.agree),
    ]);
    return table("trace-head-slices", caption, header, rows);
  }

  function mistakeSummary(run) {
    const mistake = run.mistake;
    return AV.el(
      "p",
      { class: "trace-mistake-summary error" },
      `Mistake ${mistake.mistake}: wrong steps ${mistake.wrong_steps.join(", ")}. Largest difference from the right run: ` +
        `weights ${differenceText(mistake.weights_max_abs_diff)}, output ${differenceText(mistake.output_max_abs_diff)}.`,
    );
  }

  // ---- the view ----

  function drawLayout(current) {
    const { choice } = current;
    const layout = choice.layout;
    const about = AV.clear(current.about);
    about.appendChild(AV.el("p", { class: "trace-description" }, `${layout.num_heads} head${layout.num_heads > 1 ? "s" : ""} × d = ${layout.head_dim}: ${layout.description}`));
    if (layout.mistake) about.appendChild(mistakeSummary(choice.run));
    if (layout.notes.length) {
      const notes = AV.el("ul", { class: "trace-notes" });
      for (const note of layout.notes) notes.appendChild(AV.el("li", { class: "note" }, note));
      about.appendChild(notes);
    }
    current.legend.textContent = axisLegend(layout);
    const list = stepList(current);
    current.list.replaceWith(list);
    current.list = list;
    const tables = AV.clear(current.tables);
    tables.appendChild(checksTable(choice.run));
    if (choice.run.head_slices.length) tables.appendChild(headSlicesTable(choice.run));
    for (const note of choice.run.notes || []) tables.appendChild(AV.el("p", { class: "note" }, `note: ${note}`));
    go(current, current.step);
  }

  function noTrace(section, text) {
    section.appendChild(AV.el("p", { class: "note", id: "trace-missing" }, `This report holds no shape trace for the text “${text.text}”.`));
  }

  function render(section) {
    const text = AV.current();
    section.appendChild(AV.el("h2", {}, "Trace view"));
    const choices = layoutChoices(text);
    if (!choices.length) return noTrace(section, text);
    section.appendChild(
      AV.el("p", { class: "note" },
        `The shape trace of layer ${text.layer} (trace.json): each step read from the real tensors as the forward pass ran. ` +
        "Each tensor is a box of its named axes and sizes. ArrowLeft and ArrowRight move between the steps."),
    ); // prettier-ignore
    const select = AV.el("select", { id: "trace-layout" });
    choices.forEach((choice, i) => select.appendChild(AV.el("option", { value: i }, choice.name)));
    const prev = AV.el("button", { type: "button", id: "trace-prev", class: "small", "aria-label": "previous step" }, "← previous");
    const next = AV.el("button", { type: "button", id: "trace-next", class: "small", "aria-label": "next step" }, "next →");
    const counter = AV.el("span", { id: "trace-counter", "aria-live": "polite" });
    section.appendChild(AV.el("div", { class: "controls" }, AV.el("label", { class: "control" }, "Layout ", select), prev, counter, next));
    const about = AV.el("div", { class: "trace-about" });
    const box = AV.el("div", { id: "trace-current", tabindex: 0, "aria-live": "polite" });
    const list = AV.el("ol", { id: "trace-steps" });
    const columns = AV.el("div", { class: "trace-columns" }, AV.el("nav", { class: "trace-step-list", "aria-label": "steps" }, list), box);
    Object.assign(columns.style, { display: "grid", gridTemplateColumns: "minmax(14rem, max-content) 1fr", gap: "1rem", alignItems: "start" });
    const legend = AV.el("p", { class: "note trace-legend", id: "trace-legend" });
    const tables = AV.el("div", { class: "trace-tables" });
    section.appendChild(about);
    section.appendChild(columns);
    section.appendChild(legend);
    section.appendChild(tables);
    const current = { section, choice: choices[0], step: 0, about, box, list, legend, tables, counter, prev, next };
    select.addEventListener("change", () => {
      current.choice = choices[Number(select.value)];
      const wrong = current.choice.layout.steps.find((step) => step.mistake);
      current.step = wrong ? wrong.index : 0; // a mistake opens on its (first) wrong step
      drawLayout(current);
    });
    prev.addEventListener("click", () => go(current, current.step - 1));
    next.addEventListener("click", () => go(current, current.step + 1));
    section.addEventListener("keydown", (event) => {
      if (event.target instanceof HTMLSelectElement || event.target instanceof HTMLInputElement) return;
      const move = { ArrowLeft: -1, ArrowRight: 1 }[event.key];
      if (!move) return;
      event.preventDefault();
      go(current, current.step + move);
    });
    drawLayout(current);
  }

  AV.registerView({ id: "trace", title: "Trace view", render });
})();
