"""What a study says, computed from its results (``bench --summary FILE``): the noise floor, how far COOL-SD
relaxes before its quality is told apart from Eagle-1's, and the paired comparisons behind the paper's claims.
Every number is read from the study's JSON; nothing here measures anything."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.rules import rule_spec
from .series import FAMILY_NAMES

QUALITY = ("log_likelihood_per_token", "fid", "judge_accuracy")
# A relaxed method can move the target's log-likelihood of its tokens either way from Eagle-1's (down: less
# likely tokens; up: mode seeking); both depart from the target, so comparisons rank the distance, not the sign.
HIGHER_IS_BETTER = {"log_likelihood_gap": False, "fid": False, "judge_accuracy": True, "tau": True,
                    "speedup_vs_ar": True}
NAMES = {"log_likelihood_per_token": "log-likelihood / token", "fid": "FID", "judge_accuracy": "class consistency",
         "tau": "tau", "log_likelihood_gap": "log-likelihood gap to Eagle-1", "speedup_vs_ar": "speed-up over AR"}
COMPARED = {"log_likelihood_per_token": "log_likelihood_gap"}  # what a comparison of two configurations ranks
ASPECTS = {"residual": "G* against the heuristic residual (LANTERN++, a = the first residual listed)",
           "schedule": "exponential against linear decay (COOL-SD, a = the first schedule listed)",
           "annealing": "COOL-SD (annealed) against UniformRSD at the same delta",
           "refresh": "a coupled (maximal or Gumbel) refresh of a Jacobi window against an independent one, Eagle-1's "
                      "lossless test on both (SCD against SJD)",
           "lossless_source": "lossless drafting by the target (Eagle-1 on a Jacobi window: SJD, SCD and kin) against "
                              "the draft model (Eagle-1 on its draft), on the same images",
           "relaxed_source": "COOL-SD on coupled Jacobi drafts against the same setting on the draft model's drafts"}
ACROSS_DRAFTS = {"refresh", "lossless_source", "relaxed_source"}  # pairs whose b runs on another draft


def shown(difference: dict, digits: int = 4) -> str:
    return f"{difference['value']:+.{digits}f} [{difference['low']:+.{digits}f}, {difference['high']:+.{digits}f}]"


def resolved(difference: dict) -> bool:
    """The 95% interval excludes zero."""
    return difference["low"] > 0 or difference["high"] < 0


def better(difference: dict, measure: str) -> bool | None:
    """True (a resolved gain for a), False (a resolved loss) or None (not resolved)."""
    if not resolved(difference):
        return None
    return (difference["low"] > 0) == HIGHER_IS_BETTER[measure]


def measures(result: dict) -> list[str]:
    recorded = {key for run in result["runs"] for key in run.get("vs_eagle", {})}
    return [m for m in QUALITY if m in recorded]


def noise_floor(result: dict) -> list[str]:
    """AR minus Eagle-1 on the same images: two samplers of one distribution, so any resolved difference here
    would be a fault, and the interval's width is the smallest effect the study can see."""
    ar = next((run for run in result["runs"] if run["method"] == "ar" and "vs_eagle" in run), None)
    if ar is None:
        return ["No AR run compared with Eagle-1: no noise floor."]
    lines = [f"Noise floor: AR minus Eagle-1 ({ar['eagle_baseline']}) on the same {result['images']} images "
             "(value [95% interval]):", ""]
    lines += [f"* {NAMES[m]}: {shown(ar['vs_eagle'][m])}" + (" **resolved: a fault**" if resolved(ar['vs_eagle'][m])
                                                               else "") for m in measures(result)]
    return lines


def speedup_over_eagle(result: dict, run: dict) -> float:
    """Median Eagle-1 latency / median latency: both speed-ups share AR's median, so their ratio is exactly it."""
    eagle = next(r for r in result["runs"] if r["label"] == run["eagle_baseline"] and r["draft"] == run["draft"])
    return run["speedup_vs_ar"] / eagle["speedup_vs_ar"]


