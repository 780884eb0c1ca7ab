// The --nobreak-html page's script. Reads only data- attributes and the URL fragment; writes
// only text, attributes and the order of the table's row groups. No run data is ever turned
// into markup here.
(function () {
  "use strict";
  var start = performance.now();
  var root = document.documentElement;
  window.addEventListener("error", function () {
    root.dataset.jsErrors = String(Number(root.dataset.jsErrors || 0) + 1);
  });
  var table = document.getElementById("tests");
  var groups = Array.prototype.slice.call(table.tBodies);
  var q = document.getElementById("q");
  var outcome = document.getElementById("outcome");
  var owner = document.getElementById("owner");
  var boxes = Array.prototype.slice.call(document.querySelectorAll("input[name=has]"));
  var shown = document.getElementById("shown");
  var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
  var sort = { key: "nodeid", desc: false };

  function checked() {
    return boxes.filter(function (b) { return b.checked; }).map(function (b) { return b.value; });
  }

  function state() {
    var parts = [];
    if (q.value) parts.push("q=" + encodeURIComponent(q.value));
    if (outcome.value) parts.push("outcome=" + encodeURIComponent(outcome.value));
    if (owner.value) parts.push("owner=" + encodeURIComponent(owner.value));
    var has = checked();
    if (has.length) parts.push("has=" + has.join(","));
    if (sort.key !== "nodeid" || sort.desc) {
      parts.push("sort=" + sort.key + (sort.desc ? "-" : ""));
    }
    return parts.join("&");
  }

  function save() {
    var hash = state();
    history.replaceState(null, "", hash ? "#" + hash : location.pathname + location.search);
  }

  function load() {
    var params = new URLSearchParams(location.hash.slice(1));
    q.value = params.get("q") || "";
    var wanted = params.get("outcome") || "";
    outcome.value = Array.prototype.some.call(outcome.options, function (o) {
      return o.value === wanted;
    }) ? wanted : "";
    var who = params.get("owner") || "";
    owner.value = Array.prototype.some.call(owner.options, function (o) {
      return o.value === who;
    }) ? who : "";
    var has = (params.get("has") || "").split(",");
    boxes.forEach(function (b) { b.checked = has.indexOf(b.value) >= 0; });
    var s = params.get("sort") || "nodeid";
    var desc = s.slice(-1) === "-";
    var key = desc ? s.slice(0, -1) : s;
    var known = heads.some(function (th) { return th.dataset.key === key; });
    sort = known ? { key: key, desc: desc } : { key: "nodeid", desc: false };
  }

  function filter() {
    var text = q.value.toLowerCase();
    var has = checked();
    var count = 0;
    groups.forEach(function (g) {
      var flags = (g.dataset.flags || "").split(" ");
      var owners = (g.dataset.owners || "").split(" ");
      var ok = (!text || g.dataset.nodeid.toLowerCase().indexOf(text) >= 0) &&
        (!outcome.value || g.dataset.outcome === outcome.value) &&
        (!owner.value || owners.indexOf(owner.value) >= 0) &&
        has.every(function (h) { return flags.indexOf(h) >= 0; });
      g.hidden = !ok;
      if (ok) count += 1;
    });
    shown.textContent = count + " of " + groups.length + " tests";
  }

  function value(g, th) {
    var raw = g.dataset[th.dataset.key] || "";
    if (th.dataset.type === "num") return raw === "" ? -Infinity : Number(raw);
    return raw;
  }

  function order() {
    var th = heads.filter(function (h) { return h.dataset.key === sort.key; })[0];
    heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", sort.desc ? "descending" : "ascending");
    var sign = sort.desc ? -1 : 1;
    var sorted = groups.slice().sort(function (a, b) {
      var x = value(a, th), y = value(b, th);
      if (x < y) return -sign;
      if (x > y) return sign;
      return a.dataset.nodeid < b.dataset.nodeid ? -1 : 1;
    });
    var frag = document.createDocumentFragment();
    sorted.forEach(function (g) { frag.appendChild(g); });
    table.appendChild(frag);
  }

  function toggle(button, open) {
    var detail = button.closest("tbody").querySelector("tr.detail");
    if (!detail) return;
    detail.hidden = !open;
    button.setAttribute("aria-expanded", String(open));
  }

  heads.forEach(function (th) {
    th.addEventListener("click", function () {
      var key = th.dataset.key;
      sort = { key: key, desc: sort.key === key ? !sort.desc : th.dataset.type === "num" };
      order();
      save();
    });
  });
  table.addEventListener("click", function (event) {
    var button = event.target.closest("button.open");
    if (button) toggle(button, button.getAttribute("aria-expanded") !== "true");
  });
  document.getElementById("expand").addEventListener("click", function () {
    var buttons = table.querySelectorAll(":scope > tbody:not([hidden]) button.open");
    var open = this.textContent === "open all";
    Array.prototype.forEach.call(buttons, function (b) { toggle(b, open); });
    this.textContent = open ? "close all" : "open all";
  });
  // A select tells its choice by "change" (a keyboard or a driver may not send "input").
  [q, outcome, owner].concat(boxes).forEach(function (el) {
    el.addEventListener("input", function () { filter(); save(); });
    el.addEventListener("change", function () { filter(); save(); });
  });
  document.getElementById("filters").addEventListener("submit", function (event) {
    event.preventDefault();
  });
  window.addEventListener("hashchange", function () { load(); filter(); order(); });

  load();
  filter();
  order();
  root.dataset.ready = "1";
  root.dataset.readyMs = String(Math.round(performance.now() - start));
})();
