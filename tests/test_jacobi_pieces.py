"""Jacobi refresh, piece by piece (spec section 11): each piece against its own definition, not only the image's law.

tests/test_jacobi.py checks the law of whole images; faults that move only a minority of tokens (or only the records)
pass it. Here each piece is checked directly, every expected value from the spec:

1. The refresh's law. For (q_old, p) rows with residuals of 1, 2 and many tokens and rows with zeros, 100,000 old
   drafts ``d ~ q_old`` (drawn here) and their refresh in one vectorised call: maximal coupling gives ``y ~ p``,
   ``y = d`` with probability ``sum min(q_old, p)``, and ``y | y != d ~ Norm([p - q_old]_+)`` in every quarter of the
   keep test's uniform; Gumbel coupling gives ``y ~ p`` and ``y = argmax(log p + G)`` with the slot's own ``G``;
   the independent refresh gives ``(d, y) ~ q_old x p``.
2. The window's bookkeeping. After rounds that committed ``k + 1`` tokens (k = 0..L), slot ``s`` stands at row
   ``r = k + 1 + s`` (computed here): its stored ``q`` is ``p_r`` (r <= L) or the fresh law (r > L); a coupling
   keeps the old draft of row ``r`` (r < L); a Gumbel slot keeps row ``r``'s noise and takes new noise where the
   position is new; the bonus row (r = L: scored, no draft) is never coupled; origins are the recount of 4.
3. Forced positions (section 8) in Jacobi windows are drafted as their token and always accepted, counted over
   every round of 100 images, for every refresh and both fresh laws.
4. Origins: each round's ``sources`` equal a recount from the round's start, its drafted tokens and the previous
   round's drafted tokens: fresh past the last row scored; kept where a coupling left the old draft in place;
   refreshed otherwise (the bonus row, and every slot of the independent refresh).

Each check is run once more with the fault it targets planted in a patched copy of ``JacobiSource`` (recompiled from
its own source with one line changed, see :func:`plant`) and must fail: (a) the residual without ``[.]_+``,
(b) the residual drawn with the keep test's uniform, (c) the bonus row treated as a drafted slot, (d) fresh drafts
drawn without the allowed-token mask, (e) the origins kept and refreshed swapped.

Thresholds: every statistical check fails below a p-value of ``ALPHA = 1e-8``; the refresh law tests make 40 such
checks (6 independent, 28 coupled, 6 Gumbel), so a correct sampler fails one with probability below 4e-7 (Bonferroni;
over 10 seeds the smallest clean p-value was 9e-3), while the planted faults give p-values that underflow to 0. The
bonus-row count uses a 6-sigma band (normal approximation, about 2e-9; the planted fault lands about 60 sigma out).
A planted-fault test does not rerun the clean check: that is the parametrized test beside it, same seed.
"""

from __future__ import annotations

import inspect
import itertools
import textwrap
from types import SimpleNamespace

import pytest
import torch
from helpers import counts_pvalue
from test_jacobi import CLASS_ID, FORCED, KINDS, SAMPLING, WINDOWS
from test_jacobi import tiny  # noqa: F401  (a fixture)

from coolsd.core import jacobi as jacobi_module
from coolsd.core.decode import decode_batch
from coolsd.core.jacobi import JacobiSource
from coolsd.core.rules import Eagle
from coolsd.core.sources import FRESH_CODE, KEPT_CODE, REFRESHED_CODE
from coolsd.core.stats import DRAFT_ORIGINS
from coolsd.core.trees import FRESH_LAWS, REFRESHES, parse_draft

ALPHA = 1e-8  # per statistical check (see the module's docstring)
DRAWS = 100_000
SIGMAS = 6.0
F64 = torch.float64

# --- planted faults: JacobiSource's own methods, recompiled with one line changed -------------------------------