def cool_relaxation(result: dict) -> list[str]:
    """Per draft and COOL-SD family (nu, schedule): the smallest delta with a resolved quality difference; and
    over all, the COOL-SD setting of highest tau whose every quality difference is unresolved."""
    cool = [run for run in result["runs"] if run["method"] == "cool" and "vs_eagle" in run]
    quality = measures(result)
    lines = ["COOL-SD against Eagle-1, smallest delta whose quality difference is resolved:", ""]
    families: dict[tuple, list[dict]] = {}
    for run in cool:
        params = {**rule_spec("cool").defaults(), **run["params"]}  # a Jacobi window's runs name delta only
        key = (run["draft"], params["nu"], params["schedule"])
        families.setdefault(key, []).append(run)
    for (draft, nu, schedule), runs in sorted(families.items(), key=lambda item: str(item[0])):
        first = next((run for run in sorted(runs, key=lambda r: r["params"]["delta"])
                      if any(resolved(run["vs_eagle"][m]) for m in quality)), None)
        where = ", ".join(f"{NAMES[m]} {shown(first['vs_eagle'][m])}" for m in quality
                          if resolved(first["vs_eagle"][m])) if first else ""
        lines.append(f"* {draft}, nu={nu}, {schedule}: " + (f"delta={first['params']['delta']} ({where})" if first
                                                             else "none up to the largest delta"))
    best = indistinguishable_cool(result)
    lines.append("")
    if best is not None:
        lines.append("Best COOL-SD setting indistinguishable from Eagle-1 on every quality measure: "
                     f"{best['label']} on "
                     f"{best['draft']}, tau {best['tau']:.3f} (minus Eagle-1's: {shown(best['vs_eagle']['tau'])}), "
                     f"{speedup_over_eagle(result, best):.2f}x Eagle-1's speed")
    else:
        lines.append("No COOL-SD setting is indistinguishable from Eagle-1 on every quality measure.")
    return lines


def indistinguishable_cool(result: dict) -> dict | None:
    """The COOL-SD run of highest tau whose every recorded quality difference from Eagle-1 is unresolved."""
    same = [run for run in result["runs"] if run["method"] == "cool" and "vs_eagle" in run
            and not any(resolved(run["vs_eagle"][m]) for m in measures(result) if m in run["vs_eagle"])]
    return max(same, key=lambda run: run["tau"]) if same else None


def comparisons(result: dict) -> list[str]:
    """Each pair behind a claim, and per claim and measure how many pairs favour a, favour b, or are not
    resolved."""
    lines = []
    for aspect, title in ASPECTS.items():
        pairs = [c for c in result.get("comparisons", []) if c["differs_in"] == aspect]
        if not pairs:
            continue
        across = aspect in ACROSS_DRAFTS  # the speed differs with the draft too
        quality = ["tau"] + ["speedup_vs_ar"] * across + [COMPARED.get(m, m) for m in measures(result)]
        lines += [f"**{title}** (a minus b, value [95% interval]):", "",
                  "| a | b | draft | " + " | ".join(NAMES[m] for m in quality) + " |",
                  "|---" * (3 + len(quality)) + "|"]
        lines += [f"| {c['a']} | {c['b']} | {c['draft']}{' / ' + c['b_draft'] if across else ''} | "
                  + " | ".join(shown(c["a_minus_b"][m]) for m in quality) + " |" for c in pairs]
        counts = []
        for m in quality:
            verdicts = [better(c["a_minus_b"][m], m) for c in pairs]
            counts.append(f"{NAMES[m]}: a better in {verdicts.count(True)}, b better in {verdicts.count(False)}, "
                          f"unresolved in {verdicts.count(None)}")
        lines += ["", f"Of {len(pairs)} pairs: " + "; ".join(counts) + ".", ""]
    return lines


DOMINANCE_PAIRS = (("cool", "lantern"), ("lantern", "cool"), ("cool", "uniform"), ("uniform", "cool"))


def score(difference: float, measure: str) -> float:
    """Higher is better: minus the distance from Eagle-1 for a measure ranked by distance (COMPARED), else the
    signed difference."""
    if measure in COMPARED:
        return -abs(difference)
    return difference if HIGHER_IS_BETTER[measure] else -difference


def dominance(result: dict, measure: str = "log_likelihood_per_token") -> list[str]:
    """Per draft and ordered pair of families (a, b): the b points that some a point matches or beats on both
    tau and ``measure`` (point estimates of the differences from Eagle-1; for the log-likelihood, the distance
    either way). "a dominates b" needs every b point beaten by a and no a point beaten by b, so both directions
    are counted."""
    lines, name = [], NAMES[COMPARED.get(measure, measure)]
    for draft in result.get("drafts", []):
        runs = [r for r in result["runs"] if r["draft"] == draft and measure in r.get("vs_eagle", {})]
        value = {r["label"]: score(r["vs_eagle"][measure]["value"], measure) for r in runs}
        for a, b in DOMINANCE_PAIRS:
            winners, others = ([r for r in runs if r["method"] == family] for family in (a, b))
            if winners and others:
                lines.append(f"* {draft}: {beaten(winners, others, value)} of {len(others)} {FAMILY_NAMES[b]} points are matched or "
                             f"beaten on both tau and {name} by a {FAMILY_NAMES[a]} point")
    return [f"Dominance on tau and {name} (point estimates):", ""] + lines if lines else []


