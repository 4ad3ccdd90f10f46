"""Pictures of a generation in progress, drawn with numpy (a few milliseconds each, so that a live view and a
race can show ten a second): the image so far with the last round's tokens coloured as in the Acceptance maps,
and the race of AR, Eagle-1 and the chosen method replayed at their measured pace. Independent of Gradio."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from matplotlib.colors import to_rgb
from PIL import Image, ImageDraw, ImageFont

from ..core.stats import RESAMPLED, GenerationStats, Round
from .plots.style import ACCEPTED_COLOR, NOT_YET_COLOR, ORIGIN_STYLE, REJECTED_EDGE

TINT = 0.45  # the colour's share in a marked cell (the Acceptance maps' alpha)
RACE_SECONDS = 4.0  # the slowest lane of a race takes this long on screen
FRAMES_PER_SECOND = 10  # at most: a browser that falls behind shows a lagging page
GAP = 12  # pixels between two lanes of a race
TITLE = 26  # pixels above each lane for its name


def rgb(color: str) -> np.ndarray:
    return np.array(to_rgb(color)) * 255


def cell_bounds(index: int, grid: tuple[int, int], shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Pixel rows and columns (top, bottom, left, right) of token ``index`` (raster order) on an image of
    ``shape``: cells of a grid that need not divide the image evenly."""
    rows, cols = grid
    r, c = divmod(index, cols)
    height, width = shape[:2]
    return (round(r * height / rows), round((r + 1) * height / rows), round(c * width / cols),
            round((c + 1) * width / cols))


