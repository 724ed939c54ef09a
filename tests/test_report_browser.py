"""report.html of the sample run in a real browser (headless Chromium).

Chromium is driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: NUL-terminated JSON on file descriptors 3 and
4), so no client library and no port is needed. In a 1280-pixel-wide
window every chart's SVG must have a non-zero rendered size, nothing may
stick out to the right, the screenshot must not be blank and the page must
request nothing but itself. Skips, saying why, where Chromium is missing
(``.ci/run`` installs Debian's ``chromium``).
"""

import base64
import fcntl
import io
import json
import os
import select
import shutil
import signal
import subprocess
import time

import pytest
from PIL import Image

pytestmark = pytest.mark.extended

WIDTH, HEIGHT = 1280, 900
TIMEOUT_S = 60
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update",
         "--no-first-run", "--no-default-browser-check", "--mute-audio",
         "--remote-debugging-pipe")
# What the page reports about itself once loaded (JSON).
MEASURE = """JSON.stringify({
  svgs: [...document.querySelectorAll('svg')].map(s => {
    const r = s.getBoundingClientRect(); return [r.width, r.height]; }),
  scrollWidth: document.documentElement.scrollWidth,
  innerWidth: window.innerWidth,
  widest: Math.max(0, ...[...document.querySelectorAll('body *')].map(
      e => e.getBoundingClientRect().right)),
})"""


def _chromium():
  for name in ("chromium", "chromium-browser", "google-chrome"):
    if shutil.which(name):
      return shutil.which(name)
  return None


def _above_4(fd):
  moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
  os.close(fd)
  return moved


class _DevTools:
  """One browser process and a page session on its DevTools pipe."""

  def __init__(self, binary, profile):
    to_chrome, self._send_fd = os.pipe()
    self._recv_fd, from_chrome = os.pipe()
    # Above 4, so that the child's dup2 onto 3 and 4 never clobbers one or
    # keeps one non-inheritable (dup2 of an fd onto itself is a no-op).
    to_chrome, from_chrome = (_above_4(to_chrome), _above_4(from_chrome))

    def wire_pipes():  # in the child: Chromium expects fds 3 and 4
      os.dup2(to_chrome, 3)
      os.dup2(from_chrome, 4)

    # pylint: disable=subprocess-popen-preexec-fn
    self.process = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}",
         f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, preexec_fn=wire_pipes, close_fds=False,
        start_new_session=True)
    os.close(to_chrome)
    os.close(from_chrome)
    self._buffer, self._next_id, self.events = b"", 0, []
    self.session = None

  def close(self):
    """Ends the browser's whole process group, then reaps it."""
    for fd in (self._send_fd, self._recv_fd):
      try:
        os.close(fd)
      except OSError:
        pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
      try:
        os.killpg(self.process.pid, sig)
      except ProcessLookupError:
        break
      try:
        self.process.wait(5)
      except subprocess.TimeoutExpired:
        pass
    # The renderer and GPU helpers share the group: none may outlive it.
    try:
      os.killpg(self.process.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass

  def _message(self, deadline):
    while b"\0" not in self._buffer:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([self._recv_fd], [], [], left)[0]:
        raise TimeoutError("no answer from Chromium's DevTools pipe")
      chunk = os.read(self._recv_fd, 1 << 20)
      if not chunk:
        raise ConnectionError("Chromium closed its DevTools pipe")
      self._buffer += chunk
    raw, self._buffer = self._buffer.split(b"\0", 1)
    return json.loads(raw)

  def call(self, method, session=True, **params):
    self._next_id += 1
    message = {"id": self._next_id, "method": method, "params": params}
    if session and self.session:
      message["sessionId"] = self.session
    os.write(self._send_fd, json.dumps(message).encode() + b"\0")
    deadline = time.monotonic() + TIMEOUT_S
    while True:
      reply = self._message(deadline)
      if reply.get("id") == self._next_id:
        if "error" in reply:
          raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]
      self.events.append(reply)

  def wait_for(self, method):
    deadline = time.monotonic() + TIMEOUT_S
    while not any(e.get("method") == method for e in self.events):
      self.events.append(self._message(deadline))


