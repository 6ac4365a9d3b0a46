// The tidelog console: polls /api/cluster (every node's status merged per partition) and draws,
// per partition, one bar per replica cut into its three zones — deleted (below the log start),
// committed (below the high-water mark), not yet committed (up to the log end) — with the
// low-water mark and the cursors marked, and the hold that sets the LWM in words.
// Every name that comes from the cluster is set as text, never parsed as HTML.
"use strict";

const POLL_MS = 500;
const STALE_MS = 3000;
let lastOk = 0;
let updates = 0;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "style") node.setAttribute("style", value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function pct(offset, scale) {
  return Math.max(0, Math.min(100, (100 * offset) / scale));
}

function drawNodes(nodes) {
  const box = document.getElementById("nodes");
  box.replaceChildren(...nodes.map((n) => {
    if (n.error) {
      return el("div", { class: "node down", "data-node": n.node_id },
        el("strong", {}, "node " + n.node_id), " unreachable: ", n.error.message || n.error.code);
    }
    const total = n.disk_total_bytes || 0;
    const used = total ? total - n.disk_free_bytes : 0;
    const leads = n.metadata_leader === n.node_id ? " · metadata leader" : "";
    return el("div", { class: "node", "data-node": n.node_id },
      el("strong", {}, "node " + n.node_id), leads,
      el("div", {}, "stores " + bytes(n.storage_bytes) +
        (n.storage_max_bytes > 0 ? " of " + bytes(n.storage_max_bytes) + " (storage.max.bytes)" : "")),
      el("div", { class: "disk" }, "disk " + bytes(n.disk_free_bytes) + " free of " + bytes(total)),
      el("div", { class: "gauge", title: "disk used" },
        el("div", { style: "width:" + (total ? pct(used, total) : 0) + "%" })));
  }));
}

function holdText(row) {
  const lwm = row.low_watermark || {};
  if (lwm.offset === undefined) return row.leader < 0 ? "no leader: " + (row.no_leader || "electing") : "";
  return "low-water mark " + lwm.offset + ", set by " + lwm.set_by;
}

function drawReplica(row, id, rep, scale) {
  const leader = String(row.leader) === id;
  const start = rep.log_start_offset, hw = rep.high_watermark, leo = rep.log_end_offset;
  const lso = rep.last_stable_offset === undefined ? -1 : rep.last_stable_offset;
  const bar = el("div", { class: "bar" },
    el("div", { class: "zone deleted", style: `left:0;width:${pct(start, scale)}%`, title: `deleted: below ${start}` }),
    el("div", { class: "zone committed",
      style: `left:${pct(start, scale)}%;width:${pct(hw, scale) - pct(start, scale)}%`,
      title: `committed: ${start} to ${hw}` }),
    el("div", { class: "zone uncommitted",
      style: `left:${pct(hw, scale)}%;width:${Math.max(0, pct(leo, scale) - pct(hw, scale))}%`,
      title: `not yet committed: ${hw} to ${leo}` }));
  if (leader) {
    const lwm = (row.low_watermark || {}).offset;
    if (lwm !== undefined) {
      bar.append(el("div", { class: "mark lwm", style: `left:${pct(lwm, scale)}%`, title: "low-water mark " + lwm }));
    }
    if (lso >= 0 && lso < hw) {  // an undecided transaction holds read_committed readers here
      bar.append(el("div", { class: "mark lso", style: `left:${pct(lso, scale)}%`,
        title: `last stable offset ${lso}: read_committed readers stop here` }));
    }
    for (const [name, c] of Object.entries(row.cursors || {})) {
      bar.append(el("div", { class: "mark cursor", "data-cursor": name, style: `left:${pct(c.position, scale)}%`,
        title: `cursor ${name} at ${c.position}, ${c.lag} behind the HW` },
        el("span", { class: "label" }, `${name} (lag ${c.lag})`)));
    }
  }
  const role = rep.observer ? "observer" : rep.role;
  const sync = leader ? "" : rep.in_sync ? ", in sync" : ", not in sync";
  return el("div", {
      class: "replica" + (leader ? " leader" : ""), "data-node": id, "data-role": rep.role,
      "data-log-start": start, "data-lso": lso, "data-hw": hw, "data-leo": leo,
      "data-in-sync": rep.in_sync ? 1 : 0 },
    el("span", { class: "who" }, `node ${id} `, el("small", {}, role + sync)),
    bar,
    el("span", { class: "offsets" }, `log start ${start} · ${lso >= 0 && lso < hw ? `LSO ${lso} · ` : ""}HW ${hw} · LEO ${leo} · ${bytes(rep.size_bytes)} in ${rep.segment_count} segment(s)`));
}

function drawPartition(row) {
  const ids = Object.keys(row.replicas).sort((a, b) => Number(a) - Number(b));
  let scale = 1;
  for (const id of ids) scale = Math.max(scale, row.replicas[id].log_end_offset);
  const inSync = ids.filter((id) => row.replicas[id].in_sync || String(row.leader) === id);
  const name = `${row.topic}/${row.partition}`;
  const facts = el("div", { class: "facts" },
    el("span", { class: "leader-id", "data-leader": row.leader }, row.leader >= 0 ? "leader " + row.leader : "no leader"),
    el("span", { class: "epoch", "data-epoch": row.epoch }, "epoch " + row.epoch),
    el("span", { class: "isr" }, "in sync: " + (inSync.join(", ") || "none") + " of " + (row.voters || []).join(", ")),
    row.under_replicated ? el("span", { class: "warn" }, "under-replicated") : null);
  return el("section", { class: "partition", "data-partition": name },
    el("h2", {}, name), facts,
    el("div", { class: "hold" }, holdText(row)),
    ...ids.map((id) => drawReplica(row, id, row.replicas[id], scale)));
}

async function poll() {
  try {
    const answer = await fetch("/api/cluster", { cache: "no-store" });
    if (!answer.ok) throw new Error("HTTP " + answer.status);
    const view = await answer.json();
    drawNodes(view.nodes);
    const main = document.getElementById("partitions");
    const rows = view.partitions;
    if (rows.length) main.replaceChildren(...rows.map(drawPartition));
    else main.replaceChildren(el("p", { class: "empty" }, "No partitions yet."));
    document.getElementById("served-by").textContent = "served by node " + view.node_id;
    lastOk = Date.now();
    updates++;
  } catch (err) {
    document.getElementById("updated").textContent = "cannot reach the node: " + err.message;
  }
  const updated = document.getElementById("updated");
  updated.dataset.updates = String(updates);
  if (lastOk) {
    const age = Date.now() - lastOk;
    updated.classList.toggle("stale", age > STALE_MS);
    if (age <= STALE_MS) updated.textContent = "live · updated " + new Date(lastOk).toLocaleTimeString();
  }
  setTimeout(poll, POLL_MS);
}

poll();