def against_ar(result: dict) -> list[str]:
    """The drafter-free runs against AR on the same images (their own reference: no draft model), with tau and
    the speed-up over AR."""
    runs = [r for r in result["runs"] if "vs_ar" in r]
    if not runs:
        return []
    quality = [m for m in QUALITY if any(m in r["vs_ar"] for r in runs)]
    lines = ["Drafter-free methods minus AR on the same images (value [95% interval]; bold: resolved):", "",
             "| configuration | draft | tau | speed-up over AR | " + " | ".join(NAMES[m] for m in quality) + " |",
             "|---" * (4 + len(quality)) + "|"]
    lines += [f"| {r['label'].split(' @ ')[0]} | {r['draft']} | {r['tau']:.3f} | {r['speedup_vs_ar']:.2f}x | "
              + " | ".join(difference_cell(r["vs_ar"][m], 4) for m in quality if m in r["vs_ar"]) + " |"
              for r in runs]
    return lines + [""]


def gsd_against_cool(result: dict) -> list[str]:
    """GSD (either residual) against COOL-SD on coupled Jacobi drafts of the same window length, at equal tau:
    the points of each that a point of the other matches or beats on both tau and the log-likelihood's distance
    from AR's (point estimates; both families are relaxed, so the distance either way is a departure)."""
    runs = [r for r in result["runs"] if "vs_ar" in r and "log_likelihood_per_token" in r["vs_ar"]]
    distance = {r["label"]: -abs(r["vs_ar"]["log_likelihood_per_token"]["value"]) for r in runs}
    lines = []
    for length in sorted({r["draft"].split(":")[1] for r in runs}, key=int):
        gsd = [r for r in runs if r["method"] == "gsd" and r["draft"].split(":")[1] == length]
        cool = [r for r in runs if r["method"] == "cool" and r["draft"].split(":")[1] == length]
        if not gsd or not cool:
            continue
        for winners, others, a, b in ((cool, gsd, "cool", "gsd"), (gsd, cool, "gsd", "cool")):
            lines.append(f"* jacobi:{length}: {beaten(winners, others, distance)} of {len(others)} {FAMILY_NAMES[b]} "
                         "points are matched or beaten on both tau and the log-likelihood's distance from AR by a "
                         f"{FAMILY_NAMES[a]} point")
    return ["GSD against COOL-SD at equal tau (point estimates):", ""] + lines if lines else []


# The rows of the key tables (docs/results.md): a method and the parameters a run must have; every other run
# is in the CSV and the figures.
KEY_ROWS = (("ar", {}), ("eagle", {}), ("cool", {"nu": 0.7, "schedule": "exp"}),
            ("cool", {"nu": 0.3, "schedule": "exp"}), ("uniform", {}), ("lantern", {"k": 5, "lambda": 2}),
            ("lantern", {"k": 10, "lambda": 5}))


def key_runs(result: dict, draft: str) -> list[dict]:
    """The KEY_ROWS runs on ``draft`` in that order (AR when its differences are from this draft's Eagle-1)."""
    eagle = next((r["label"] for r in result["runs"] if r["method"] == "eagle" and r["draft"] == draft), None)
    runs = [r for r in result["runs"] if r.get("eagle_baseline") == eagle and (r["draft"] == draft or
                                                                               r["method"] == "ar")]
    return [r for method, wanted in KEY_ROWS for r in runs
            if r["method"] == method and all(r["params"].get(k) == v for k, v in wanted.items())]


def difference_cell(difference: dict, digits: int) -> str:
    """:func:`shown`, in bold when the interval excludes zero."""
    return f"**{shown(difference, digits)}**" if resolved(difference) else shown(difference, digits)