FAULTS = {
    "a-unclamped-residual": ("refreshed", "normalise((p_rows - old_q).clamp_min(0), p_rows)",
                             "normalise(p_rows - old_q, p_rows)"),
    "b-residual-reuses-test-uniform": ("refreshed", "sample(mass, draw)", "sample(mass, test)"),
    "c-bonus-row-coupled": ("observe", "rows <= self.window, rows < self.window",
                            "rows <= self.window, rows <= self.window"),
    "d-fresh-drafts-unmasked": ("fresh_drafts", "allowed = ws.allowed(self.slots)", "allowed = None"),
    "e-origins-swapped": ("observe", "torch.where(kept, KEPT_CODE, REFRESHED_CODE)",
                          "torch.where(kept, REFRESHED_CODE, KEPT_CODE)"),
}


def plant(monkeypatch, fault: str) -> None:
    """Replace one ``JacobiSource`` method by a copy of its own source with the fault's one change (so the fault is
    exactly the one named, in today's code); a method that no longer holds the line fails here, not silently."""
    name, old, new = FAULTS[fault]
    source = textwrap.dedent(inspect.getsource(getattr(JacobiSource, name)))
    assert source.count(old) == 1, f"fault {fault}: JacobiSource.{name} no longer holds {old!r}; update the plant"
    namespace: dict = {}
    code = compile(source.replace(old, new), f"<{fault}>", "exec", annotations.compiler_flag, True)
    exec(code, vars(jacobi_module), namespace)  # noqa: S102  (the module's globals: it sees what the original sees)
    monkeypatch.setattr(JacobiSource, name, namespace[name])


def test_every_planted_fault_still_applies():
    """Each fault's line is still in today's code (else its plant would fail the test that uses it)."""
    for fault, (name, old, _) in FAULTS.items():
        assert inspect.getsource(getattr(JacobiSource, name)).count(old) == 1, fault


# --- a window outside a generation: the source on a bare workspace, its random numbers drawn here ---------------

def bare_window(refresh: str, fresh: str, batch: int, depth: int, vocab: int) -> tuple[SimpleNamespace, JacobiSource]:
    """A Jacobi source of ``depth`` slots on a workspace holding only what the source reads (no constrained
    positions): the old window is ``ws.node_tokens[:, 1:]`` (slot j: row j) with its laws ``ws.q``."""
    ws = SimpleNamespace(tree=parse_draft(f"jacobi:{depth}:{refresh}:{fresh}"), batch=batch,
                         target=SimpleNamespace(vocab_size=vocab), device=torch.device("cpu"), dtype=F64,
                         node_tokens=torch.zeros(batch, depth + 1, dtype=torch.long),
                         node_origin=torch.zeros(batch, depth + 1, dtype=torch.long),
                         q=torch.zeros(batch, depth, vocab, dtype=F64), allowed=lambda offsets: None)
    return ws, JacobiSource(ws)


def draw_randoms(source: JacobiSource, generator: torch.Generator) -> None:
    """What a round draws for the source (``Workspace.draw_randoms``), from one seeded stream."""
    for buffer, law in source.randoms:
        getattr(buffer, f"{law}_")(generator=generator)


