// Boss web console: how times are shown. Plain functions, no DOM: index.html loads this before
// app.js, and tests/unit/bff_gateway/test_console_times.py runs it under Node.
"use strict";

// An RFC 3339 instant with its offset, as the server writes one into text (Python's isoformat(),
// e.g. "2026-03-25T08:08:30+00:00", fractional seconds optional, or "...Z").
const ISO_INSTANT = /\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})/g;

// A time as the console shows it: the browser's local date and time; "—" for none.
function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "—";
}

// Server-written text with instants in it (e.g. the handoff reason "compaction expected at
// 2026-03-25T08:08:30+00:00"), in order: plain strings, and `{ iso, text: when(iso) }` for each
// instant. Text that only looks like an instant and does not parse stays text.
function timeParts(text) {
  const source = String(text || "");
  const parts = [];
  let last = 0;
  for (const match of source.matchAll(ISO_INSTANT)) {
    if (Number.isNaN(Date.parse(match[0]))) continue;
    if (match.index > last) parts.push(source.slice(last, match.index));
    parts.push({ iso: match[0], text: when(match[0]) });
    last = match.index + match[0].length;
  }
  if (last < source.length) parts.push(source.slice(last));
  return parts;
}
