"""The live view and the race: what the decoder shows between rounds, the end of each round, the pictures of a
run in progress and the race's clock, against values worked out by hand."""

import time

import numpy as np
import pytest

from coolsd.app import frames
from coolsd.core.decode import Watch, generate, generate_batch
from coolsd.core.rules import AR, CoolSD, Eagle
from coolsd.core.stats import BONUS, FIRST, RESAMPLED, TARGET, GenerationStats, Round
from coolsd.core.trees import parse_draft
from coolsd.models.bundle import random_bundle

ACCEPTED_RGB, RESAMPLED_RGB, BONUS_RGB = (27, 158, 119), (231, 41, 138), (230, 171, 2)  # the figures' hex colours


@pytest.fixture(scope="module")
def bundle():
    return random_bundle("tiny")


CASES = [(AR(), "none"), (Eagle(), "chain:3"), (CoolSD(delta=2.0), "tree:eagle25"), (Eagle(), "jacobi:4:coupled")]


@pytest.mark.parametrize(("rule", "draft"), CASES, ids=["ar", "eagle-chain", "cool-tree", "scd"])
def test_a_watched_generation_is_the_same_and_shows_every_round_so_far(bundle, rule, draft):
    """Watched after every round (interval 0), a generation gives the same tokens; each view holds the rounds
    finished so far (the prefill's first token, then one more round each time) and the tokens they emitted."""
    tree = parse_draft(draft, 15) if draft != "none" else None
    plain = generate(bundle, 1, rule, tree, seed=5)
    seen = []
    watched = generate(bundle, 1, rule, tree, seed=5, watch=Watch(lambda images: seen.append(images[0]), 0))
    assert watched.tokens == plain.tokens
    assert len(seen) == plain.stats.target_forwards - 1  # one per round after the prefill
    for rounds, view in enumerate(seen, start=2):
        assert [r.emitted for r in view.stats.rounds] == [r.emitted for r in plain.stats.rounds[:rounds]]
        emitted = sum(len(r.emitted) for r in plain.stats.rounds[:rounds])
        assert view.tokens == plain.tokens[:emitted]


def test_rounds_end_in_order_and_a_watch_is_not_timed(bundle):
    """One end per round (the prefill's included), increasing, before the total; a watch that takes 0.1 s per
    look (a look after each of the 3 or more rounds) is left out of the round ends and of the total (a run of
    the tiny model takes milliseconds: the limit is half the time spent looking)."""
    tree = parse_draft("chain:3", 15)
    plain = generate(bundle, 1, Eagle(), tree, seed=2)
    ends = plain.stats.round_ends
    assert len(ends) == plain.stats.target_forwards and all(0 < a < b for a, b in zip(ends, ends[1:]))
    assert ends[-1] <= plain.stats.seconds["total"]
    looks = []

    def slow(images):
        looks.append(len(images[0].tokens))
        time.sleep(0.1)

    watched = generate(bundle, 1, Eagle(), tree, seed=2, watch=Watch(slow, 0))
    assert len(looks) >= 3
    assert watched.stats.seconds["total"] < 0.1 * len(looks) / 2
    assert watched.stats.round_ends[-1] < 0.1 * len(looks) / 2


def test_a_watched_batch_shows_each_image_so_far(bundle):
    """In a batch every image is shown (its own tokens so far): two seeds decoded together, each view a prefix
    of what it gets alone."""
    tree = parse_draft("chain:3", 15)
    alone = [generate(bundle, 1, Eagle(), tree, seed=s).tokens for s in (3, 4)]
    seen = []
    together = generate_batch(bundle, [1, 1], Eagle(), tree, seeds=[3, 4], watch=Watch(seen.append, 0))
    assert [g.tokens for g in together] == alone
    assert seen and all(len(view) == 2 for view in seen)
    for view in seen:
        for image, tokens in zip(view, alone):
            assert image.tokens == tokens[:len(image.tokens)]


def round_of(start: int, emitted: int, origin: str) -> Round:
    return Round(start, [1] * 3, [True] * 3, [], {}, [7] * emitted, origin)


def test_a_picture_in_progress_covers_what_is_not_generated_and_colours_the_last_round():
    """A 16 x 16 grey image on a 2 x 2 grid, three tokens shown, the last round emitting tokens 1 and 2 (one
    accepted draft, then a token resampled after a rejection): cell 0 as it is, cell 1 tinted green at 45%,
    cell 2 tinted pink with a 1-pixel red border (an 8-pixel cell), cell 3 black."""
    pixels = np.full((16, 16, 3), 100, np.uint8)
    frame = frames.progress_frame(pixels, (2, 2), 3, round_of(1, 2, RESAMPLED)).astype(int)

    def tint(color):
        return [round(0.55 * 100 + 0.45 * c) for c in color]

    assert (frame[:8, :8] == 100).all()
    assert (frame[:8, 8:] == tint(ACCEPTED_RGB)).all()
    cell = frame[8:, :8]
    assert (cell[1:-1, 1:-1] == tint(RESAMPLED_RGB)).all()
    for edge in (cell[0], cell[-1], cell[:, 0], cell[:, -1]):
        assert (edge == (255, 0, 0)).all()
    assert (frame[8:, 8:] == 0).all()
    bonus = frames.progress_frame(pixels, (2, 2), 4, round_of(2, 2, BONUS)).astype(int)
    assert (bonus[8:, 8:] == tint(BONUS_RGB)).all() and (bonus[8:, :8] == tint(ACCEPTED_RGB)).all()
    assert (bonus[:8] == 100).all()  # an earlier round's cells: as they are
    nothing = frames.progress_frame(pixels, (2, 2), 0, None)
    assert (nothing == 0).all()


