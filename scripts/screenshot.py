#!/usr/bin/env python3
"""Renders a pseudo-terminal capture (the raw bytes a terminal received,
escape sequences and all) to a PNG, as a terminal of ROWS x COLS shows it.

  scripts/screenshot.py [--replace OLD NEW]... CAPTURE OUT.png [ROWS COLS]

README's screenshot of `gpuslice top` is made so, from the capture the
`top` test keeps with GPUSLICE_TOP_CAPTURE (crates/gpuslice/tests/top.rs):

  GPUSLICE_TOP_CAPTURE=/tmp/top.ansi cargo test -p gpuslice --test integration -- top::top_shows
  python3 -m venv target/screenshot && target/screenshot/bin/pip install pyte pillow
  target/screenshot/bin/python scripts/screenshot.py \
      --replace "$(grep -ao '/tmp/[.]tmp[A-Za-z0-9]*/fakehost' /tmp/top.ansi | head -1)" /tmp/fakehost \
      /tmp/top.ansi docs/top.png

pyte plays the terminal; Pillow draws its cells in DejaVu Sans Mono
(Debian: fonts-dejavu-core).
"""

import sys

import pyte
from PIL import Image, ImageDraw, ImageFont

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
BOLD = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono-Bold.ttf"
SIZE = 15
BG = (24, 24, 27)
FG = (220, 220, 220)
# The 16 ANSI colours (a dark theme's), by pyte's names.
PALETTE = {
    "black": (24, 24, 27),
    "red": (224, 82, 82),
    "green": (98, 200, 98),
    "brown": (226, 192, 80),  # pyte calls ANSI yellow "brown"
    "yellow": (226, 192, 80),
    "blue": (90, 140, 230),
    "magenta": (200, 110, 200),
    "cyan": (80, 190, 200),
    "white": (220, 220, 220),
    "brightblack": (100, 100, 110),
    "brightred": (255, 110, 110),
    "brightgreen": (130, 230, 130),
    "brightbrown": (255, 220, 110),
    "brightyellow": (255, 220, 110),
    "brightblue": (130, 170, 255),
    "brightmagenta": (230, 140, 230),
    "brightcyan": (120, 220, 230),
    "brightwhite": (255, 255, 255),
}


# Box-drawing characters: which of (up, down, left, right) they join.
BOX = {
    "│": (1, 1, 0, 0),
    "─": (0, 0, 1, 1),
    "┌": (0, 1, 0, 1),
    "┐": (0, 1, 1, 0),
    "└": (1, 0, 0, 1),
    "┘": (1, 0, 1, 0),
}


def replace_in_row(cells, old, new):
    """`old` replaced by `new` in a row of cells (new cells take the style
    of old's first), the row kept at its width: a capture's temporary path
    shown as the path README uses."""
    text = "".join(c.data for c in cells)
    at = text.find(old)
    if at < 0:
        return cells
    made = [cells[at]._replace(data=ch) for ch in new]
    row = cells[:at] + made + cells[at + len(old) :]
    # Keep the right border where it was: pad or trim before it.
    width, last = len(cells), cells[-1]
    body = row[:-1]
    blank = cells[at]._replace(data=" ", bg="default", reverse=False)
    body = (body + [blank] * width)[: width - 1]
    return body + [last]


def colour(name, default):
    if name == "default":
        return default
    if name in PALETTE:
        return PALETTE[name]
    if len(name) == 6:  # pyte gives 256-colour and true colour as hex
        return tuple(int(name[i : i + 2], 16) for i in (0, 2, 4))
    return default


REPLACE = []


def main(argv):
    while len(argv) > 2 and argv[1] == "--replace":
        REPLACE.append((argv[2], argv[3]))
        argv = argv[:1] + argv[4:]
    if len(argv) not in (3, 5):
        sys.exit(__doc__)
    rows, cols = (int(argv[3]), int(argv[4])) if len(argv) == 5 else (30, 110)
    screen = pyte.Screen(cols, rows)
    stream = pyte.ByteStream(screen)
    with open(argv[1], "rb") as f:
        stream.feed(f.read())
    font, bold = ImageFont.truetype(FONT, SIZE), ImageFont.truetype(BOLD, SIZE)
    left, top, right, bottom = font.getbbox("█")
    cw, ch = font.getlength("M"), SIZE + 4
    pad = 12
    img = Image.new("RGB", (int(cw * cols) + 2 * pad, ch * rows + 2 * pad), BG)
    draw = ImageDraw.Draw(img)
    for y in range(rows):
        line = [screen.buffer[y][x] for x in range(cols)]
        for old, new in REPLACE:
            line = replace_in_row(line, old, new)
        for x in range(cols):
            c = line[x]
            fg, bg = colour(c.fg, FG), colour(c.bg, BG)
            if c.reverse:
                fg, bg = bg, fg
            px, py = pad + x * cw, pad + y * ch
            if bg != BG:
                draw.rectangle([px, py, px + cw, py + ch], fill=bg)
            if c.data.strip():
                if c.data == "█":  # a full block fills its cell, no gaps
                    draw.rectangle([px, py, px + cw, py + ch - 1], fill=fg)
                elif c.data in BOX:  # box lines join from cell to cell
                    mx, my = px + cw / 2, py + ch / 2
                    up, down, lft, rgt = BOX[c.data]
                    if up or down:
                        draw.line([mx, py if up else my, mx, py + ch if down else my], fill=fg)
                    if lft or rgt:
                        draw.line([px if lft else mx, my, px + cw if rgt else mx, my], fill=fg)
                else:
                    draw.text((px, py + 2), c.data, font=bold if c.bold else font, fill=fg)
    img.save(argv[2])


if __name__ == "__main__":
    main(sys.argv)
