#!/usr/bin/env python3
"""Renders a window of a Chrome trace (as `resident profile --trace` writes it) to a PNG
timeline: one row per named track, complete events as boxes coloured by category, flow arrows
from send to handling, a microsecond axis. Needs Pillow (`pip install pillow`).

usage: trace-png.py TRACE.json OUT.png [--start-us T] [--window-us W] [--width PX]
Without --start-us it shows the window with the most events.
"""
import argparse
import json

from PIL import Image, ImageDraw, ImageFont

COLOURS = {
    "handler": (66, 133, 244),
    "queue": (251, 188, 5),
    "transfer": (234, 67, 53),
    "launch": (156, 39, 176),
    "idle": (200, 200, 200),
}


def font(size):
    for path in ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",):
        try:
            return ImageFont.truetype(path, size)
        except OSError:
            pass
    return ImageFont.load_default()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--start-us", type=float)
    ap.add_argument("--window-us", type=float, default=2000.0)
    ap.add_argument("--width", type=int, default=1600)
    a = ap.parse_args()
    ev = json.load(open(a.trace))["traceEvents"]
    procs, threads, order = {}, {}, {}
    for e in ev:
        if e["ph"] == "M" and e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        elif e["ph"] == "M" and e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    spans = [e for e in ev if e["ph"] == "X"]
    if not spans:
        raise SystemExit("no complete events in the trace")
    work = [e for e in spans if e.get("cat") == "handler"] or spans
    t_min = min(e["ts"] for e in work)
    t_max = max(e["ts"] + e["dur"] for e in work)
    if a.start_us is not None:
        start = a.start_us
    else:
        # The window (of 50 candidates over the handler spans) holding the most events.
        cands = [t_min + k * max(t_max - t_min - a.window_us, 0) / 49 for k in range(50)]
        start = max(cands, key=lambda c: sum(1 for e in spans if c <= e["ts"] < c + a.window_us))
    end = start + a.window_us
    rows = sorted(threads, key=lambda k: (k[0], k[1]))
    rows = [r for r in rows if any((e["pid"], e["tid"]) == r for e in spans)]
    label_w, row_h, top, W = 260, 34, 70, a.width
    H = top + row_h * len(rows) + 60
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    f, fs = font(14), font(11)
    d.text((10, 10), f"{a.trace.split('/')[-1]}: {a.window_us:.0f} us from t = {start:.0f} us", fill="black", font=font(16))
    x = 10
    for cat, c in COLOURS.items():
        d.rectangle([x, 40, x + 14, 54], fill=c)
        d.text((x + 18, 39), cat, fill="black", font=fs)
        x += 100
    px = lambda t: label_w + (t - start) / (end - start) * (W - label_w - 10)
    y_of = {}
    for i, r in enumerate(rows):
        y = top + i * row_h
        y_of[r] = y
        if i % 2 == 0:
            d.rectangle([0, y, W, y + row_h], fill=(246, 246, 246))
        d.text((8, y + 9), f"{procs.get(r[0], r[0])[9:]}: {threads[r]}", fill="black", font=f)
    for e in spans:
        r = (e["pid"], e["tid"])
        if r not in y_of or e["ts"] > end or e["ts"] + e["dur"] < start:
            continue
        x0, x1 = max(px(e["ts"]), label_w), min(px(e["ts"] + e["dur"]), W - 10)
        y = y_of[r]
        c = COLOURS.get(e.get("cat"), (120, 120, 120))
        d.rectangle([x0, y + 5, max(x1, x0 + 1), y + row_h - 5], fill=c, outline=(60, 60, 60) if x1 - x0 > 4 else None)
        if x1 - x0 > 60:
            d.text((x0 + 3, y + 10), e["name"], fill="white" if e.get("cat") != "idle" else "black", font=fs)
    flows = {}
    for e in ev:
        if e["ph"] in ("s", "f"):
            flows.setdefault(e["id"], {})[e["ph"]] = e
    for fl in flows.values():
        if "s" not in fl or "f" not in fl:
            continue
        s, t = fl["s"], fl["f"]
        if t["ts"] < start or s["ts"] > end:
            continue
        rs, rt = (s["pid"], s["tid"]), (t["pid"], t["tid"])
        if rs not in y_of or rt not in y_of:
            continue
        x0, x1 = max(px(s["ts"]), label_w), min(px(t["ts"]), W - 10)
        y0, y1 = y_of[rs] + row_h // 2, y_of[rt] + row_h // 2
        d.line([x0, y0, x1, y1], fill=(30, 30, 30), width=1)
        d.polygon([(x1, y1), (x1 - 5, y1 - 4 if y1 > y0 else y1 + 4), (x1 - 6, y1)], fill=(30, 30, 30))
    ya = top + row_h * len(rows) + 10
    d.line([label_w, ya, W - 10, ya], fill="black")
    for k in range(11):
        t = start + k * (end - start) / 10
        xx = px(t)
        d.line([xx, ya, xx, ya + 6], fill="black")
        d.text((xx - 20, ya + 10), f"{t - start:.0f} us", fill="black", font=fs)
    img.save(a.out)


if __name__ == "__main__":
    main()
