// loopsq dashboard: live output and auto-refresh (served from /static/live.js; the CSP allows only this origin).
//
// An element with data-live="<url>" and data-after="<positions>" opens one EventSource on its URL; each
// "chunk" event appends to the <pre data-source=S data-stream=stdout|stderr> it names (or, when the page shows
// output redacted, updates its "[redacted N chars]"). "done" (every source ended) reloads the page, which then
// shows the stored output. A page without live output reloads every data-refresh seconds while it can change.
(function () {
  "use strict";
  function redacted(n) { return n > 0 ? "[redacted " + n + " chars]" : ""; }
  function target(root, source, stream) {
    var pres = root.querySelectorAll("pre[data-stream]");
    for (var i = 0; i < pres.length; i++) {
      if (pres[i].dataset.source === source && pres[i].dataset.stream === stream) { return pres[i]; }
    }
    return null;
  }
  function follow(el) {
    var show = el.dataset.show === "true";
    var url = el.dataset.live + "&after=" + encodeURIComponent(el.dataset.after || "{}");
    var events = new EventSource(url);
    el.dataset.state = "open";
    events.addEventListener("chunk", function (e) {
      var data = JSON.parse(e.data);
      var pre = target(document, data.source, data.stream);
      if (!pre) { return; }
      if (show) {
        var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.textContent += data.text;
        if (atBottom) { pre.scrollTop = pre.scrollHeight; }
      } else {
        var n = Number(pre.dataset.chars || "0") + data.chars;
        pre.dataset.chars = String(n);
        pre.textContent = redacted(n);
      }
    });
    events.addEventListener("end", function (e) {
      var data = JSON.parse(e.data);
      var pre = target(document, data.source, "stdout");
      if (pre) { pre.dataset.ended = "true"; }
    });
    events.addEventListener("done", function () {
      events.close();
      el.dataset.state = "done";
      setTimeout(function () { window.location.reload(); }, 300);
    });
  }
  function start() {
    var lives = document.querySelectorAll("[data-live]");
    for (var i = 0; i < lives.length; i++) { follow(lives[i]); }
    var refresh = Number(document.body.dataset.refresh || "0");
    if (refresh > 0 && lives.length === 0) {
      setTimeout(function () { window.location.reload(); }, refresh * 1000);
    }
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();