def at_rows(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``values[b, rows[b, s]]`` for (B, N, ...) values and (B, S) rows, by plain indexing."""
    return values[torch.arange(len(rows))[:, None], rows]


def gumbel_argmax(p: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """The Gumbel-max draw ``argmax(log p + G)``, ``G = -log E``, computed here."""
    return (p.log() - exponentials.log()).argmax(-1)


def recount_origins(rows: torch.Tensor, new: torch.Tensor, old: torch.Tensor, depth: int, refresh: str) -> torch.Tensor:
    """The origin codes by definition, for new slots at rows ``rows`` of the last forward holding ``new`` tokens,
    ``old`` the old draft of each slot's row (any value where the row held none): fresh past row ``depth`` (not
    scored); kept where a coupling (coupled, gumbel) left the old draft of a drafted row (< depth) in place;
    refreshed otherwise (the bonus row ``depth`` held no draft; the independent refresh keeps nothing). For the
    maximal coupling "kept" and "the old token" agree: rejecting ``d`` needs ``p(d) < q_old(d)``, where the residual
    ``[p - q_old]_+`` is 0, so a rejected draft never comes back."""
    kept = (rows < depth) & (new == old) & (refresh != "independent")
    return torch.where(rows > depth, FRESH_CODE, torch.where(kept, KEPT_CODE, REFRESHED_CODE))


# --- 1. the refresh's law, directly -----------------------------------------------------------------------------

VOCAB = 8
CASES = {  # name: (q_old, p); the residual [p - q_old]_+ in the name
    "residual of one token": ([.3, .3, .2, .1, .1, 0, 0, 0], [.2, .2, .2, .1, .1, .2, 0, 0]),
    "residual of two tokens": ([.4, .3, .1, .1, .1, 0, 0, 0], [.2, .2, .25, .1, .05, .2, 0, 0]),
    "residual of five tokens": ([.3, .25, .2, .1, .05, .05, .03, .02], [.05, .1, .1, .15, .15, .15, .15, .15]),
    "p zero where q drafts": ([.5, .3, .2, 0, 0, 0, 0, 0], [0, .3, .3, .4, 0, 0, 0, 0]),
    "disjoint supports": ([.5, .5, 0, 0, 0, 0, 0, 0], [0, 0, .25, .25, .5, 0, 0, 0]),
    "no residual (q = p)": ([.1, .2, .3, .4, 0, 0, 0, 0], [.1, .2, .3, .4, 0, 0, 0, 0]),
}
TEST_UNIFORM = 0  # the keep test's uniform among a slot's three (JacobiSource.__init__: test, draw, fresh)
QUARTERS = 4
MIN_BIN = 500  # a quarter of the test uniform with fewer rejected draws is not tested (its cells would be tiny)


def refresh_draws(refresh: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """``DRAWS`` refreshes of every case at once, after a round that committed one token: new slot ``c`` stands at
    row ``c + 1`` of the forward, whose old draft ``d`` (drawn here from ``q_old``; for the Gumbel refresh as
    ``argmax(log q_old + G)`` with the slot's noise) and law ``q_old`` are the case's, and ``p`` the case's row."""
    q_old, p = (torch.tensor([case[i] for case in CASES.values()], dtype=F64) for i in (0, 1))
    q_old, p = q_old / q_old.sum(-1, keepdim=True), p / p.sum(-1, keepdim=True)
    cases, depth = len(CASES), len(CASES) + 1
    ws, source = bare_window(refresh, "point", DRAWS, depth, VOCAB)
    generator = torch.Generator().manual_seed(seed)
    spare = torch.full((1, VOCAB), 1 / VOCAB, dtype=F64)  # row 0 (the committed token) and the bonus row
    p_rows = torch.cat([spare, p, spare])[None].expand(DRAWS, -1, -1)
    ws.q[:] = torch.cat([spare, q_old])
    if refresh == "gumbel":
        source.noise.exponential_(generator=generator)
        old = gumbel_argmax(q_old, source.noise[:, 1:])
    else:
        old = torch.multinomial(q_old, DRAWS, replacement=True, generator=generator).T
    ws.node_tokens[:, 2:] = old
    draw_randoms(source, generator)
    test = source.uniforms[:, TEST_UNIFORM, :cases].clone()
    noise = source.noise[:, 1:].clone() if refresh == "gumbel" else None  # each case's row's: its position's
    source.observe(ws, None, p_rows, torch.ones(DRAWS, dtype=torch.long))
    return {"q_old": q_old, "p": p, "old": old, "new": ws.node_tokens[:, 1:1 + cases], "test": test, "noise": noise}


def refresh_law_failures(refresh: str) -> list[str]:
    """Every check of section 1 that fails, with its p-value."""
    out = refresh_draws(refresh)
    failures = []

    def check(name: str, case: str, observed: torch.Tensor, probs: torch.Tensor) -> None:
        pvalue = counts_pvalue(observed, probs)
        if pvalue < ALPHA:
            failures.append(f"{refresh}, {case}: {name} (p-value {pvalue:.1e})")

    for c, case in enumerate(CASES):
        q_old, p, old, new = out["q_old"][c], out["p"][c], out["old"][:, c], out["new"][:, c]
        if refresh == "independent":  # (d, y) ~ q_old x p
            check("(old, new) ~ q_old x p", case, torch.bincount(old * VOCAB + new, minlength=VOCAB ** 2),
                  (q_old[:, None] * p[None]).flatten())
            continue
        check("new ~ p", case, torch.bincount(new, minlength=VOCAB), p)
        if refresh == "gumbel":
            if not torch.equal(new, gumbel_argmax(p, out["noise"][:, c])):
                failures.append(f"gumbel, {case}: the new draft is not argmax(log p + G) with the slot's G")
            continue
        overlap = torch.minimum(q_old, p).sum().clamp(0, 1)  # P(kept) = 1 - TV(q_old, p)
        same = int((new == old).sum())
        check("P(new = old) = sum min(q_old, p)", case, torch.tensor([same, DRAWS - same]),
              torch.stack([overlap, 1 - overlap]))
        residual = (p - q_old).clamp_min(0)
        bins = (out["test"][:, c] * QUARTERS).long()
        for quarter in range(QUARTERS):  # y | not kept ~ Norm([p - q_old]_+), whatever the test's uniform was
            rejected = new[(new != old) & (bins == quarter)]
            if len(rejected) >= MIN_BIN:
                check(f"new | new != old, test uniform in quarter {quarter + 1} ~ Norm([p - q_old]_+)", case,
                      torch.bincount(rejected, minlength=VOCAB), residual / residual.sum())
    return failures


@pytest.mark.parametrize("refresh", REFRESHES)
def test_each_refresh_has_its_law(refresh):
    assert refresh_law_failures(refresh) == []


@pytest.mark.parametrize("fault, failing", [("a-unclamped-residual", "new ~ p"),
                                            ("b-residual-reuses-test-uniform", "test uniform in quarter")])
def test_coupling_faults_fail_the_law_of_the_refresh(monkeypatch, fault, failing):
    plant(monkeypatch, fault)  # without it: test_each_refresh_has_its_law[coupled]
    failures = refresh_law_failures("coupled")
    assert any(failing in failure for failure in failures), f"{fault} passed: {failures}"


# --- 2. the window's bookkeeping, directly ----------------------------------------------------------------------

DEPTH, BOOK_VOCAB, PER_COUNT = 4, 10, 300


def bookkeeping_failures(refresh: str, fresh: str, seed: int = 1) -> list[str]:
    """One observe over ``PER_COUNT`` images per commit count ``k + 1`` (k = 0..L accepted drafts). The old window
    has ``q_old = p`` on every drafted row (a coupling then keeps the old draft: it must be the draft of the slot's
    row), and the bonus row's ``p`` puts at least ``q_old(d)`` on the last old draft ``d`` (coupling it with ``d``
    would always keep ``d``; not coupled, it equals ``d`` with probability ``p_L(d)``)."""
    counts = torch.arange(1, DEPTH + 2).repeat(PER_COUNT)
    batch = len(counts)
    ws, source = bare_window(refresh, fresh, batch, DEPTH, BOOK_VOCAB)
    generator = torch.Generator().manual_seed(seed)
    p = torch.randn(batch, DEPTH + 1, BOOK_VOCAB, generator=generator, dtype=F64).softmax(-1)
    old_noise = torch.empty(batch, DEPTH, BOOK_VOCAB, dtype=F64).exponential_(generator=generator)
    old = gumbel_argmax(p[:, :DEPTH], old_noise)  # any token of positive q_old would do but for the Gumbel refresh
    last = old[:, -1]
    point = torch.nn.functional.one_hot(last, BOOK_VOCAB).to(F64)
    weight = p[:, DEPTH - 1].gather(1, last[:, None])  # p_L := w delta_d + (1 - w) p_L, w = q_old(d)
    p[:, DEPTH] = weight * point + (1 - weight) * p[:, DEPTH]
    ws.q.copy_(p[:, :DEPTH])
    ws.node_tokens[:, 1:] = old
    if refresh == "gumbel":
        source.noise.copy_(old_noise)
    draw_randoms(source, generator)
    races = source.races.clone() if refresh == "gumbel" else None
    source.observe(ws, None, p, counts)

    rows = counts[:, None] + torch.arange(DEPTH)  # slot s of an image that committed k + 1 tokens: row k + 1 + s
    new, q, origin = ws.node_tokens[:, 1:], ws.q, ws.node_origin[:, 1:]
    scored, drafted, bonus = rows <= DEPTH, rows < DEPTH, rows == DEPTH
    old_at_row = at_rows(old, rows.clamp_max(DEPTH - 1))
    failures = []
    want_q = torch.where(scored[..., None], at_rows(p, rows.clamp_max(DEPTH)),
                         torch.nn.functional.one_hot(new, BOOK_VOCAB).to(F64) if fresh == "point"
                         else torch.full_like(q, 1 / BOOK_VOCAB))
    if not torch.equal(q, want_q):
        failures.append("a stored q is not its row's p (scored) or the fresh law's (not scored)")
    if refresh != "independent" and not torch.equal(new[drafted], old_at_row[drafted]):
        failures.append("a coupling with q_old = p changed a draft: the old draft is not its row's")
    if not torch.equal(origin, recount_origins(rows, new, old_at_row, DEPTH, refresh)):
        failures.append("origins differ from the recount")
    if refresh == "gumbel":
        noise = source.noise
        if not torch.equal(noise[drafted], at_rows(old_noise, rows.clamp_max(DEPTH - 1))[drafted]):
            failures.append("a drafted row's position lost its noise")
        match = (noise[:, :, None] == races[:, None]).all(-1)  # (image, slot, new noise row)
        if not (match.sum(-1)[~drafted] == 1).all() or (match.sum(1) > 1).any():
            failures.append("a new position's noise is not a new row of this round's, one per position")
        if not torch.equal(new[scored], gumbel_argmax(at_rows(p, rows.clamp_max(DEPTH)), noise)[scored]):
            failures.append("a scored slot's draft is not argmax(log p + G) with its own G")
    # the bonus row held no draft: its new token equals the last old draft only as often as p_L gives that token
    equal = int((new[bonus] == last[:, None].expand_as(new)[bonus]).sum())
    chance = p[:, DEPTH].gather(1, last[:, None]).expand_as(new)[bonus]
    if abs(equal - float(chance.sum())) > SIGMAS * float((chance * (1 - chance)).sum().sqrt()):
        failures.append(f"the bonus row's draft equals the last old draft {equal} times, expected "
                        f"{float(chance.sum()):.0f}: it was coupled")
    return failures


@pytest.mark.parametrize("fresh", FRESH_LAWS)
@pytest.mark.parametrize("refresh", REFRESHES)
def test_each_slot_takes_its_row(refresh, fresh):
    assert bookkeeping_failures(refresh, fresh) == []


def test_a_coupled_bonus_row_fails_the_bookkeeping(monkeypatch):
    plant(monkeypatch, "c-bonus-row-coupled")  # without it: test_each_slot_takes_its_row[coupled-point]
    failures = bookkeeping_failures("coupled", "point")
    assert any("it was coupled" in failure for failure in failures), failures


# --- 3. forced positions are drafted as their token and accepted -------------------------------------------------

FORCED_AT = KINDS.index(1)  # the image position whose token is forced
IMAGES = 100


def tiny_runs(bundle, draft: str) -> list:
    return decode_batch(bundle.target, None, [CLASS_ID] * IMAGES, Eagle(), parse_draft(draft), SAMPLING,
                        list(range(IMAGES)))


def forced_counts(bundle, draft: str) -> dict[str, int]:
    """Over every round of ``IMAGES`` images: the drafts at the forced position (by origin), those that are not the
    forced token, the tested ones and the rejected ones."""
    counts = dict.fromkeys(["drafted", "not forced", "tested", "rejected", *DRAFT_ORIGINS], 0)
    for run in tiny_runs(bundle, draft):
        for rnd in run.stats.rounds[1:]:  # the first record is the first token's
            slot = FORCED_AT - rnd.start  # drafted[j]: the token at position start + j
            if not 0 <= slot < len(rnd.drafted):
                continue
            counts["drafted"] += 1
            counts[rnd.sources[slot]] += 1
            counts["not forced"] += rnd.drafted[slot] != FORCED
            for candidate in rnd.tested:
                if candidate.node == slot + 1:
                    counts["tested"] += 1
                    counts["rejected"] += not candidate.accepted
    return counts


@pytest.mark.parametrize("draft", WINDOWS)
def test_forced_positions_are_drafted_as_their_token_and_accepted(tiny, draft):
    counts = forced_counts(tiny, draft)
    # every image's first window drafts it fresh, and every image tests it once (its draft is then committed)
    assert counts["fresh"] >= IMAGES and counts["tested"] == IMAGES, counts
    assert counts["not forced"] == 0 and counts["rejected"] == 0, counts


@pytest.mark.parametrize("fresh", FRESH_LAWS)
def test_unmasked_fresh_drafts_fail_the_forced_count(tiny, monkeypatch, fresh):
    plant(monkeypatch, "d-fresh-drafts-unmasked")  # without it: the test above
    counts = forced_counts(tiny, f"jacobi:3:coupled:{fresh}")
    assert counts["not forced"] > 0 and counts["rejected"] > 0, counts


# --- 4. origins against a recount -------------------------------------------------------------------------------

def origin_mismatches(bundle, draft: str) -> tuple[list[str], set[str]]:
    """Every round whose ``sources`` differ from the recount (:func:`recount_origins`, rows from the rounds'
    starts), and the origins seen."""
    tree = parse_draft(draft)
    mismatches, seen = [], set()
    for image, run in enumerate(tiny_runs(bundle, draft)):
        rounds = run.stats.rounds[1:]
        if rounds[0].sources != ["fresh"] * tree.depth:
            mismatches.append(f"image {image}: the first window is {rounds[0].sources}")
        for before, after in itertools.pairwise(rounds):
            assert after.start - before.start == len(before.emitted)
            rows = after.start - before.start + torch.arange(tree.depth)  # the previous forward's row per slot
            old = torch.tensor(before.drafted).gather(0, rows.clamp_max(tree.depth - 1))
            want = recount_origins(rows, torch.tensor(after.drafted), old, tree.depth, tree.refresh)
            if after.sources != [DRAFT_ORIGINS[code] for code in want.tolist()]:
                mismatches.append(f"image {image}, round at {after.start}: {after.sources}")
            seen |= set(after.sources)
    return mismatches, seen


@pytest.mark.parametrize("draft", WINDOWS)
def test_origins_equal_a_recount(tiny, draft):
    mismatches, seen = origin_mismatches(tiny, draft)
    assert mismatches == []
    coupled = parse_draft(draft).refresh != "independent"
    assert seen == ({"fresh", "refreshed", "kept"} if coupled else {"fresh", "refreshed"})


@pytest.mark.parametrize("draft", ["jacobi:3:coupled", "jacobi:3:gumbel", "jacobi:3"])
def test_swapped_origins_fail_the_recount(tiny, monkeypatch, draft):
    plant(monkeypatch, "e-origins-swapped")  # without it: test_origins_equal_a_recount
    mismatches, _ = origin_mismatches(tiny, draft)
    assert mismatches != []