def lane(name: str, ends: list[float], total: float, finish: float, emitted: list[int]) -> frames.Lane:
    stats = GenerationStats("eagle", {}, "chain:3", 3, 0, 0, {}, [], round_ends=ends, seconds={"total": total})
    stats.rounds = [round_of(sum(emitted[:k]), count, FIRST if k == 0 else TARGET) for k, count in enumerate(emitted)]
    stats.token_origin = ["x"] * sum(emitted)
    return frames.Lane(name, np.zeros((4, 4, 3), np.uint8), stats, finish)


def test_a_lane_replays_its_rounds_scaled_to_its_median_latency():
    """Round ends 10, 20, 50 ms of a 60 ms run, finishing at the 120 ms median: the rounds end at 20, 40 and
    100 ms, and the lane shows the tokens of the rounds ended."""
    run = lane("Eagle-1", [0.01, 0.02, 0.05], 0.06, 0.12, [1, 3, 2])
    assert [run.done(t) for t in (0.0, 0.019, 0.02, 0.039, 0.04, 0.099, 0.1, 0.2)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [run.tokens(k) for k in range(4)] == [0, 1, 4, 6]


def test_the_race_clock_slows_every_lane_by_one_factor():
    """Lanes finishing at 0.1 s and 0.4 s: the slowest takes RACE_SECONDS on screen, frames FRAMES_PER_SECOND
    a second of screen time up to the end; the table says finished only at or after a lane's finish."""
    fast, slow = lane("COOL-SD", [0.01, 0.05], 0.1, 0.1, [1, 5]), lane("AR", [0.01, 0.2], 0.4, 0.4, [1, 1])
    factor = frames.slowdown([fast, slow])
    assert factor == pytest.approx(frames.RACE_SECONDS / 0.4)
    clocks = frames.race_clocks([fast, slow], factor)
    assert len(clocks) == frames.RACE_SECONDS * frames.FRAMES_PER_SECOND + 1 and clocks[-1] == 0.4
    assert np.diff(clocks) == pytest.approx(1 / (frames.FRAMES_PER_SECOND * factor))  # evenly, 10 a second
    uneven = frames.race_clocks([fast, slow], factor * 1.01)  # 40.4 frames' worth: 40, evenly spaced
    assert len(uneven) == 41 and min(np.diff(uneven)) * factor * 1.01 >= 1 / frames.FRAMES_PER_SECOND
    halfway = frames.race_table([fast, slow], 0.15, factor)
    assert "| COOL-SD | 6 / 6 | 2 | finished at 100.0 ms |" in halfway and "| AR | 1 / 2 | 1 | 150.0 ms… |" in halfway
    assert "| AR | 2 / 2 | 2 | 399.0 ms… |" in frames.race_table([fast, slow], 0.399, factor)  # the read-back is left
    footnote = frames.race_table([fast, slow], 0.4, factor, "compiled")
    assert "Every run, AR included, ran with compiled steps." in footnote
    assert frames.race_verdict([slow, fast]).startswith("**COOL-SD finished first** (100.0 ms; AR 4.00x its time)")
    picture = frames.race_frame([fast, slow], (2, 2), 0.2)
    assert picture.size == (2 * 4 + frames.GAP, 4 + frames.TITLE + 8)


def test_a_race_names_each_drafting_lanes_drafter_and_none_for_ar():
    """A lane's title (above its picture) names the drafter it drafted with, and the table's note says which lanes
    drafted with which drafter and that AR drafts nothing; a race without a drafter (a Jacobi window) says none."""
    from dataclasses import replace
    ar = lane("AR", [0.01, 0.2], 0.4, 0.4, [1, 1])
    eagle = replace(lane("Eagle-1", [0.01, 0.1], 0.2, 0.2, [1, 3]), drafter="EAGLE-3")
    cool = replace(lane("COOL-SD", [0.01, 0.05], 0.1, 0.1, [1, 5]), drafter="EAGLE-3")
    assert [x.title for x in (ar, eagle, cool)] == ["AR", "Eagle-1 (EAGLE-3 drafter)", "COOL-SD (EAGLE-3 drafter)"]
    table = frames.race_table([ar, eagle, cool], 0.4, frames.slowdown([ar, eagle, cool]))
    assert table.endswith("Drafter: EAGLE-3 (Eagle-1, COOL-SD); AR drafts nothing.</small>")
    assert "| AR | 2 / 2 | 2 | finished at 400.0 ms |" in table  # the rows keep the runs' names
    window = [ar, replace(eagle, drafter=""), replace(cool, drafter="")]
    assert "Drafter" not in frames.race_table(window, 0.4, frames.slowdown(window))
    assert frames.race_verdict([ar, eagle, cool]).startswith("**COOL-SD finished first**")
