// Talon's panel: progressive behaviour only (every page works without it). No inline script: the
// CSP allows only this file. Live pages follow the server with server-sent events.
"use strict";
(function () {
  const csrf = document.body.dataset.csrf || "";

  // --- images: a double click opens the original in a dialog (Escape closes it) ---------------
  const viewer = document.getElementById("viewer");
  function openViewer(src) {
    if (!viewer) return;
    viewer.querySelector("img").src = src;
    viewer.showModal();
  }
  document.addEventListener("dblclick", (e) => {
    const img = e.target.closest("img.thumb, .thumbs img");
    if (img) openViewer(img.dataset.full || img.src);
  });
  // A missing or damaged object: a placeholder that tries again when clicked.
  function unavailable(img) {
    const ph = document.createElement("span");
    ph.className = "placeholder";
    ph.textContent = "image unavailable — click to retry";
    ph.addEventListener("click", () => {
      const again = img.cloneNode();
      again.src = img.src.split("?")[0] + "?retry=" + Date.now();
      ph.replaceWith(again);
    });
    img.replaceWith(ph);
  }
  document.addEventListener("error", (e) => {
    const img = e.target;
    if (img instanceof HTMLImageElement && img.classList.contains("thumb")) unavailable(img);
  }, true);
  // Images that failed before this script ran.
  document.querySelectorAll("img.thumb").forEach((img) => {
    if (img.complete && img.naturalWidth === 0) unavailable(img);
  });

  // --- a conversation that grows while it is open -------------------------------------------------
  const box = document.getElementById("messages");
  async function refresh() {
    const count = Number(box.dataset.count || "0");
    const res = await fetch(box.dataset.live + "/messages?after=" + count, {credentials: "same-origin"});
    if (!res.ok) return;
    const html = await res.text();
    box.insertAdjacentHTML("beforeend", html);
    box.dataset.count = res.headers.get("X-Talon-Count") || String(count);
    window.scrollTo(0, document.body.scrollHeight);
  }
  if (box && box.dataset.live) {
    const events = new EventSource(box.dataset.live + "/events?count=" + box.dataset.count);
    events.addEventListener("count", (e) => {
      if (Number(e.data) !== Number(box.dataset.count)) refresh();
    });
    box.refresh = refresh;
  }

  // --- logs that follow ------------------------------------------------------------------------
  const logBox = document.getElementById("log");
  if (logBox) {
    setInterval(async () => {
      const res = await fetch("/ui/api/logs?level=" + logBox.dataset.level + "&after=" + logBox.dataset.last,
        {credentials: "same-origin"});
      if (!res.ok) return;
      const data = await res.json();
      for (const line of data.lines) {
        logBox.append(line.at + " " + line.level + " " + line.text + "\n");
        logBox.dataset.last = line.seq;
      }
    }, 2000);
  }

  // --- the web chat's composer -------------------------------------------------------------------
  const composer = document.getElementById("composer");
  if (!composer) return;
  const TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif"];
  const maxImages = Number(composer.dataset.maxImages);
  const thumbs = document.getElementById("thumbs");
  const text = document.getElementById("text");
  const errorLine = document.getElementById("composer-error");
  const streaming = document.getElementById("streaming");
  let images = [];  // {file, url}

  function showError(message) {
    errorLine.textContent = message;
    errorLine.hidden = !message;
  }
  function drawThumbs() {
    thumbs.replaceChildren();
    images.forEach((item, i) => {
      const fig = document.createElement("figure");
      const img = document.createElement("img");
      img.src = item.url;
      img.alt = item.file.name || "image " + (i + 1);
      img.dataset.full = item.url;
      const remove = document.createElement("button");
      remove.type = "button";
      remove.textContent = "×";
      remove.title = "remove";
      remove.setAttribute("aria-label", "remove " + img.alt);
      remove.addEventListener("click", () => {
        URL.revokeObjectURL(item.url);
        images.splice(i, 1);
        drawThumbs();
      });
      fig.append(img, remove);
      thumbs.append(fig);
    });
  }
  function addFiles(files) {
    showError("");
    for (const file of files) {
      if (!TYPES.includes(file.type)) {
        showError((file.name || "that file") + ": only PNG, JPEG, WebP and GIF images can be sent (not " +
          (file.type || "this type") + ")");
        continue;
      }
      if (images.length >= maxImages) {
        showError("at most " + maxImages + " images per message");
        break;
      }
      images.push({file, url: URL.createObjectURL(file)});
    }
    drawThumbs();
  }
  text.addEventListener("paste", (e) => {
    const files = Array.from(e.clipboardData ? e.clipboardData.files : []);
    if (files.length) {
      e.preventDefault();
      addFiles(files);
    } else if (e.clipboardData && /^\s*https?:\/\/\S+\.(png|jpe?g|gif|webp|svg)\s*$/i.test(e.clipboardData.getData("text"))) {
      e.preventDefault();
      showError("a remote image URL is not fetched: save the image and paste or drop the file itself");
    }
  });
  composer.addEventListener("dragover", (e) => { e.preventDefault(); composer.classList.add("dragging"); });
  composer.addEventListener("dragleave", () => composer.classList.remove("dragging"));
  composer.addEventListener("drop", (e) => {
    e.preventDefault();
    composer.classList.remove("dragging");
    const files = Array.from(e.dataTransfer ? e.dataTransfer.files : []);
    if (files.length) addFiles(files);
    else if (e.dataTransfer && e.dataTransfer.getData("text/uri-list")) {
      showError("a remote image URL is not fetched: save the image and drop the file itself");
    }
  });
  document.getElementById("pick").addEventListener("change", (e) => { addFiles(Array.from(e.target.files)); e.target.value = ""; });

  composer.addEventListener("submit", async (e) => {
    e.preventDefault();
    if (!text.value.trim() && !images.length) return;
    const body = new FormData();
    body.append("text", text.value);
    for (const item of images) body.append("image", item.file, item.file.name || "image");
    const button = document.getElementById("send");
    button.disabled = true;
    showError("");
    try {
      const res = await fetch("/ui/api/chat/send", {method: "POST", body, credentials: "same-origin",
        headers: {"X-CSRF-Token": csrf}});
      const data = await res.json().catch(() => ({error: "the server answered " + res.status}));
      if (!res.ok) {
        showError(data.error || ("refused (" + res.status + ")"));  // the draft stays as it was
        return;
      }
      images.forEach((item) => URL.revokeObjectURL(item.url));
      images = [];
      drawThumbs();
      text.value = "";
      if (box && box.refresh) box.refresh();
    } catch (err) {
      showError("could not reach Talon: " + err);
    } finally {
      button.disabled = false;
    }
  });

  // The answer as it is written, then the history from the store.
  const stream = new EventSource("/ui/api/chat/events?after=" + composer.dataset.seq);
  stream.onmessage = (e) => {
    const event = JSON.parse(e.data);
    const live = streaming.querySelector(".text");
    if (event.type === "delta") {
      streaming.hidden = false;
      live.textContent += event.text;
    } else if (event.type === "step" && event.tools) {
      live.textContent += "\n";
    } else if (event.type === "delivered" || event.type === "end") {
      if (event.type === "delivered") { live.textContent = ""; streaming.hidden = true; }
      if (box && box.refresh) box.refresh();
    } else if (event.type === "reply" && streaming.hidden) {
      streaming.hidden = false;
      live.textContent = event.text;
    } else if (event.type === "notice") {
      const line = document.createElement("p");
      line.className = event.problem ? "error notice" : "dim notice";
      line.textContent = event.text;
      box.append(line);
    } else if (event.type === "file") {
      const url = "/ui/attachments/web:operator/" + event.sha;
      const holder = document.createElement("div");
      holder.className = "msg assistant";
      if (event.mime.startsWith("image/")) {
        const img = document.createElement("img");
        img.className = "thumb"; img.src = url; img.dataset.full = url; img.alt = event.name;
        holder.append(img);
      } else {
        const a = document.createElement("a");
        a.href = url; a.download = event.name; a.textContent = event.name;
        holder.append(a);
      }
      box.append(holder);
    }
  };
})();