def progress_frame(pixels: np.ndarray, grid: tuple[int, int], shown: int, last: Round | None) -> np.ndarray:
    """The image with only its first ``shown`` tokens visible (later cells covered, as in Replay) and the
    round ``last`` that added the latest of them marked: its accepted drafts green, its own token pink and
    outlined red if it replaced a rejected draft, else in its origin's colour (yellow: a bonus; grey: AR)."""
    frame = pixels.astype(np.float64).copy()
    cells = grid[0] * grid[1]
    for index in range(min(shown, cells), cells):
        top, bottom, left, right = cell_bounds(index, grid, frame.shape)
        frame[top:bottom, left:right] = rgb(NOT_YET_COLOR)
    if last is not None and last.emitted:
        end = last.start + len(last.emitted)
        for index in range(last.start, min(end, cells, shown)):
            top, bottom, left, right = cell_bounds(index, grid, frame.shape)
            own = index == end - 1
            color = rgb(ORIGIN_STYLE[last.next_origin][0] if own else ACCEPTED_COLOR)
            frame[top:bottom, left:right] = (1 - TINT) * frame[top:bottom, left:right] + TINT * color
            if own and last.next_origin == RESAMPLED:
                edge = max(1, (bottom - top) // 8)
                for rows, columns in ((slice(top, top + edge), slice(left, right)),
                                      (slice(bottom - edge, bottom), slice(left, right)),
                                      (slice(top, bottom), slice(left, left + edge)),
                                      (slice(top, bottom), slice(right - edge, right))):
                    frame[rows, columns] = rgb(REJECTED_EDGE)
    return frame.round().clip(0, 255).astype(np.uint8)


def rgb_pixels(pixels: np.ndarray) -> np.ndarray:
    """An (H, W) grey or (H, W, 3) image as (H, W, 3) uint8."""
    return np.repeat(pixels[..., None], 3, axis=2) if pixels.ndim == 2 else pixels[..., :3]


# The race -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lane:
    """One run of a race: its name, its final image (display size), the statistics of one timed run (its
    rounds, and the measured end of each) and the latency it finishes at (the timing table's median; the run's
    round ends are scaled by median / its own latency, 1 for the median run of an odd number of repeats).
    After the last round come the read-back and the bookkeeping: the lane finishes at its latency. ``drafter``:
    the drafter its chain or tree drafted with, as the page says it (empty for AR, or a Jacobi window)."""

    name: str
    pixels: np.ndarray
    stats: GenerationStats
    finish: float
    drafter: str = ""

    @property
    def title(self) -> str:
        """The name above the lane's picture, with its drafter: ``COOL-SD (EAGLE-3 drafter)``."""
        return f"{self.name} ({self.drafter} drafter)" if self.drafter else self.name

    @property
    def ends(self) -> np.ndarray:
        return np.array(self.stats.round_ends) * (self.finish / self.stats.seconds["total"])

    def done(self, clock: float) -> int:
        """Rounds finished by ``clock`` (model seconds)."""
        return int(np.searchsorted(self.ends, clock, side="right"))

    def tokens(self, rounds: int) -> int:
        return sum(len(r.emitted) for r in self.stats.rounds[:rounds])


def slowdown(lanes: list[Lane], seconds: float = RACE_SECONDS) -> float:
    """The one factor every lane is slowed by, so that the slowest takes ``seconds`` on screen."""
    return seconds / max(lane.finish for lane in lanes)


def race_clocks(lanes: list[Lane], factor: float, fps: int = FRAMES_PER_SECOND) -> list[float]:
    """The model times (seconds) of a race's frames: evenly spaced from 0 to the last finish, at most ``fps``
    a second on screen. (A last frame a moment after the one before it was at times not shown by the page.)"""
    end = max(lane.finish for lane in lanes)
    count = max(1, math.floor(end * factor * fps + 1e-6))
    return [end * k / count for k in range(count + 1)]


def race_frame(lanes: list[Lane], grid: tuple[int, int], clock: float) -> Image.Image:
    """The lanes side by side at model time ``clock``: each its image so far (the last finished round marked),
    its name above, and a green bar under it once it has finished."""
    font = ImageFont.load_default(size=16)
    pictures = []
    for lane in lanes:
        rounds = lane.done(clock)
        last = lane.stats.rounds[rounds - 1] if rounds else None
        pictures.append(progress_frame(lane.pixels, grid, lane.tokens(rounds), last))
    height, width = max(p.shape[0] for p in pictures), max(p.shape[1] for p in pictures)
    canvas = Image.new("RGB", (len(lanes) * width + (len(lanes) - 1) * GAP, height + TITLE + 8), "white")
    draw = ImageDraw.Draw(canvas)
    for k, (lane, picture) in enumerate(zip(lanes, pictures)):
        left = k * (width + GAP)
        canvas.paste(Image.fromarray(picture), (left, TITLE))
        draw.text((left + 2, 4), lane.title, fill="black", font=font)
        if clock >= lane.finish:
            draw.rectangle((left, TITLE + height + 2, left + width - 1, TITLE + height + 7), fill=ACCEPTED_COLOR)
    return canvas


def drafter_note(lanes: list[Lane]) -> str:
    """Which drafter each drafting lane drafted with, in one sentence (empty where none did): ``Drafter:
    EAGLE-3 (COOL-SD, Eagle-1); AR drafts nothing.``"""
    drafters: dict[str, list[str]] = {}
    for lane in lanes:
        if lane.drafter:
            drafters.setdefault(lane.drafter, []).append(lane.name)
    if not drafters:
        return ""
    said = "; ".join(f"{drafter} ({', '.join(names)})" for drafter, names in drafters.items())
    idle = [lane.name for lane in lanes if not lane.drafter]
    return f" Drafter: {said}" + (f"; {', '.join(idle)} drafts nothing." if idle else ".")


def race_table(lanes: list[Lane], clock: float, factor: float, steps: str = "eager") -> str:
    """Markdown: per lane its tokens, target forwards and state at model time ``clock``, and the slow-down (every
    lane ran with the same ``steps``, AR included) and the drafter of the lanes that drafted."""
    rows = ["| run | tokens | target forwards | time |", "|---|---|---|---|"]
    for lane in lanes:
        rounds = lane.done(clock)
        state = (f"finished at {lane.finish * 1000:.1f} ms" if clock >= lane.finish
                 else f"{min(clock, lane.finish) * 1000:.1f} ms…")
        rows.append(f"| {lane.name} | {lane.tokens(rounds)} / {lane.stats.tokens} | {rounds} | {state} |")
    return "\n".join(rows) + (f"\n\n<small>Replayed {factor:.0f}x slower than measured: each run finishes at its "
                              "median latency in the timing table, and its rounds end at the times measured in its "
                              f"timed run of median latency. Every run, AR included, ran with {steps} steps."
                              f"{drafter_note(lanes)}</small>")


def race_verdict(lanes: list[Lane]) -> str:
    """Who finished first, and by how much, in measured times."""
    order = sorted(lanes, key=lambda lane: lane.finish)
    first, slowest = order[0], order[-1]
    others = ", ".join(f"{lane.name} {lane.finish / first.finish:.2f}x its time" for lane in order[1:])
    return (f"**{first.name} finished first** ({first.finish * 1000:.1f} ms; {others}). "
            f"{slowest.name} took {slowest.finish * 1000:.1f} ms.")