def render(binary, profile, url):
  """(measurements, screenshot PNG bytes, requested URLs) of ``url``."""
  tools = _DevTools(binary, profile)
  try:
    target = tools.call("Target.createTarget", url="about:blank")["targetId"]
    tools.session = tools.call("Target.attachToTarget", targetId=target,
                               flatten=True)["sessionId"]
    tools.call("Network.enable")
    tools.call("Page.enable")
    tools.call("Emulation.setDeviceMetricsOverride", width=WIDTH,
               height=HEIGHT, deviceScaleFactor=1, mobile=False)
    tools.call("Page.navigate", url=url)
    tools.wait_for("Page.loadEventFired")
    measured = json.loads(tools.call(
        "Runtime.evaluate", expression=MEASURE,
        returnByValue=True)["result"]["value"])
    png = base64.b64decode(tools.call("Page.captureScreenshot",
                                      format="png")["data"])
    requested = [e["params"]["request"]["url"] for e in tools.events
                 if e.get("method") == "Network.requestWillBeSent"]
    return measured, png, requested
  finally:
    tools.close()


def problems(measured, png, requested, page_url):
  """Everything wrong with a rendering; empty when nothing is."""
  found = []
  if len(measured["svgs"]) < 3:  # S-curve and two size histograms at least
    found.append(f"only {len(measured['svgs'])} charts")
  found += [f"chart {i} renders {w}x{h} px"
            for i, (w, h) in enumerate(measured["svgs"]) if w <= 0 or h <= 0]
  if measured["innerWidth"] != WIDTH:
    found.append(f"window is {measured['innerWidth']} px wide")
  if max(measured["scrollWidth"], measured["widest"]) > WIDTH:
    found.append(f"content {measured['scrollWidth']} px wide (widest element"
                 f" ends at {measured['widest']:.0f} px) in a {WIDTH}-px "
                 "window")
  image = Image.open(io.BytesIO(png)).convert("L")
  histogram = image.histogram()
  background = max(histogram)
  if image.size[0] != WIDTH or background > 0.99 * sum(histogram):
    found.append(f"screenshot {image.size} is blank "
                 f"({background / sum(histogram):.1%} one shade)")
  found += [f"requested {u}" for u in requested if u != page_url]
  return found


# The real report, and pages that must fail: a zero-size chart, a too-wide
# block and a fetched image; a blank page.
BREAK_CHARTS = ('<div style="width:1600px">wide</div><svg width="0" '
                'height="0"></svg><img src="http://localhost:9/pixel.png">')


@pytest.fixture(scope="session", name="chromium")
def fixture_chromium():
  """The browser binary; skips (before the sample run) without one."""
  binary = _chromium()
  if binary is None:
    pytest.skip("Chromium is not installed (apt-get install chromium): the "
                "report was not checked in a browser")
  return binary


@pytest.mark.parametrize("page", ["report", "broken", "blank"])
def test_report_renders_in_headless_chromium(chromium, sample_run, tmp_path,
                                             page):
  with open(os.path.join(sample_run, "report.html"), encoding="utf-8") as f:
    html = f.read()
  if page == "broken":
    html = html.replace("</main>", BREAK_CHARTS + "</main>")
  elif page == "blank":
    html = "<!DOCTYPE html><html><body></body></html>"
  path = tmp_path / "report.html"
  path.write_text(html, encoding="utf-8")
  url = path.as_uri()
  found = problems(*render(chromium, tmp_path / "profile", url), url)
  if page == "report":
    assert not found, found
  elif page == "broken":
    kinds = ("renders 0x0", "px wide (widest", "requested http://localhost:9")
    assert all(any(k in p for p in found) for k in kinds), found
  else:
    assert any("blank" in p for p in found), found
