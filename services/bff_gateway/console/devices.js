// Boss web console: the devices page (#/devices). Lists the owner's enrolled devices, makes a
// one-time pairing code for a new one (`boss-worker enroll CODE` on that device) and revokes a
// device: every service refuses its credential from then on. Uses app.js's `api` and `el`.

async function renderDevices(view) {
  const answer = await api("/api/v1/devices");
  const codeBox = el("p", { class: "pairing-code", "data-role": "pairing-code" });
  // The code last made stays on the page through re-renders (a live event redraws the page) until
  // it expires: the owner may still be typing it on the device.
  const shown = state.pairingCode;
  if (shown && Date.parse(shown.expires_at) > Date.now()) showPairingCode(codeBox, shown);
  const newCode = el("button", { type: "button", "data-action": "pairing-code" }, "New pairing code");
  newCode.addEventListener("click", async () => {
    // The page may be redrawn while the code is asked for: the answer goes into the code box
    // shown then, not into this one, which the redraw may have replaced.
    const onPage = () => document.querySelector("[data-role='pairing-code']") || codeBox;
    try {
      state.pairingCode = await api("/api/v1/devices/pairing-codes", {});
      showPairingCode(onPage(), state.pairingCode);
    } catch (error) {
      onPage().replaceChildren(el("span", { class: "error" }, `No code: ${error.message}`));
    }
  });
  const rows = answer.devices.map((device) => deviceRow(device, view));
  view.replaceChildren(
    el("h1", {}, "Devices"),
    el("div", { class: "device-actions" }, newCode, codeBox),
    rows.length
      ? el("ul", { class: "devices" }, rows)
      : el("p", { class: "empty" }, "No device enrolled yet: make a pairing code and enter it on the device."));
}

function showPairingCode(codeBox, code) {
  codeBox.replaceChildren(
    "On the device: ", el("code", {}, `boss-worker enroll ${code.pairing_code}`),
    ", or in a clone of Boss ", el("code", {}, `python -m worker enroll ${code.pairing_code}`),
    " (works once, until ", timeEl(code.expires_at), ")");
}

function deviceRow(device, view) {
  const revoke = device.active
    ? el("button", { type: "button", "data-action": "revoke" }, "Revoke")
    : el("span", { class: "revoked" }, "revoked ", timeEl(device.revoked_at));
  if (device.active) {
    revoke.addEventListener("click", async () => {
      revoke.disabled = true;
      try {
        await api(`/api/v1/devices/${encodeURIComponent(device.device_id)}/revoke`, {});
        await renderDevices(view);
      } catch (error) {
        revoke.disabled = false;
        revoke.after(el("span", { class: "error" }, ` Not revoked: ${error.message}`));
      }
    });
  }
  return el("li", { "data-device-id": device.device_id, "data-active": String(device.active) },
    el("span", { class: "name" }, device.device_name || device.node_id),
    el("span", { class: "node" }, `${device.worker_id} on ${device.node_id}`),
    el("span", { class: "enrolled" }, "enrolled ", timeEl(device.enrolled_at)),
    revoke);
}