def key_table(result: dict, draft: str) -> list[str]:
    """One draft's key configurations: tau, speed-up over AR, each quality measure minus Eagle-1's on the same
    images with its paired 95% interval (bold: resolved), and the relaxation cost."""
    runs = key_runs(result, draft)
    eagle = next((r for r in runs if r["method"] == "eagle"), None)
    if eagle is None:
        return []
    quality, digits = measures(result), {"log_likelihood_per_token": 3, "fid": 2, "judge_accuracy": 3}
    itself = ", ".join(f"{NAMES[m]} {eagle[m]:.{digits[m]}f}" for m in quality if m in eagle)
    lines = [f"{draft}: Eagle-1 itself has tau {eagle['tau']:.3f}, {itself}.", "",
             "| configuration | tau | speed-up over AR | " + " | ".join(f"{NAMES[m]} minus Eagle-1's" for m in quality)
             + " | relaxation cost |", "|---" * (4 + len(quality)) + "|"]
    for run in runs:
        cells = ["" if run is eagle else difference_cell(run["vs_eagle"][m], digits[m]) for m in quality]
        lines.append(f"| {run['label'].split(' @ ')[0]} | {run['tau']:.3f} | {run['speedup_vs_ar']:.2f}x | "
                     + " | ".join(cells) + f" | {run['relaxation_cost_mean']:.2f} |")
    return lines + [""]


def key_tables(result: dict) -> list[str]:
    """:func:`key_table` per draft model's draft (a Jacobi window's runs are in :func:`against_ar`'s table)."""
    tables = [line for draft in result.get("drafts", []) if not draft.startswith("jacobi")
              for line in key_table(result, draft)]
    return ["Key configurations (value [95% interval]; bold: the interval excludes 0):", ""] + tables if tables else []


# The claims the study restates (README, docs/results.md, the tour) -----------------------------------------------
@dataclass(frozen=True)
class Claim:
    """A claim the study tests, and where it comes from: either a paired comparison (``aspect``: its pairs, a
    minus b) saying the ``favoured`` side is better on the ``judged`` measures ("quality": each recorded one),
    or ``families`` (a, b): a's points match or beat b's on tau and quality (point estimates, :func:`beaten`)."""

    name: str
    source: str
    aspect: str | None = None
    favoured: str = "a"
    judged: tuple[str, ...] = ()
    families: tuple[str, str] | None = None


CLAIMS = (
    Claim("COOL-SD's annealing beats UniformRSD at the same delta", "COOL-SD paper", "annealing", "a",
          ("tau", "quality")),
    Claim("G* improves LANTERN++'s quality", "COOL-SD paper", "residual", "b", ("quality",)),
    Claim("exponential decay beats linear", "COOL-SD paper", "schedule", "a", ("tau", "quality")),
    Claim("COOL-SD dominates LANTERN++ on tau and quality", "COOL-SD paper", families=("cool", "lantern")),
    Claim("a lossless drafter-free method (SJD, SCD) is faster than Eagle-1, at equal quality",
          "SJD and SCD papers, each against its own AR", "lossless_source", "a", ("speedup_vs_ar",)),
    Claim("a coupled refresh accepts more than an independent one (SCD over SJD)", "SCD paper", "refresh", "a",
          ("tau",)),
    Claim("COOL-SD is faster on the target's own (coupled Jacobi) drafts than on the draft model's",
          "new in this study", "relaxed_source", "a", ("speedup_vs_ar",)),
    Claim("COOL-SD on coupled Jacobi drafts matches or beats GSD at equal tau", "new in this study",
          families=("cool", "gsd")),
)
DOMINATES = 2 / 3  # a dominates b when it matches or beats this share of b's points and b at most 1 - it of a's
# A measure decides a paired claim when at least this share of the pairs resolves it one way: at 95% intervals
# about 5% of pairs resolve either way by chance, so a few stray ones decide nothing (the counts still show them).
DECIDES = 0.25


def measure_verdict(favoured: int, against: int, pairs: int) -> str:
    """One measure's verdict on a paired claim: "holds" or "reverses" when only that side is resolved in at least
    DECIDES of the pairs, "mixed" when both are, else "not resolved"."""
    sides = favoured >= DECIDES * pairs, against >= DECIDES * pairs
    return {(True, False): "holds", (False, True): "reverses", (True, True): "mixed"}.get(sides, "not resolved")


def verdict(verdicts: list[str]) -> str:
    """A claim's verdict from its measures' (or panels'): those that decide must agree, else "mixed"."""
    decided = set(verdicts) - {"not resolved"}
    return decided.pop() if len(decided) == 1 else "mixed" if decided else "not resolved"


def paired_claim(result: dict, claim: Claim) -> tuple[str, str] | None:
    """(what the pairs show, verdict) of a paired claim: per judged measure, how many pairs resolve it for the
    claim and against it; None when the study has none of its pairs."""
    pairs = [c["a_minus_b"] for c in result.get("comparisons", []) if c["differs_in"] == claim.aspect]
    if not pairs:
        return None
    judged = [m for j in claim.judged for m in ([COMPARED.get(q, q) for q in measures(result)] if j == "quality"
                                                else [j])]
    cells, verdicts = [], []
    for m in judged:
        outcomes = [better(pair[m], m) for pair in pairs if m in pair]
        if not outcomes:
            continue
        favoured, against = outcomes.count(claim.favoured == "a"), outcomes.count(claim.favoured != "a")
        verdicts.append(measure_verdict(favoured, against, len(outcomes)))
        cells.append(f"{NAMES[m]}: {favoured} for, {against} against ({verdicts[-1]})")
    return f"{len(pairs)} pairs; " + "; ".join(cells), verdict(verdicts)


def beaten(winners: list[dict], others: list[dict], value: dict[str, float]) -> int:
    """How many of ``others`` some winner matches or beats on both tau and ``value`` (higher is better)."""
    return sum(any(w["tau"] >= r["tau"] and value[w["label"]] >= value[r["label"]] for w in winners) for r in others)


def dominance_claim(result: dict, claim: Claim) -> tuple[str, str] | None:
    """(what the points show, verdict) of a dominance claim, per panel (each draft model's draft; Jacobi windows by
    length, against AR) and quality measure: a dominates where it matches or beats DOMINATES of b's points and b at
    most 1 - DOMINATES of a's, the reverse where b does; point estimates, so within the study's noise."""
    a, b = claim.families
    cells, verdicts = [], []
    runs = [r for r in result["runs"] if r["method"] in (a, b)]
    for reference in ("vs_eagle", "vs_ar"):
        chosen = [r for r in runs if (reference == "vs_ar") == ("vs_ar" in r)]
        panels = sorted({r["draft"] if reference == "vs_eagle" else ":".join(r["draft"].split(":")[:2])
                         for r in chosen})
        for where in panels:
            here = [r for r in chosen if r["draft"] == where or r["draft"].startswith(where + ":")]
            for m in measures(result):
                scored = [r for r in here if m in r.get(reference, {})]
                value = {r["label"]: score(r[reference][m]["value"], m) for r in scored}
                first, second = ([r for r in scored if r["method"] == f] for f in (a, b))
                if not first or not second:
                    continue
                of_b, of_a = beaten(first, second, value), beaten(second, first, value)
                favoured = of_b >= DOMINATES * len(second) and of_a <= (1 - DOMINATES) * len(first)
                against = of_a >= DOMINATES * len(first) and of_b <= (1 - DOMINATES) * len(second)
                verdicts.append("holds" if favoured else "reverses" if against else "mixed")
                name = NAMES[COMPARED.get(m, m)].replace("Eagle-1", "AR" if reference == "vs_ar" else "Eagle-1")
                cells.append(f"{where}, {name}: {of_b} of {len(second)} {FAMILY_NAMES[b]} "
                             f"points beaten, {of_a} of {len(first)} {FAMILY_NAMES[a]} ({verdicts[-1]})")
    if not cells:
        return None
    return "; ".join(cells), verdict(verdicts)


def claim_rows(result: dict) -> list[tuple[Claim, str, str]]:
    """(claim, what the study shows, verdict) for every claim of CLAIMS the study has the runs for."""
    rows = []
    for claim in CLAIMS:
        shown_verdict = dominance_claim(result, claim) if claim.families else paired_claim(result, claim)
        if shown_verdict is not None:
            rows.append((claim, *shown_verdict))
    return rows


def claims_table(result: dict) -> list[str]:
    """The claims and their verdicts as a Markdown table: "holds" (resolved for it, never against), "reverses",
    "mixed" (both) or "not resolved"."""
    rows = claim_rows(result)
    if not rows:
        return []
    return (["The claims, restated (pairs: resolved 95% intervals for and against; points: point estimates):", "",
             "| claim | from | what the study shows | verdict |", "|---|---|---|---|"]
            + [f"| {claim.name} | {claim.source} | {shows} | **{said}** |" for claim, shows, said in rows] + [""])


def summary(result: dict) -> str:
    """The study's summary in Markdown."""
    parts = [claims_table(result), noise_floor(result), cool_relaxation(result), comparisons(result),
             *(dominance(result, m) for m in measures(result) if m != "judge_accuracy"),
             *(part for part in (against_ar(result), gsd_against_cool(result)) if part), key_tables(result)]
    return "\n".join(line for part in parts for line in part + [""])
